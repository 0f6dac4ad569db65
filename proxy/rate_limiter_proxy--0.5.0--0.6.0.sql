-- rate_limiter_proxy 0.5.0 -> 0.6.0: a concurrency limit is never spread over the
-- partitions. Its slots are one set per key, on the key's partition, where release() and
-- renew() go: define() gives each partition the whole limit (whose rate_limiter refuses
-- shards > 1 with 0A000), and a call on a concurrency limit or inline concurrency config goes
-- to the key's partition with the config as given, which refuses what the extension refuses
-- (shards, modes, reservations) before a lease is taken. 0.5.0 sent an inline concurrency
-- config with "shards" to a random partition as a spread limit, where its leases outlived
-- every release() (issue 41). Functions replaced in place keep their grants; what an install
-- or update creates keeps only its scripts' grants, whatever the default privileges (0.5.0
-- created define() again, and the lease calls, under them). Runs as a
-- superuser: every object and operator is qualified.

\echo Use "ALTER EXTENSION rate_limiter_proxy UPDATE TO '0.6.0'" to load this file. \quit

CREATE OR REPLACE FUNCTION rate_limiter_proxy._route(name text, key text, config jsonb)
RETURNS rate_limiter_proxy.route_target LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    shards integer := 1;
    target rate_limiter_proxy.route_target;
BEGIN
    target.share := config;
    -- A concurrency limit goes to the key's partition, where release() and renew() go, with
    -- its config as given: that partition refuses what the extension refuses (shards, modes,
    -- reservations) before any slot is taken.
    IF coalesce(config OPERATOR(pg_catalog.->>) 'kind',
                (SELECT l.kind FROM rate_limiter_proxy.limits l WHERE l.name OPERATOR(pg_catalog.=) _route.name))
       OPERATOR(pg_catalog.=) 'concurrency' THEN
        target.hash := pg_catalog.hashtext(coalesce(key, name));
        target.spread := 1;
        RETURN target;
    END IF;
    IF config IS NULL THEN
        SELECT l.shards, l.partitions INTO shards, target.spread
          FROM rate_limiter_proxy.limits l WHERE l.name OPERATOR(pg_catalog.=) _route.name;
        IF shards OPERATOR(pg_catalog.>) 1 AND target.spread OPERATOR(pg_catalog.<>) rate_limiter_proxy.partitions() THEN
            -- The partitions hold shares of 1/spread: routed over another count they would
            -- not add up to the limit (copies of a partition would admit twice).
            RAISE EXCEPTION 'spread limit "%" is shared over % partitions, and the PL/Proxy cluster "rate_limiter" has %',
                    name, target.spread, rate_limiter_proxy.partitions()
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'Each partition holds its share of the limit as define() gave it out over the partitions of that time.',
                      HINT = 'After changing the partitions of SERVER rate_limiter, run SELECT rate_limiter_proxy.redefine_all(); to share every limit out again.';
        END IF;
    ELSIF (config OPERATOR(pg_catalog.->>) 'shards') OPERATOR(pg_catalog.~) '^[0-9]{1,4}$' THEN
        -- Anything else is left for the partition to refuse in its own words.
        shards := (config OPERATOR(pg_catalog.->>) 'shards')::integer;
    END IF;
    IF coalesce(shards, 1) OPERATOR(pg_catalog.<=) 1 THEN
        target.hash := pg_catalog.hashtext(coalesce(key, name));
        target.spread := 1;
        RETURN target;
    END IF;
    target.hash := (pg_catalog.random() OPERATOR(pg_catalog.*) 2147483647::double precision)::integer;
    IF config IS NOT NULL THEN
        target.spread := rate_limiter_proxy.partitions();
        target.share := rate_limiter_proxy._share(config, shards, target.spread);
    END IF;
    RETURN target;
END
$$;

-- Memory limits (durable => false) through the router: define() and its hop take durable,
-- and a limit keeps it. A call goes where a limit of its shape goes (a memory limit has
-- shards = 1: the key's partition), where rate_limiter counts it.
ALTER TABLE rate_limiter_proxy.limits ADD COLUMN durable boolean NOT NULL DEFAULT true;
COMMENT ON COLUMN rate_limiter_proxy.limits.durable IS 'false: a memory limit on each partition (see rate_limiter''s docs/memory-limits.md).';

-- A function's arguments cannot change in place: create define() and its hop again, and give
-- back the EXECUTE grants they had.
DO $$
DECLARE
    grantee pg_catalog.regrole;
    define_grantees pg_catalog.regrole[] := (SELECT pg_catalog.array_agg(a.grantee::pg_catalog.regrole)
        FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
        WHERE p.oid OPERATOR(pg_catalog.=) 'rate_limiter_proxy.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, boolean, text)'::pg_catalog.regprocedure
          AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
          AND a.grantee OPERATOR(pg_catalog.<>) p.proowner AND a.grantee OPERATOR(pg_catalog.<>) 0::pg_catalog.oid);
    hop_grantees pg_catalog.regrole[] := (SELECT pg_catalog.array_agg(a.grantee::pg_catalog.regrole)
        FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
        WHERE p.oid OPERATOR(pg_catalog.=) 'rate_limiter_proxy._define_everywhere(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, text)'::pg_catalog.regprocedure
          AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
          AND a.grantee OPERATOR(pg_catalog.<>) p.proowner AND a.grantee OPERATOR(pg_catalog.<>) 0::pg_catalog.oid);
BEGIN
    DROP FUNCTION rate_limiter_proxy.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, boolean, text);
    DROP FUNCTION rate_limiter_proxy._define_everywhere(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, text);
    CREATE FUNCTION rate_limiter_proxy._define_everywhere(name text, kind text, rate double precision, period interval,
        capacity double precision, max_reserved double precision, shards integer, start timestamptz, min_gap interval,
        mode text, buckets integer, lock_timeout interval, on_lock_timeout text, deny_cache interval, enforce boolean,
        tz text, durable boolean)
    RETURNS SETOF integer LANGUAGE plproxy SET search_path = pg_catalog, pg_temp AS $body$
        CLUSTER rate_limiter_proxy._gate('define');
        RUN ON ALL;
        -- By position: PL/Proxy reads every argument's name in the query as the argument.
        -- A hot limit is never defined through the router: hot is false.
        SELECT 1 FROM rate_limiter.define(name, kind, rate, period, capacity, max_reserved, shards, start, min_gap,
                                          mode, buckets, lock_timeout, on_lock_timeout, deny_cache, false, enforce, tz,
                                          durable);
    $body$;
    REVOKE ALL ON FUNCTION rate_limiter_proxy._define_everywhere(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, text, boolean) FROM PUBLIC;
    CREATE FUNCTION rate_limiter_proxy.define(
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
    REVOKE ALL ON FUNCTION rate_limiter_proxy.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, boolean, text, boolean) FROM PUBLIC;
    COMMENT ON FUNCTION rate_limiter_proxy.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, boolean, text, boolean) IS
        'rate_limiter.define on every partition (a spread limit, shards > 1, with each partition''s share), recorded in rate_limiter_proxy.limits. Needs INSERT and UPDATE on rate_limiter_proxy.limits.';
    -- A regrole's text is the role's name quoted as an identifier already: %s, not %I.
    FOREACH grantee IN ARRAY coalesce(hop_grantees, '{}') LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION rate_limiter_proxy._define_everywhere(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, text, boolean) TO %s', grantee);
    END LOOP;
    FOREACH grantee IN ARRAY coalesce(define_grantees, '{}') LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION rate_limiter_proxy.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, boolean, text, boolean) TO %s', grantee);
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION rate_limiter_proxy.redefine_all() RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    l rate_limiter_proxy.limits;
    n integer := 0;
BEGIN
    -- SELECT, INSERT and UPDATE on rate_limiter_proxy.limits (see _gate), before any
    -- partition is touched.
    PERFORM rate_limiter_proxy._gate('redefine_all');
    FOR l IN SELECT * FROM rate_limiter_proxy.limits ORDER BY name LOOP
        PERFORM rate_limiter_proxy.define(l.name, l.kind, l.rate, l.period, l.capacity, l.max_reserved, l.shards,
            l.start, l.min_gap, l.mode, l.buckets, l.lock_timeout, l.on_lock_timeout, l.deny_cache,
            enforce => l.enforce, tz => l.tz, durable => l.durable);
        n := n OPERATOR(pg_catalog.+) 1;
    END LOOP;
    RETURN n;
END
$$;

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
