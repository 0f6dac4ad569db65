-- The rolling window (bucket/rolling_window.rs): buckets cells of width g (whole
-- microseconds, period / buckets rounded up), aligned as windows are; the tokens of a cell
-- count until buckets cells after it ends, so no interval of period holds more than rate.
-- Stored: ts the start of the current cell, counts the counting cells' tokens, oldest first.

-- ms as whole microseconds, rounded half away from zero (rolling_window::us).
CREATE FUNCTION rate_limiter._us(ms double precision) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (sign(ms * 1000::float8) * floor(abs(ms * 1000::float8) + 0.5::float8))::bigint;

CREATE FUNCTION rate_limiter._cell_width(c rate_limiter._config) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (rate_limiter._us(c.period) + c.buckets - 1) / c.buckets;

-- The start of the cell now falls in, cells aligned to anchor.
CREATE FUNCTION rate_limiter._cell_start(c rate_limiter._config, anchor double precision, now double precision)
RETURNS double precision
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (rate_limiter._us(anchor) + floor((rate_limiter._us(now) - rate_limiter._us(anchor))::numeric
        / rate_limiter._cell_width(c))::bigint * rate_limiter._cell_width(c))::float8 / 1000::float8;

-- The counting cells as of at: the start of the cell at falls in, and their counts.
CREATE FUNCTION rate_limiter._cells(s rate_limiter._state, c rate_limiter._config, at double precision,
                                    OUT start double precision, OUT counts double precision[])
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ts bigint := rate_limiter._us(s.ts);
    g bigint := rate_limiter._cell_width(c);
    n int := c.buckets + 1;
    shift bigint := greatest(rate_limiter._us(at) - ts, 0) / g;  -- a clock that steps back stays
    stored int := coalesce(array_length(s.counts, 1), 0);
    skip int;
BEGIN
    counts := array_fill(0::float8, ARRAY[n]);
    IF shift < n THEN
        skip := greatest(stored + shift::int - n, 0);
        FOR i IN skip .. stored - 1 LOOP
            counts[i + n - stored - shift::int + 1] := s.counts[i + 1];
        END LOOP;
    END IF;
    start := (ts + shift * g)::float8 / 1000::float8;
END $$;

-- Their sum, left to right (as Rust's iter().sum()).
CREATE FUNCTION rate_limiter._sum(xs double precision[]) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    total float8 := 0;
    x float8;
BEGIN
    FOREACH x IN ARRAY xs LOOP total := total + x; END LOOP;
    RETURN total;
END $$;

CREATE FUNCTION rate_limiter._rolling_check(s rate_limiter._state, c rate_limiter._config, now double precision, count double precision)
RETURNS rate_limiter._check
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    cells record := rate_limiter._cells(s, c, now);
    counts float8[] := cells.counts;
    taken float8 := rate_limiter._sum(cells.counts);
    r rate_limiter._check;
    left_ float8;
    shift int;
BEGIN
    r.ok := taken + count <= c.rate;
    counts[c.buckets + 1] := counts[c.buckets + 1] + count;
    r.value := c.rate - taken - count;
    r.ts := cells.start;
    r.counts := counts;
    r.available := c.rate - taken - count;
    IF NOT r.ok THEN
        -- The start of the first later cell from which enough of the oldest no longer count.
        left_ := taken;
        shift := c.buckets + 1;
        FOR i IN 1 .. c.buckets + 1 LOOP
            left_ := left_ - cells.counts[i];
            IF left_ + count <= c.rate THEN shift := i; EXIT; END IF;
        END LOOP;
        r.retry_after := (rate_limiter._us(cells.start) + shift * rate_limiter._cell_width(c))::float8 / 1000::float8 - now;
    END IF;
    RETURN r;
END $$;

-- The last counting cell that holds tokens (1-based), or 0.
CREATE FUNCTION rate_limiter._last_nonzero(xs double precision[]) RETURNS integer
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    FOR i IN REVERSE coalesce(array_length(xs, 1), 0) .. 1 LOOP
        IF xs[i] <> 0 THEN RETURN i; END IF;
    END LOOP;
    RETURN 0;
END $$;

CREATE FUNCTION rate_limiter._rolling_reset_after(s rate_limiter._state, c rate_limiter._config, now double precision)
RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    cells record := rate_limiter._cells(s, c, now);
    last int := rate_limiter._last_nonzero(cells.counts);
BEGIN
    IF last = 0 THEN RETURN 0; END IF;
    RETURN greatest((rate_limiter._us(cells.start) + last * rate_limiter._cell_width(c))::float8 / 1000::float8 - now, 0::float8);
END $$;
