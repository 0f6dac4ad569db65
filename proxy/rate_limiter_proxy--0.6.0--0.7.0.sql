-- rate_limiter_proxy 0.6.0 -> 0.7.0: rate_limiter 0.7.0's overrides and tiers through the
-- router (issue 55). A key's override goes to the key's partition, where its calls go; a tier
-- to every partition, as define() goes. Both are allowed, as block() is, to roles with UPDATE
-- on rate_limiter_proxy.limits: they change how a limit applies, for every caller. A spread
-- limit (shards > 1, shared out over the partitions) has neither through the router: each
-- partition holds a share of it, which an override's numbers would need too. Runs as a
-- superuser: every object and operator is qualified.

\echo Use "ALTER EXTENSION rate_limiter_proxy UPDATE TO '0.7.0'" to load this file. \quit

CREATE OR REPLACE FUNCTION rate_limiter_proxy._gate(action text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    needed pg_catalog.text[];
    missing pg_catalog.text[] := '{}';
    privilege pg_catalog.text;
BEGIN
    IF action OPERATOR(pg_catalog.=) 'define' THEN
        needed := ARRAY['INSERT', 'UPDATE'];
    ELSIF action OPERATOR(pg_catalog.=) 'redefine_all' THEN
        needed := ARRAY['SELECT', 'INSERT', 'UPDATE'];
    ELSIF action OPERATOR(pg_catalog.=) ANY (ARRAY['block', 'unblock', 'allow', 'disallow', 'reset_rate_limit',
                                                   'override', 'remove_override', 'define_tier', 'remove_tier']) THEN
        needed := ARRAY['UPDATE'];
    ELSE
        RAISE EXCEPTION 'rate_limiter_proxy has no action "%"', action USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOREACH privilege IN ARRAY needed LOOP
        -- One at a time: given a list, has_table_privilege says whether any one is held.
        IF NOT pg_catalog.has_table_privilege('rate_limiter_proxy.limits'::pg_catalog.regclass, privilege) THEN
            missing := pg_catalog.array_append(missing, privilege);
        END IF;
    END LOOP;
    IF pg_catalog.cardinality(missing) OPERATOR(pg_catalog.>) 0 THEN
        RAISE EXCEPTION 'permission denied for rate_limiter_proxy.%', action
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = pg_catalog.format('rate_limiter_proxy.%s changes how limits apply on the partitions: the router allows it to roles with %s on rate_limiter_proxy.limits. Nothing was sent to a partition.',
                      action, pg_catalog.array_to_string(needed, ', ')),
                  HINT = pg_catalog.format('GRANT %s ON rate_limiter_proxy.limits TO %I;',
                      pg_catalog.array_to_string(missing, ', '), current_user);
    END IF;
    RETURN 'rate_limiter';
END
$$;
COMMENT ON FUNCTION rate_limiter_proxy._gate(text) IS
    'Whether the caller may run a function that changes how limits apply on the partitions (define, redefine_all, block, unblock, allow, disallow, reset_rate_limit, override, remove_override, define_tier, remove_tier): the PL/Proxy cluster''s name, or 42501 naming the GRANT on rate_limiter_proxy.limits that is missing.';

-- 0A000 for a limit the router spreads over the partitions: its overrides and tiers would
-- need each partition's share of their numbers.
CREATE FUNCTION rate_limiter_proxy._not_spread(name text, action text) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF EXISTS (SELECT FROM rate_limiter_proxy.limits l
               WHERE l.name OPERATOR(pg_catalog.=) _not_spread.name AND l.shards OPERATOR(pg_catalog.>) 1
                 AND l.kind OPERATOR(pg_catalog.<>) 'concurrency') THEN
        RAISE EXCEPTION 'not supported: % of the spread limit "%" through the router', action, name
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = 'Each partition holds its share of a limit with shards > 1; an override''s or a tier''s numbers would need their share too.',
                  HINT = 'Run rate_limiter.override() or define_tier() on each partition with its share, or define the limit with shards = 1.';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._not_spread(text, text) FROM PUBLIC;

CREATE FUNCTION rate_limiter_proxy._override(hash integer, name text, key text, rate double precision, period interval,
    capacity double precision, max_reserved double precision, min_gap interval, exempt boolean, tier text,
    until timestamptz, note text)
RETURNS integer LANGUAGE plproxy SET search_path = pg_catalog, pg_temp AS $$
    CLUSTER rate_limiter_proxy._gate('override');
    RUN ON hash;
    SELECT 1 FROM rate_limiter.override(name, key, rate, period, capacity, max_reserved, min_gap, exempt, tier, until, note);
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._override(integer, text, text, double precision, interval, double precision, double precision, interval, boolean, text, timestamptz, text) FROM PUBLIC;

CREATE FUNCTION rate_limiter_proxy._remove_override(hash integer, name text, key text)
RETURNS boolean LANGUAGE plproxy SET search_path = pg_catalog, pg_temp AS $$
    CLUSTER rate_limiter_proxy._gate('remove_override');
    RUN ON hash;
    SELECT rate_limiter.remove_override(name, key);
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._remove_override(integer, text, text) FROM PUBLIC;

CREATE FUNCTION rate_limiter_proxy._define_tier_everywhere(name text, tier text, rate double precision, period interval,
    capacity double precision, max_reserved double precision, min_gap interval, exempt boolean, note text)
RETURNS SETOF integer LANGUAGE plproxy SET search_path = pg_catalog, pg_temp AS $$
    CLUSTER rate_limiter_proxy._gate('define_tier');
    RUN ON ALL;
    SELECT 1 FROM rate_limiter.define_tier(name, tier, rate, period, capacity, max_reserved, min_gap, exempt, note);
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._define_tier_everywhere(text, text, double precision, interval, double precision, double precision, interval, boolean, text) FROM PUBLIC;

CREATE FUNCTION rate_limiter_proxy._remove_tier_everywhere(name text, tier text)
RETURNS SETOF boolean LANGUAGE plproxy SET search_path = pg_catalog, pg_temp AS $$
    CLUSTER rate_limiter_proxy._gate('remove_tier');
    RUN ON ALL;
    SELECT rate_limiter.remove_tier(name, tier);
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._remove_tier_everywhere(text, text) FROM PUBLIC;

CREATE FUNCTION rate_limiter_proxy.override(
    name text,
    key text,
    rate double precision DEFAULT NULL,
    period interval DEFAULT NULL,
    capacity double precision DEFAULT NULL,
    max_reserved double precision DEFAULT NULL,
    min_gap interval DEFAULT NULL,
    exempt boolean DEFAULT false,
    tier text DEFAULT NULL,
    until timestamptz DEFAULT 'infinity',
    note text DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    target rate_limiter_proxy.route_target;
    code pg_catalog.text; msg pg_catalog.text; det pg_catalog.text; hnt pg_catalog.text;
BEGIN
    -- UPDATE on rate_limiter_proxy.limits (see _gate), before any partition is touched.
    PERFORM rate_limiter_proxy._gate('override');
    PERFORM rate_limiter_proxy._not_spread(name, 'overrides');
    target := rate_limiter_proxy._route(name, key, NULL);
    PERFORM rate_limiter_proxy._override(target.hash, name, key, rate, period, capacity, max_reserved, min_gap, exempt,
                                         tier, until, note);
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    PERFORM rate_limiter_proxy._raise_again(code, msg, det, hnt, target.hash);
    RAISE;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.override(text, text, double precision, interval, double precision, double precision, interval, boolean, text, timestamptz, text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.override(text, text, double precision, interval, double precision, double precision, interval, boolean, text, timestamptz, text) IS
    'rate_limiter.override on the partition of the key, where its calls go (not for a spread limit). Needs UPDATE on rate_limiter_proxy.limits.';

CREATE FUNCTION rate_limiter_proxy.remove_override(name text, key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    target rate_limiter_proxy.route_target;
    code pg_catalog.text; msg pg_catalog.text; det pg_catalog.text; hnt pg_catalog.text;
BEGIN
    PERFORM rate_limiter_proxy._gate('remove_override');
    PERFORM rate_limiter_proxy._not_spread(name, 'overrides');
    target := rate_limiter_proxy._route(name, key, NULL);
    RETURN rate_limiter_proxy._remove_override(target.hash, name, key);
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    PERFORM rate_limiter_proxy._raise_again(code, msg, det, hnt, target.hash);
    RAISE;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.remove_override(text, text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.remove_override(text, text) IS
    'rate_limiter.remove_override on the partition of the key. Needs UPDATE on rate_limiter_proxy.limits.';

CREATE FUNCTION rate_limiter_proxy.define_tier(
    name text,
    tier text,
    rate double precision DEFAULT NULL,
    period interval DEFAULT NULL,
    capacity double precision DEFAULT NULL,
    max_reserved double precision DEFAULT NULL,
    min_gap interval DEFAULT NULL,
    exempt boolean DEFAULT false,
    note text DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    code pg_catalog.text; msg pg_catalog.text; det pg_catalog.text; hnt pg_catalog.text;
BEGIN
    PERFORM rate_limiter_proxy._gate('define_tier');
    PERFORM rate_limiter_proxy._not_spread(name, 'tiers');
    -- Every partition at once, each in a transaction of its own: after an error some may
    -- have the new tier; define it again.
    PERFORM rate_limiter_proxy._define_tier_everywhere(name, tier, rate, period, capacity, max_reserved, min_gap, exempt, note);
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    PERFORM rate_limiter_proxy._raise_again(code, msg, det, hnt, NULL);
    RAISE;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.define_tier(text, text, double precision, interval, double precision, double precision, interval, boolean, text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.define_tier(text, text, double precision, interval, double precision, double precision, interval, boolean, text) IS
    'rate_limiter.define_tier on every partition (not for a spread limit). Needs UPDATE on rate_limiter_proxy.limits.';

CREATE FUNCTION rate_limiter_proxy.remove_tier(name text, tier text) RETURNS boolean
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    code pg_catalog.text; msg pg_catalog.text; det pg_catalog.text; hnt pg_catalog.text;
BEGIN
    PERFORM rate_limiter_proxy._gate('remove_tier');
    RETURN (SELECT pg_catalog.bool_or(removed) FROM rate_limiter_proxy._remove_tier_everywhere(name, tier) AS removed);
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    PERFORM rate_limiter_proxy._raise_again(code, msg, det, hnt, NULL);
    RAISE;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.remove_tier(text, text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.remove_tier(text, text) IS
    'rate_limiter.remove_tier on every partition; true if any partition had the tier. Needs UPDATE on rate_limiter_proxy.limits.';

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
