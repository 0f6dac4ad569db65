-- rate_limiter 0.7.0 -> 0.8.0. Issue 64: what a key used carries across a change of its
-- numbers on every kind. A token bucket's or fixed window's row keeps, beside its level, the
-- capacity that level is left of (rate_limiter.state.counts, written by the library from its
-- next write on; a row of 0.7.0 is read at its level until then). No table changes shape.
-- Issue 66: rate_limit_ok, rate_limit's ok alone, at less cost.

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

-- Default privileges (ALTER DEFAULT PRIVILEGES) never reach what this update creates (issue
-- 41): every grant on rate_limit_ok but its owner's came from them. Only it: an update from
-- 0.6.0 runs 0.7.0's script in this transaction too, which gave grants back after its own pin.
DO $pin$
DECLARE
    leaked record;
BEGIN
    FOR leaked IN
        SELECT a.privilege_type,
               CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                    ELSE a.grantee::pg_catalog.regrole::pg_catalog.text END AS grantee
        FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
        WHERE p.oid OPERATOR(pg_catalog.=)
                  'rate_limiter.rate_limit_ok(text, text, double precision, boolean, boolean, jsonb)'::pg_catalog.regprocedure
          AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
    LOOP
        EXECUTE pg_catalog.format('REVOKE %s ON FUNCTION rate_limiter.rate_limit_ok(text, text, double precision, boolean, boolean, jsonb) FROM %s CASCADE',
                                  leaked.privilege_type, leaked.grantee);
    END LOOP;
END
$pin$;
