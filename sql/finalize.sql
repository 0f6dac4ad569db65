-- The public consuming functions, privileges and comments, after the Rust functions exist.
--
-- rate_limit and check_rate_limit are PL/pgSQL so that throws => true can raise the custom
-- SQLSTATE RL429 with no Rust frame in between (pgrx maps unknown codes to XX000). They are
-- SECURITY DEFINER, so callers need no rights on the tables, and qualify every name instead
-- of pinning search_path (a per-call SET would cost more than the limiter itself).

CREATE FUNCTION rate_limiter._raise_rate_limited(name text, key text, retry_after double precision)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $fn$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'RL429',
        MESSAGE = pg_catalog.format('rate limit "%s" exceeded', name),
        DETAIL = pg_catalog.json_build_object(
            'kind', 'RateLimited', 'name', name, 'key', key, 'retryAfter', retry_after)::pg_catalog.text,
        HINT = pg_catalog.format('Retry after %s ms.', retry_after);
END
$fn$;

CREATE FUNCTION rate_limiter.rate_limit(
    name text,
    key text DEFAULT NULL,
    count double precision DEFAULT 1,
    reserve boolean DEFAULT false,
    throws boolean DEFAULT false,
    config jsonb DEFAULT NULL
) RETURNS rate_limiter.decision
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
AS $fn$
DECLARE
    d rate_limiter.decision := rate_limiter._decide(name, key, count, reserve, config, true);
BEGIN
    IF throws AND d.retry_after IS NOT NULL THEN
        PERFORM rate_limiter._raise_rate_limited(name, key, d.retry_after);
    END IF;
    RETURN d;
END
$fn$;

-- The twin of rate_limit; only the consume flag passed to _decide differs. Sharing a third
-- PL/pgSQL function would add a call layer to every rate_limit.
CREATE FUNCTION rate_limiter.check_rate_limit(
    name text,
    key text DEFAULT NULL,
    count double precision DEFAULT 1,
    reserve boolean DEFAULT false,
    throws boolean DEFAULT false,
    config jsonb DEFAULT NULL
) RETURNS rate_limiter.decision
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
AS $fn$
DECLARE
    d rate_limiter.decision := rate_limiter._decide(name, key, count, reserve, config, false);
BEGIN
    IF throws AND d.retry_after IS NOT NULL THEN
        PERFORM rate_limiter._raise_rate_limited(name, key, d.retry_after);
    END IF;
    RETURN d;
END
$fn$;

COMMENT ON FUNCTION rate_limiter.rate_limit(text, text, double precision, boolean, boolean, jsonb) IS
    'Take count tokens from (name, key) inside the caller''s transaction; returns a decision, or raises RL429 with throws.';
COMMENT ON FUNCTION rate_limiter.check_rate_limit(text, text, double precision, boolean, boolean, jsonb) IS
    'The answer rate_limit would give, without writing or locking anything.';
COMMENT ON FUNCTION rate_limiter.reset_rate_limit(text, text) IS
    'Forget the state of (name, key), every shard: it is full again.';
COMMENT ON FUNCTION rate_limiter.rate_limit_value(text, text, jsonb, integer) IS
    'The stored value and ts of (name, key) (fullest of sample_shards shards) and the effective config.';
COMMENT ON FUNCTION rate_limiter.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz) IS
    'Create or replace a named limit in rate_limiter.limits.';
COMMENT ON FUNCTION rate_limiter._decide(text, text, double precision, boolean, jsonb, boolean) IS
    'Internal: the core behind rate_limit and check_rate_limit.';
COMMENT ON FUNCTION rate_limiter._raise_rate_limited(text, text, double precision) IS
    'Internal: raises SQLSTATE RL429.';

-- Nothing is open to PUBLIC: grant USAGE on the schema and EXECUTE on the functions a role
-- needs (see the README). The tables stay private; the functions are the only way in.
REVOKE ALL ON ALL TABLES IN SCHEMA rate_limiter FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA rate_limiter FROM PUBLIC;
