-- rate_limiter 0.7.0 -> 0.8.0. Issue 64: what a key used carries across a change of its
-- numbers on every kind. A token bucket's or fixed window's row keeps, beside its level, the
-- capacity that level is left of (rate_limiter.state.counts, written by the library from its
-- next write on; a row of 0.7.0 is read at its level until then). No table changes shape.
-- Issue 66: rate_limit_ok, rate_limit's ok alone, at less cost. Issue 67: limits on a
-- table's writes (limit_writes, unlimit_writes, the view write_limits).

\echo Use "ALTER EXTENSION rate_limiter UPDATE TO '0.8.0'" to load this file. \quit

COMMENT ON COLUMN rate_limiter.state.counts IS
    'Sliding window: {tokens taken in the window before ts, tokens taken in the window from ts} (a row 0.4.0 wrote holds the first only). Rolling window: tokens taken per counting cell, oldest first, the last starting at ts. Token bucket and fixed window: {-capacity}, the capacity value is what is left of, negated, so that a key whose numbers change keeps what it used (NULL in a row written before 0.8.0).';

-- As sql/finalize.sql declares it.
CREATE FUNCTION rate_limiter.rate_limit_ok(
    name text,
    key text DEFAULT NULL,
    count double precision DEFAULT 1,
    reserve boolean DEFAULT false,
    throws boolean DEFAULT false,
    config jsonb DEFAULT NULL
) RETURNS boolean
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'rate_limit_ok_fmgr';
REVOKE ALL ON FUNCTION rate_limiter.rate_limit_ok(text, text, double precision, boolean, boolean, jsonb) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter.rate_limit_ok(text, text, double precision, boolean, boolean, jsonb) IS
    'rate_limit(...).ok, at less cost: takes as rate_limit does (and raises RL429 with throws), and returns only whether the call is ok.';

-- As sql/finalize.sql declares them. Limits on a table's writes (issue 67): limit_writes makes, per event, a statement-level
-- AFTER trigger running _write_limited() with the declaration as its arguments, which charges
-- each statement's rows per key in one all-or-nothing decision (RL429 on a denial). Only the
-- extension's owner may execute _write_limited, so only limit_writes makes such triggers.
CREATE FUNCTION rate_limiter._write_limited() RETURNS trigger
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'write_limited_fmgr';
COMMENT ON FUNCTION rate_limiter._write_limited() IS
    'The trigger of a write limit (limit_writes): charges a statement''s rows per key, all or nothing.';

CREATE FUNCTION rate_limiter.limit_writes(
    "table" regclass,
    limit_name text,
    key text DEFAULT NULL,
    events text[] DEFAULT '{INSERT}',
    count text DEFAULT NULL,
    config jsonb DEFAULT NULL
) RETURNS void
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'limit_writes_fmgr';
COMMENT ON FUNCTION rate_limiter.limit_writes(regclass, text, text, text[], text, jsonb) IS
    'Holds every write of the table (events) to the limit, per key column value, each row counting 1 or its count column: a statement over the limit fails whole with RL429.';

CREATE FUNCTION rate_limiter.unlimit_writes("table" regclass, limit_name text DEFAULT NULL) RETURNS integer
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'unlimit_writes_fmgr';
COMMENT ON FUNCTION rate_limiter.unlimit_writes(regclass, text) IS
    'Drops the table''s write limits (the named limit''s alone, when given); how many triggers it dropped.';

-- The write limits' triggers, their arguments decoded (tgargs holds each NUL-terminated).
CREATE VIEW rate_limiter.write_limits AS
SELECT t.tgrelid::pg_catalog.regclass AS "table",
       a.arguments[2] AS limit_name,
       NULLIF(a.arguments[3], '') AS key_column,
       NULLIF(a.arguments[4], '') AS count_column,
       CASE WHEN (t.tgtype::integer OPERATOR(pg_catalog.&) 4) OPERATOR(pg_catalog.<>) 0 THEN 'INSERT'
            WHEN (t.tgtype::integer OPERATOR(pg_catalog.&) 16) OPERATOR(pg_catalog.<>) 0 THEN 'UPDATE'
            ELSE 'DELETE' END AS event,
       NULLIF(a.arguments[5], '')::pg_catalog.jsonb AS config,
       t.tgname AS trigger_name,
       t.tgenabled OPERATOR(pg_catalog.=) ANY (ARRAY['O', 'A']::"char"[]) AS enabled
FROM pg_catalog.pg_trigger t
CROSS JOIN LATERAL (
    -- Split at each NUL byte, the bytes between as text of the database's encoding.
    WITH RECURSIVE split(n, argument, rest) AS (
        SELECT 0, NULL::pg_catalog.bytea, t.tgargs
        UNION ALL
        SELECT s.n OPERATOR(pg_catalog.+) 1,
               pg_catalog.substring(s.rest, 1, pg_catalog.position(s.rest, '\x00'::pg_catalog.bytea) OPERATOR(pg_catalog.-) 1),
               pg_catalog.substring(s.rest, pg_catalog.position(s.rest, '\x00'::pg_catalog.bytea) OPERATOR(pg_catalog.+) 1)
        FROM split s WHERE pg_catalog.position(s.rest, '\x00'::pg_catalog.bytea) OPERATOR(pg_catalog.>) 0
    )
    SELECT pg_catalog.array_agg(pg_catalog.convert_from(s.argument, pg_catalog.getdatabaseencoding()) ORDER BY s.n)
    FROM split s WHERE s.n OPERATOR(pg_catalog.>) 0
) AS a(arguments)
WHERE t.tgfoid OPERATOR(pg_catalog.=) 'rate_limiter._write_limited()'::pg_catalog.regprocedure;
COMMENT ON VIEW rate_limiter.write_limits IS
    'Every write limit (rate_limiter.limit_writes): one row per table, limit and event.';
COMMENT ON COLUMN rate_limiter.write_limits."table" IS 'The table whose writes are limited.';
COMMENT ON COLUMN rate_limiter.write_limits.limit_name IS 'The limit each statement''s rows are charged to.';
COMMENT ON COLUMN rate_limiter.write_limits.key_column IS 'The column whose value (as text) is the key; NULL: one key for the whole table.';
COMMENT ON COLUMN rate_limiter.write_limits.count_column IS 'The column whose value a row counts; NULL: each row counts 1.';
COMMENT ON COLUMN rate_limiter.write_limits.event IS 'INSERT, UPDATE (the new rows charged) or DELETE (the old rows).';
COMMENT ON COLUMN rate_limiter.write_limits.config IS 'The inline config; NULL: the named limit.';
COMMENT ON COLUMN rate_limiter.write_limits.trigger_name IS 'The trigger that charges the rows.';
COMMENT ON COLUMN rate_limiter.write_limits.enabled IS 'Whether the trigger fires in ordinary sessions: false once the table''s owner disabled it, or enabled it for replicas only (ALTER TABLE ... DISABLE TRIGGER, ENABLE REPLICA TRIGGER).';
REVOKE ALL ON FUNCTION rate_limiter._write_limited() FROM PUBLIC;
REVOKE ALL ON FUNCTION rate_limiter.limit_writes(regclass, text, text, text[], text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION rate_limiter.unlimit_writes(regclass, text) FROM PUBLIC;
REVOKE ALL ON rate_limiter.write_limits FROM PUBLIC;

-- Default privileges (ALTER DEFAULT PRIVILEGES) never reach what this update creates (issue
-- 41): every grant on its new functions and view but their owner's came from them. Only
-- those: an update from 0.6.0 runs 0.7.0's script in this transaction too, which gave grants
-- back after its own pin.
DO $pin$
DECLARE
    leaked record;
BEGIN
    FOR leaked IN
        SELECT 'FUNCTION ' OPERATOR(pg_catalog.||) p.oid::pg_catalog.regprocedure::pg_catalog.text AS what, a.privilege_type,
               CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                    ELSE a.grantee::pg_catalog.regrole::pg_catalog.text END AS grantee
        FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
        WHERE p.oid OPERATOR(pg_catalog.=) ANY (ARRAY[
                  'rate_limiter.rate_limit_ok(text, text, double precision, boolean, boolean, jsonb)'::pg_catalog.regprocedure,
                  'rate_limiter._write_limited()'::pg_catalog.regprocedure,
                  'rate_limiter.limit_writes(regclass, text, text, text[], text, jsonb)'::pg_catalog.regprocedure,
                  'rate_limiter.unlimit_writes(regclass, text)'::pg_catalog.regprocedure]::pg_catalog.oid[])
          AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
        UNION ALL
        SELECT 'TABLE ' OPERATOR(pg_catalog.||) c.oid::pg_catalog.regclass::pg_catalog.text, a.privilege_type,
               CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                    ELSE a.grantee::pg_catalog.regrole::pg_catalog.text END
        FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
        WHERE c.oid OPERATOR(pg_catalog.=) 'rate_limiter.write_limits'::pg_catalog.regclass
          AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
    LOOP
        EXECUTE pg_catalog.format('REVOKE %s ON %s FROM %s CASCADE', leaked.privilege_type, leaked.what, leaked.grantee);
    END LOOP;
END
$pin$;
