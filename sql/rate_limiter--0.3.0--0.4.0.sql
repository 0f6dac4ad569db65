-- rate_limiter 0.3.0 -> 0.4.0: nothing that runs with more rights than its caller resolves
-- a name through a schema someone else controls.
-- Run ALTER EXTENSION rate_limiter UPDATE after installing the library.
--
-- Like every script of 0.4.0, this one runs as a superuser with search_path = rate_limiter:
-- every operator and function is qualified with pg_catalog, so that a look-alike planted in
-- the schema is never resolved.

-- CHECK constraints compared a double precision column with an integer literal, which an
-- operator of exact types planted in the schema could take over: create them again, bound to
-- pg_catalog's operators.
ALTER TABLE rate_limiter.limits
    DROP CONSTRAINT limits_name_check,
    DROP CONSTRAINT limits_kind_check,
    DROP CONSTRAINT limits_rate_check,
    DROP CONSTRAINT limits_period_check,
    DROP CONSTRAINT limits_capacity_check,
    DROP CONSTRAINT limits_max_reserved_check,
    DROP CONSTRAINT limits_shards_check,
    DROP CONSTRAINT limits_start_check,
    DROP CONSTRAINT limits_min_gap_check,
    DROP CONSTRAINT limits_mode_check,
    DROP CONSTRAINT limits_buckets_check,
    DROP CONSTRAINT limits_lock_timeout_check,
    DROP CONSTRAINT limits_on_lock_timeout_check,
    DROP CONSTRAINT limits_deny_cache_check,
    DROP CONSTRAINT limits_deny_cache_is_for_one_row_per_key_in_mode_all,
    DROP CONSTRAINT limits_one_row_per_key_for_lock_timeout,
    DROP CONSTRAINT limits_buckets_are_for_rolling_window,
    DROP CONSTRAINT limits_one_row_per_key_for_min_gap_and_modes,
    DROP CONSTRAINT limits_start_is_for_windows,
    DROP CONSTRAINT limits_capacity_is_rate,
    DROP CONSTRAINT limits_reservations_are_for_token_bucket_and_fixed_window;
ALTER TABLE rate_limiter.limits
    ADD CONSTRAINT limits_name_check CHECK (name OPERATOR(pg_catalog.<>) '' AND pg_catalog.octet_length(name) OPERATOR(pg_catalog.<=) 128),
    ADD CONSTRAINT limits_kind_check CHECK (kind OPERATOR(pg_catalog.=) ANY (ARRAY['token bucket', 'fixed window', 'sliding window', 'rolling window'])),
    ADD CONSTRAINT limits_rate_check CHECK (rate OPERATOR(pg_catalog.>) 0::pg_catalog.float8 AND rate OPERATOR(pg_catalog.<) 'Infinity'::pg_catalog.float8),
    ADD CONSTRAINT limits_period_check CHECK (period OPERATOR(pg_catalog.>) '0'::pg_catalog.interval),
    ADD CONSTRAINT limits_capacity_check CHECK (capacity OPERATOR(pg_catalog.>=) 0::pg_catalog.float8 AND capacity OPERATOR(pg_catalog.<) 'Infinity'::pg_catalog.float8),
    ADD CONSTRAINT limits_max_reserved_check CHECK (max_reserved OPERATOR(pg_catalog.>=) 0::pg_catalog.float8 AND max_reserved OPERATOR(pg_catalog.<) 'Infinity'::pg_catalog.float8),
    ADD CONSTRAINT limits_shards_check CHECK (shards OPERATOR(pg_catalog.>=) 1 AND shards OPERATOR(pg_catalog.<=) 1024),
    ADD CONSTRAINT limits_start_check CHECK (pg_catalog.isfinite(start)),
    ADD CONSTRAINT limits_min_gap_check CHECK (min_gap OPERATOR(pg_catalog.>=) '0'::pg_catalog.interval),
    ADD CONSTRAINT limits_mode_check CHECK (mode OPERATOR(pg_catalog.=) ANY (ARRAY['all', 'partial', 'penalize'])),
    ADD CONSTRAINT limits_buckets_check CHECK (buckets OPERATOR(pg_catalog.>=) 1 AND buckets OPERATOR(pg_catalog.<=) 64),
    ADD CONSTRAINT limits_lock_timeout_check CHECK (lock_timeout OPERATOR(pg_catalog.>=) '0'::pg_catalog.interval),
    ADD CONSTRAINT limits_on_lock_timeout_check CHECK (on_lock_timeout OPERATOR(pg_catalog.=) ANY (ARRAY['deny', 'allow'])),
    ADD CONSTRAINT limits_deny_cache_check CHECK (deny_cache OPERATOR(pg_catalog.>=) '0'::pg_catalog.interval),
    ADD CONSTRAINT limits_deny_cache_is_for_one_row_per_key_in_mode_all
        CHECK (deny_cache IS NULL OR (shards OPERATOR(pg_catalog.=) 1 AND mode OPERATOR(pg_catalog.=) 'all')),
    ADD CONSTRAINT limits_one_row_per_key_for_lock_timeout
        CHECK (shards OPERATOR(pg_catalog.=) 1 OR lock_timeout IS NULL),
    ADD CONSTRAINT limits_buckets_are_for_rolling_window
        CHECK (kind OPERATOR(pg_catalog.=) 'rolling window' OR buckets IS NULL),
    ADD CONSTRAINT limits_one_row_per_key_for_min_gap_and_modes
        CHECK (shards OPERATOR(pg_catalog.=) 1 OR (min_gap IS NULL AND mode OPERATOR(pg_catalog.=) 'all')),
    ADD CONSTRAINT limits_start_is_for_windows
        CHECK (kind OPERATOR(pg_catalog.<>) 'token bucket' OR start IS NULL),
    ADD CONSTRAINT limits_capacity_is_rate
        CHECK (kind OPERATOR(pg_catalog.=) ANY (ARRAY['token bucket', 'fixed window']) OR capacity IS NULL OR capacity OPERATOR(pg_catalog.=) rate),
    ADD CONSTRAINT limits_reservations_are_for_token_bucket_and_fixed_window
        CHECK (kind OPERATOR(pg_catalog.=) ANY (ARRAY['token bucket', 'fixed window']) OR max_reserved IS NULL);
ALTER TABLE rate_limiter.blocks
    DROP CONSTRAINT blocks_name_check,
    DROP CONSTRAINT blocks_key_check,
    ADD CONSTRAINT blocks_name_check CHECK (name OPERATOR(pg_catalog.<>) '' AND pg_catalog.octet_length(name) OPERATOR(pg_catalog.<=) 128),
    ADD CONSTRAINT blocks_key_check CHECK (pg_catalog.octet_length(key) OPERATOR(pg_catalog.<=) 1024);

-- SECURITY DEFINER functions and the cache trigger run with a search_path of their own.
ALTER FUNCTION rate_limiter.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval)
    SET search_path TO pg_catalog, pg_temp;
ALTER FUNCTION rate_limiter.block(text, text, timestamptz, text) SET search_path TO pg_catalog, pg_temp;
ALTER FUNCTION rate_limiter.unblock(text, text) SET search_path TO pg_catalog, pg_temp;
ALTER FUNCTION rate_limiter.reset_rate_limit(text, text) SET search_path TO pg_catalog, pg_temp;
ALTER FUNCTION rate_limiter.prune(integer) SET search_path TO pg_catalog, pg_temp;
ALTER FUNCTION rate_limiter._limits_changed() SET search_path = pg_catalog, pg_temp;
