-- The sliding window (bucket/sliding_window.rs): windows aligned as the fixed window's; at a
-- fraction f into the window, the previous window's tokens weigh 1 - f, and a call of count
-- is allowed iff previous * (1 - f) + current + count <= rate.

-- The tokens taken in the window starting at s.ts (a row of another kind: rate - value).
CREATE FUNCTION rate_limiter._sliding_current(s rate_limiter._state, c rate_limiter._config) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN array_length(s.counts, 1) = 2 THEN s.counts[2] ELSE greatest(c.rate - s.value, 0::float8) END;

-- The window at falls in (start), and the tokens taken in it and in the one before.
CREATE FUNCTION rate_limiter._sliding_windows(s rate_limiter._state, c rate_limiter._config, at double precision,
                                              OUT start double precision, OUT current double precision, OUT previous double precision)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    elapsed float8 := floor(greatest(at - s.ts, 0::float8) / c.period);
    taken float8 := rate_limiter._sliding_current(s, c);
BEGIN
    IF elapsed = 0 THEN
        previous := coalesce(s.counts[1], 0); current := taken;
    ELSIF elapsed = 1 THEN
        previous := taken; current := 0;
    ELSE
        previous := 0; current := 0;
    END IF;
    start := s.ts + elapsed * c.period;
END $$;

-- The tokens that count against the rate at `at`.
CREATE FUNCTION rate_limiter._sliding_weighted(start double precision, current double precision, previous double precision,
                                               c rate_limiter._config, at double precision) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN previous * (1::float8 - least(greatest((at - start) / c.period, 0::float8), 1::float8)) + current;

CREATE FUNCTION rate_limiter._sliding_ok(s rate_limiter._state, c rate_limiter._config, at double precision, count double precision)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    w record := rate_limiter._sliding_windows(s, c, at);
BEGIN
    RETURN rate_limiter._sliding_weighted(w.start, w.current, w.previous, c, at) + count <= c.rate;
END $$;

-- The earliest instant from now on at which count is allowed: closed form, then checked so
-- that rounding only makes it later.
CREATE FUNCTION rate_limiter._sliding_retry_at(s rate_limiter._state, c rate_limiter._config, now double precision, count double precision)
RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    w record := rate_limiter._sliding_windows(s, c, now);
    room float8 := c.rate - w.current - count;
    at float8;
    step float8;
BEGIN
    IF room >= 0 AND w.previous > 0 THEN
        at := w.start + (1::float8 - room / w.previous) * c.period;
    ELSIF w.current > c.rate - count THEN
        at := w.start + c.period + (1::float8 - (c.rate - count) / w.current) * c.period;
    ELSE
        at := w.start + c.period;
    END IF;
    step := abs(at) * 2.220446049250313e-16::float8;
    FOR i IN 1 .. 128 LOOP
        IF at >= now AND rate_limiter._sliding_ok(s, c, at, count) THEN
            RETURN at;
        END IF;
        at := greatest(at + step, now);
        step := step * 2;
    END LOOP;
    RETURN w.start + 2::float8 * c.period;
END $$;

CREATE FUNCTION rate_limiter._sliding_check(s rate_limiter._state, c rate_limiter._config, now double precision, count double precision)
RETURNS rate_limiter._check
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    w record := rate_limiter._sliding_windows(s, c, now);
    weighted float8 := rate_limiter._sliding_weighted(w.start, w.current, w.previous, c, now);
    r rate_limiter._check;
BEGIN
    r.ok := weighted + count <= c.rate;
    r.value := c.rate - (w.current + count);
    r.ts := w.start;
    r.counts := ARRAY[w.previous, w.current + count];
    r.available := c.rate - weighted - count;
    IF NOT r.ok THEN r.retry_after := rate_limiter._sliding_retry_at(s, c, now, count) - now; END IF;
    RETURN r;
END $$;

CREATE FUNCTION rate_limiter._sliding_reset_after(s rate_limiter._state, c rate_limiter._config, now double precision)
RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    w record := rate_limiter._sliding_windows(s, c, now);
BEGIN
    RETURN greatest(CASE WHEN w.current > 0 THEN w.start + 2::float8 * c.period
                         WHEN w.previous > 0 THEN w.start + c.period ELSE now END - now, 0::float8);
END $$;
