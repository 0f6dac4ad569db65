-- The clock's conversions (src/clock.rs): timestamptz and ms since the Unix epoch.

-- A timestamptz as ms since the Unix epoch, as clock::pg_us_to_ms: the integer microseconds as
-- a double (exact below 2^53, rounded above, as i128 to f64), then divided by 1000.
-- (PL/pgSQL: as an SQL function it would not be inlined, its casts being STABLE, and would
-- cost several times more per call.)
CREATE FUNCTION rate_limiter._ms(t timestamptz) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN CASE WHEN t = 'infinity' THEN 'Infinity'::float8 WHEN t = '-infinity' THEN '-Infinity'::float8
                ELSE (extract(epoch FROM t) * 1000000)::float8 / 1000::float8 END;
END $$;

-- ms as a timestamptz, as clock::ms_to_pg_us: microseconds rounded half away from zero.
CREATE FUNCTION rate_limiter._ts(ms double precision) RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN CASE WHEN ms = 'Infinity' THEN 'infinity'::timestamptz
                ELSE 'epoch'::timestamptz + interval '1 microsecond' * (sign(ms * 1000) * floor(abs(ms * 1000) + 0.5)) END;
END $$;
