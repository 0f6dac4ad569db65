-- rate_limiter_proxy 0.7.0 -> 0.8.0 (issue 64): define() refuses to spread a limit (shards >
-- 1 over the partitions) that has overrides or tiers, which the router made whole on the
-- partitions: each partition would then give a key its override's or tier's whole numbers,
-- and the key would get them once per partition. Runs as a superuser: every object and
-- operator is qualified.

\echo Use "ALTER EXTENSION rate_limiter_proxy UPDATE TO '0.8.0'" to load this file. \quit

-- How many overrides and tiers of the limit each partition has.
CREATE FUNCTION rate_limiter_proxy._plans_everywhere(limit_name text)
RETURNS SETOF bigint LANGUAGE plproxy SET search_path = pg_catalog, pg_temp AS $$
    CLUSTER rate_limiter_proxy._gate('define');
    RUN ON ALL;
    SELECT (SELECT pg_catalog.count(*) FROM rate_limiter.overrides o WHERE o.name OPERATOR(pg_catalog.=) limit_name)
         OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM rate_limiter.tiers t WHERE t.name OPERATOR(pg_catalog.=) limit_name);
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._plans_everywhere(text) FROM PUBLIC;
-- define() calls it with its caller's rights: each role that may run define()'s hop to the
-- partitions may run it too.
DO $$
DECLARE
    grantee pg_catalog.regrole;
BEGIN
    FOR grantee IN SELECT a.grantee::pg_catalog.regrole
        FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
        WHERE p.oid OPERATOR(pg_catalog.=) 'rate_limiter_proxy._define_everywhere(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, text, boolean)'::pg_catalog.regprocedure
          AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
          AND a.grantee OPERATOR(pg_catalog.<>) p.proowner AND a.grantee OPERATOR(pg_catalog.<>) 0::pg_catalog.oid
    LOOP
        -- A regrole's text is the role's name quoted as an identifier already: %s, not %I.
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION rate_limiter_proxy._plans_everywhere(text) TO %s', grantee);
    END LOOP;
END $$;

-- The same signature: replaced in place, with the grants an administrator gave.
CREATE OR REPLACE FUNCTION rate_limiter_proxy.define(
    name text,
    kind text,
    rate double precision,
    period interval,
    capacity double precision DEFAULT NULL,
    max_reserved double precision DEFAULT NULL,
    shards integer DEFAULT 1,
    start timestamptz DEFAULT NULL,
    min_gap interval DEFAULT NULL,
    mode text DEFAULT 'all',
    buckets integer DEFAULT NULL,
    lock_timeout interval DEFAULT NULL,
    on_lock_timeout text DEFAULT 'deny',
    deny_cache interval DEFAULT NULL,
    hot boolean DEFAULT false,
    enforce boolean DEFAULT true,
    tz text DEFAULT NULL,
    durable boolean DEFAULT true
) RETURNS void
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $define$
DECLARE
    partitions integer;
    spread integer := 1;
    code pg_catalog.text; msg pg_catalog.text; det pg_catalog.text; hnt pg_catalog.text;
BEGIN
    -- INSERT and UPDATE on rate_limiter_proxy.limits (see _gate), before any partition is
    -- touched: the router's own write below comes after the partitions'.
    PERFORM rate_limiter_proxy._gate('define');
    -- A hot limit's escrow is one database's: through the router, define it on the
    -- partitions themselves.
    IF hot THEN
        RAISE EXCEPTION 'not supported: a hot limit through the router'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Define it with rate_limiter.define(..., hot => true) on each partition, or shard it.';
    END IF;
    partitions := rate_limiter_proxy.partitions();
    -- A concurrency limit's slots are one set per key: never spread. Each partition gets the
    -- whole limit, and refuses shards > 1 as the extension does (0A000).
    IF coalesce(shards, 1) OPERATOR(pg_catalog.>) 1 AND kind IS DISTINCT FROM 'concurrency' THEN
        spread := partitions;
    END IF;
    -- A limit spread now that was not: its overrides and tiers, made whole on its partitions
    -- (the router refuses them for a spread limit), would each give a key its whole numbers on
    -- every partition, so the whole numbers times the partitions.
    IF spread OPERATOR(pg_catalog.>) 1 AND NOT EXISTS (
           SELECT FROM rate_limiter_proxy.limits l
           WHERE l.name OPERATOR(pg_catalog.=) define.name AND l.shards OPERATOR(pg_catalog.>) 1
             AND l.kind OPERATOR(pg_catalog.<>) 'concurrency')
       AND (SELECT pg_catalog.sum(n) FROM rate_limiter_proxy._plans_everywhere(name) n) OPERATOR(pg_catalog.>) 0 THEN
        RAISE EXCEPTION 'not supported: spreading the limit "%" over the partitions through the router while it has overrides or tiers', name
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = 'Each partition would hold a share of the limit, and each of its overrides and tiers whole: a key would get their numbers once on every partition.',
                  HINT = 'Remove its overrides and tiers (rate_limiter_proxy.remove_override, remove_tier) first, or keep the limit at shards = 1.';
    END IF;
    -- Every partition at once, each in a transaction of its own: after an error some may
    -- have the new definition; define again.
    PERFORM rate_limiter_proxy._define_everywhere(name, kind,
        rate OPERATOR(pg_catalog./) spread::double precision, period,
        capacity OPERATOR(pg_catalog./) spread::double precision,
        max_reserved OPERATOR(pg_catalog./) spread::double precision,
        rate_limiter_proxy._shards_per_partition(shards, spread), start, min_gap, mode,
        buckets, lock_timeout, on_lock_timeout, deny_cache, coalesce(enforce, true), tz, coalesce(durable, true));
    INSERT INTO rate_limiter_proxy.limits AS l (name, kind, rate, period, capacity, max_reserved, shards, start, min_gap,
            mode, buckets, lock_timeout, on_lock_timeout, deny_cache, partitions, enforce, tz, durable)
        VALUES (name, kind, rate, period, capacity, max_reserved, coalesce(shards, 1), start, min_gap,
            coalesce(mode, 'all'), buckets, lock_timeout, coalesce(on_lock_timeout, 'deny'), deny_cache, partitions,
            coalesce(enforce, true), tz, coalesce(durable, true))
        ON CONFLICT ON CONSTRAINT limits_pkey DO UPDATE SET
            kind = EXCLUDED.kind, rate = EXCLUDED.rate, period = EXCLUDED.period, capacity = EXCLUDED.capacity,
            max_reserved = EXCLUDED.max_reserved, shards = EXCLUDED.shards, start = EXCLUDED.start,
            min_gap = EXCLUDED.min_gap, mode = EXCLUDED.mode, buckets = EXCLUDED.buckets,
            lock_timeout = EXCLUDED.lock_timeout, on_lock_timeout = EXCLUDED.on_lock_timeout,
            deny_cache = EXCLUDED.deny_cache, partitions = EXCLUDED.partitions, enforce = EXCLUDED.enforce, tz = EXCLUDED.tz,
            durable = EXCLUDED.durable,
            defined_at = pg_catalog.now();
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    PERFORM rate_limiter_proxy._raise_again(code, msg, det, hnt, NULL);
    RAISE;
END
$define$;

-- Issue 66: rate_limit's ok alone, routed as rate_limit is (its errors too), for a WHERE
-- clause or a target list. It calls rate_limit with its caller's rights: a role needs EXECUTE
-- on both.
CREATE FUNCTION rate_limiter_proxy.rate_limit_ok(
    name text,
    key text DEFAULT NULL,
    count double precision DEFAULT 1,
    reserve boolean DEFAULT false,
    throws boolean DEFAULT false,
    config jsonb DEFAULT NULL
) RETURNS boolean
LANGUAGE sql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
    SELECT (rate_limiter_proxy.rate_limit(name, key, count, reserve, throws, config)).ok
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.rate_limit_ok(text, text, double precision, boolean, boolean, jsonb) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.rate_limit_ok(text, text, double precision, boolean, boolean, jsonb) IS
    'rate_limit(...).ok on the partition that owns the key.';

-- Default privileges (ALTER DEFAULT PRIVILEGES) never reach an object this install or update
-- created: it keeps only the grants the scripts give, so that a role given EXECUTE on every
-- new function or SELECT on every new table gets neither define() nor a table (issue 41).
-- What PostgreSQL grants without any default privileges (PUBLIC's USAGE of a type) stays.
-- Created here means its membership of the extension (or, for the schema CREATE EXTENSION
-- makes, the schema) was recorded by this transaction (age 0, or below for a subtransaction);
-- an object replaced in place keeps its membership row, and with it every grant an
-- administrator made.
DO $pin$
DECLARE
    leaked record;
BEGIN
    FOR leaked IN
        WITH created AS (
            SELECT d.classid, d.objid
            FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_extension e ON e.oid OPERATOR(pg_catalog.=) d.refobjid
            WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
              AND d.deptype OPERATOR(pg_catalog.=) 'e' AND e.extname OPERATOR(pg_catalog.=) 'rate_limiter_proxy'
              AND pg_catalog.age(d.xmin) OPERATOR(pg_catalog.<=) 0),
        objects (what, owner, namespace, kind, acl) AS (
            SELECT 'ROUTINE ' OPERATOR(pg_catalog.||) p.oid::pg_catalog.regprocedure::pg_catalog.text,
                   p.proowner, p.pronamespace, 'f'::"char", p.proacl
            FROM created c JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) c.objid
            WHERE c.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
            UNION ALL
            SELECT CASE r.relkind WHEN 'S' THEN 'SEQUENCE ' ELSE 'TABLE ' END
                       OPERATOR(pg_catalog.||) r.oid::pg_catalog.regclass::pg_catalog.text,
                   r.relowner, r.relnamespace, CASE r.relkind WHEN 'S' THEN 'S' ELSE 'r' END::"char", r.relacl
            FROM created c JOIN pg_catalog.pg_class r ON r.oid OPERATOR(pg_catalog.=) c.objid
            WHERE c.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
            UNION ALL
            SELECT 'TYPE ' OPERATOR(pg_catalog.||) t.oid::pg_catalog.regtype::pg_catalog.text,
                   t.typowner, t.typnamespace, 'T'::"char", t.typacl
            FROM created c JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) c.objid
            WHERE c.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_type'::pg_catalog.regclass
            UNION ALL
            SELECT 'SCHEMA ' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(n.nspname), n.nspowner, 0::pg_catalog.oid,
                   'n'::"char", n.nspacl
            FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_extension e ON e.extnamespace OPERATOR(pg_catalog.=) n.oid
            WHERE e.extname OPERATOR(pg_catalog.=) 'rate_limiter_proxy' AND pg_catalog.age(n.xmin) OPERATOR(pg_catalog.<=) 0)
        SELECT o.what, a.privilege_type,
               CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                    ELSE a.grantee::pg_catalog.regrole::pg_catalog.text END AS grantee
        FROM objects o, pg_catalog.aclexplode(o.acl) a
        WHERE a.grantee OPERATOR(pg_catalog.<>) o.owner
          AND NOT EXISTS (SELECT FROM pg_catalog.aclexplode(pg_catalog.acldefault(
                              CASE o.kind WHEN 'S' THEN 's' ELSE o.kind END, o.owner)) b
                          WHERE b.grantee OPERATOR(pg_catalog.=) a.grantee
                            AND b.privilege_type OPERATOR(pg_catalog.=) a.privilege_type)
          AND EXISTS (SELECT FROM pg_catalog.pg_default_acl d, pg_catalog.aclexplode(d.defaclacl) g
                      WHERE d.defaclrole OPERATOR(pg_catalog.=) o.owner
                        AND d.defaclnamespace OPERATOR(pg_catalog.=) ANY (ARRAY[0::pg_catalog.oid, o.namespace])
                        AND d.defaclobjtype OPERATOR(pg_catalog.=) o.kind
                        AND g.grantee OPERATOR(pg_catalog.=) a.grantee
                        AND g.privilege_type OPERATOR(pg_catalog.=) a.privilege_type)
    LOOP
        EXECUTE pg_catalog.format('REVOKE %s ON %s FROM %s CASCADE', leaked.privilege_type, leaked.what, leaked.grantee);
    END LOOP;
END
$pin$;
