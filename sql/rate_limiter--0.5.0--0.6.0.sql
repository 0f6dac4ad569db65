-- rate_limiter 0.5.0 -> 0.6.0: memory limits (durable => false, docs/memory-limits.md);
-- no grant reaches the extension's objects through default privileges. 0.4.0 -> 0.5.0 created define() again (SECURITY DEFINER) and created leases,
-- acquire, release and renew under the updating role's default privileges: after ALTER
-- DEFAULT PRIVILEGES GRANT EXECUTE ON FUNCTIONS TO app, app could redefine any limit, and
-- with GRANT SELECT ON TABLES read every lease id (issue 41). From here on, whatever an
-- install or update creates keeps only its scripts' grants, as a fresh install does.
--
-- Runs as a superuser with search_path = rate_limiter: every object and operator is qualified.

\echo Use "ALTER EXTENSION rate_limiter UPDATE TO '0.6.0'" to load this file. \quit

-- Memory limits (docs/memory-limits.md): durable => false counts a limit in shared memory
-- alone. Every limit defined before stays durable.
ALTER TABLE rate_limiter.limits ADD COLUMN durable boolean NOT NULL DEFAULT true;
ALTER TABLE rate_limiter.limits ADD CONSTRAINT limits_memory_is_one_row_in_mode_all
    CHECK (durable OR (NOT hot AND shards OPERATOR(pg_catalog.=) 1 AND mode OPERATOR(pg_catalog.=) 'all' AND min_gap IS NULL AND lock_timeout IS NULL AND kind OPERATOR(pg_catalog.=) ANY (ARRAY['token bucket', 'fixed window', 'sliding window'])));
COMMENT ON COLUMN rate_limiter.limits.durable IS 'false makes it a memory limit: counted in shared memory alone, with no row and no WAL, rolled back with the transaction as a durable one is (needs shared_preload_libraries; see docs/memory-limits.md).';

-- define() takes durable. A function's arguments cannot change in place: create it again,
-- and give back the EXECUTE grants it had (with their grant option; PUBLIC's too).
DO $define$
DECLARE
    grants text[];
    one text;
BEGIN
    SELECT pg_catalog.array_agg(pg_catalog.format('GRANT EXECUTE ON FUNCTION rate_limiter.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, boolean, text, boolean) TO %s%s',
               CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
                    ELSE a.grantee::pg_catalog.regrole::pg_catalog.text END,
               CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END))
    INTO grants
    FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
    WHERE p.oid OPERATOR(pg_catalog.=) 'rate_limiter.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, boolean, text)'::pg_catalog.regprocedure
      AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
      AND a.grantee OPERATOR(pg_catalog.<>) p.proowner;
    DROP FUNCTION rate_limiter.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, boolean, text);
    CREATE FUNCTION rate_limiter."define"(
        "name" TEXT,
        "kind" TEXT,
        "rate" double precision,
        "period" interval,
        "capacity" double precision DEFAULT NULL,
        "max_reserved" double precision DEFAULT NULL,
        "shards" INT DEFAULT 1,
        "start" timestamp with time zone DEFAULT NULL,
        "min_gap" interval DEFAULT NULL,
        "mode" TEXT DEFAULT 'all',
        "buckets" INT DEFAULT NULL,
        "lock_timeout" interval DEFAULT NULL,
        "on_lock_timeout" TEXT DEFAULT 'deny',
        "deny_cache" interval DEFAULT NULL,
        "hot" bool DEFAULT false,
        "enforce" bool DEFAULT true,
        "tz" TEXT DEFAULT NULL,
        "durable" bool DEFAULT true
    ) RETURNS void
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE
    SET search_path TO pg_catalog, pg_temp
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'define_since_0_6_0_wrapper';
    REVOKE ALL ON FUNCTION rate_limiter.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, boolean, text, boolean) FROM PUBLIC;
    COMMENT ON FUNCTION rate_limiter.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, boolean, text, boolean) IS
        'Create or replace a named limit in rate_limiter.limits.';
    FOREACH one IN ARRAY coalesce(grants, '{}') LOOP
        EXECUTE one;
    END LOOP;
END
$define$;

-- The lease ids are the right to end or extend another's lease: no role but the table's
-- owner reads them, whichever grant an update from 0.4.0 in an earlier transaction gave.
DO $leases$
DECLARE
    reader text;
BEGIN
    FOR reader IN
        SELECT DISTINCT a.grantee::pg_catalog.regrole::pg_catalog.text
        FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
        WHERE c.oid OPERATOR(pg_catalog.=) 'rate_limiter.leases'::pg_catalog.regclass
          AND a.grantee OPERATOR(pg_catalog.<>) c.relowner AND a.grantee OPERATOR(pg_catalog.<>) 0
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON TABLE rate_limiter.leases FROM %s CASCADE', reader);
    END LOOP;
END
$leases$;

-- Memory limits' counts as the background worker last wrote them (docs/memory-limits.md,
-- "Restarts and crashes"): what a server loads after a crash, or a standby at promotion.
CREATE TABLE rate_limiter.memory_snapshot (
    entry bytea PRIMARY KEY,
    counts bytea NOT NULL,
    expires timestamptz NOT NULL,
    saved_at timestamptz NOT NULL
) WITH (fillfactor = 50);  -- room on each page for the next round's row versions (HOT updates)
COMMENT ON TABLE rate_limiter.memory_snapshot IS
    'The counts of memory limits (durable => false) as the background worker last wrote them, every rate_limiter.memory_snapshot: loaded after a crash and at a promotion. Written only by the rate_limiter library.';
COMMENT ON COLUMN rate_limiter.memory_snapshot.entry IS 'Which (limit, key) and config the counts are of: 128-bit tags of SHA-256, as shared memory finds them.';
COMMENT ON COLUMN rate_limiter.memory_snapshot.counts IS 'The counts, calls in flight at the time included, in the library''s own encoding.';
COMMENT ON COLUMN rate_limiter.memory_snapshot.expires IS 'From this instant the counts equal an absent key''s: rate_limiter.prune() deletes the row.';
COMMENT ON COLUMN rate_limiter.memory_snapshot.saved_at IS 'When the worker wrote the row.';
COMMENT ON INDEX rate_limiter.memory_snapshot_pkey IS 'One row per entry, which the worker updates in place.';

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
              AND d.deptype OPERATOR(pg_catalog.=) 'e' AND e.extname OPERATOR(pg_catalog.=) 'rate_limiter'
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
            WHERE e.extname OPERATOR(pg_catalog.=) 'rate_limiter' AND pg_catalog.age(n.xmin) OPERATOR(pg_catalog.<=) 0)
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
