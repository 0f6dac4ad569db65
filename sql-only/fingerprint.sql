-- The bytes of config::fingerprint (src/config/fingerprint.rs).

-- A double's bytes, little-endian, -0 as 0 (config::fingerprint's numbers).
CREATE FUNCTION rate_limiter._le(x double precision) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
BEGIN ATOMIC
    SELECT pg_catalog.string_agg(pg_catalog.substr(pg_catalog.float8send(x OPERATOR(pg_catalog.+) 0::float8), i, 1), ''::bytea ORDER BY i DESC)
    FROM pg_catalog.generate_series(1, 8) i;
END;

-- An optional double as config::fingerprint writes it: nine 0xff bytes when absent, else 0
-- and its bytes.
CREATE FUNCTION rate_limiter._le_optional(x double precision) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN x IS NULL THEN '\xffffffffffffffffff'::bytea ELSE '\x00'::bytea OPERATOR(pg_catalog.||) rate_limiter._le(x) END;
