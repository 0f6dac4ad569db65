-- rate_limiter 0.1.0 -> 0.2.0.
-- rate_limit and check_rate_limit become C functions that read and write the state through
-- the access methods (no PL/pgSQL layer, no SECURITY DEFINER); state rows shrink (shard
-- smallint, COLLATE "C" texts); named configs are cached per backend, invalidated by a
-- trigger on limits. Run ALTER EXTENSION rate_limiter UPDATE after installing the library.

ALTER TABLE rate_limiter.state
    DROP CONSTRAINT state_name_key_shard_key,
    ALTER COLUMN name TYPE text COLLATE "C",
    ALTER COLUMN key TYPE text COLLATE "C",
    ALTER COLUMN shard TYPE smallint,
    ADD CONSTRAINT state_key_name_shard_key UNIQUE NULLS NOT DISTINCT (key, name, shard),
    SET (fillfactor = 90);

-- CREATE OR REPLACE keeps the functions' OIDs, so grants and dependent objects survive.
CREATE OR REPLACE FUNCTION rate_limiter.rate_limit(
    name text,
    key text DEFAULT NULL,
    count double precision DEFAULT 1,
    reserve boolean DEFAULT false,
    throws boolean DEFAULT false,
    config jsonb DEFAULT NULL
) RETURNS rate_limiter.decision
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SECURITY INVOKER
AS 'MODULE_PATHNAME', 'rate_limit_fmgr';

CREATE OR REPLACE FUNCTION rate_limiter.check_rate_limit(
    name text,
    key text DEFAULT NULL,
    count double precision DEFAULT 1,
    reserve boolean DEFAULT false,
    throws boolean DEFAULT false,
    config jsonb DEFAULT NULL
) RETURNS rate_limiter.decision
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SECURITY INVOKER
AS 'MODULE_PATHNAME', 'check_rate_limit_fmgr';

ALTER FUNCTION rate_limiter.rate_limit_value(text, text, jsonb, integer) SECURITY INVOKER;

DROP FUNCTION rate_limiter._decide(text, text, double precision, boolean, jsonb, boolean);
DROP FUNCTION rate_limiter._raise_rate_limited(text, text, double precision);

CREATE FUNCTION rate_limiter._limits_changed() RETURNS trigger
LANGUAGE c AS 'MODULE_PATHNAME', '_limits_changed_wrapper';
REVOKE ALL ON FUNCTION rate_limiter._limits_changed() FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter._limits_changed() IS
    'Internal: trigger that invalidates every backend''s cache of rate_limiter.limits.';

CREATE TRIGGER limits_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON rate_limiter.limits
    FOR EACH STATEMENT EXECUTE FUNCTION rate_limiter._limits_changed();
