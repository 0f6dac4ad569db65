-- The Convex component's token bucket and fixed window (bucket/convex.rs), and the check of
-- any kind (bucket/shard.rs's check, which dispatches to each kind's file).

-- bucket::END_OF_TIME_MS and storable_debt: what a key may owe without max_reserved.
CREATE FUNCTION rate_limiter._storable_debt(c rate_limiter._config, now double precision) RETURNS double precision
LANGUAGE sql STABLE STRICT PARALLEL UNSAFE
RETURN greatest(((9224318016000000::float8 - now)
                  -- A calendar window is as long as its longest: a month of 31 days, a day of 25 hours.
                  / CASE WHEN c.cal_unit = 'm' THEN greatest(c.cal_n::float8 * 31::float8 * 86400000::float8, c.period)
                         WHEN c.cal_unit = 'd' THEN greatest(c.cal_n::float8 * 86400000::float8 + 3600000::float8, c.period)
                         ELSE c.period END
                  - 2::float8) * c.rate - c.capacity, 0::float8);

-- bucket::carried: the state as c reads it. A token bucket's or fixed window's value is what
-- is left of the capacity it keeps as its one count, negated: under another capacity the key keeps
-- what it used (the bucket's deficit; the fixed window's tokens taken in its window, never
-- below 0 but for a debt of reservations, which is kept), marked with the new capacity. A
-- share of several shards reads the level as it stands. A window kind reads it as a row of
-- another kind: the tokens used, no counts.
CREATE FUNCTION rate_limiter._carried(s rate_limiter._state, c rate_limiter._config) RETURNS rate_limiter._state
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    used float8;
BEGIN
    -- The capacity, negated: no count of taken tokens is negative (a sliding window row of
    -- 0.4.0 keeps one count too, its previous window's).
    IF array_length(s.counts, 1) IS DISTINCT FROM 1 OR NOT s.counts[1] < 0 THEN
        RETURN s;
    END IF;
    used := -s.counts[1] - s.value;
    IF c.kind IN ('token bucket', 'fixed window') AND c.split THEN
        -- A share of several shards reads the level as it stands (as before 0.8.0).
        s.counts := NULL;
    ELSIF c.kind = 'token bucket' THEN
        s.value := c.capacity - used;
        s.counts := ARRAY[-c.capacity];
    ELSIF c.kind = 'fixed window' THEN
        s.value := greatest(c.capacity - used, least(s.value, 0::float8));
        s.counts := ARRAY[-c.capacity];
    ELSIF c.kind IN ('sliding window', 'rolling window') THEN
        s.value := c.rate - used;
        s.counts := NULL;
    END IF;
    RETURN s;
END $$;

-- bucket::convex_check and check: refill to now, take count, min_gap after the last grant.
CREATE FUNCTION rate_limiter._check(s rate_limiter._state, c rate_limiter._config, now double precision,
                                    count double precision, reserve boolean)
RETURNS rate_limiter._check
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    elapsed float8 := greatest(now - s.ts, 0::float8);
    r rate_limiter._check;
    per_ms float8;
    windows float8;
    gap_end float8;
BEGIN
    s := rate_limiter._carried(s, c);
    IF c.kind = 'sliding window' THEN
        r := rate_limiter._sliding_check(s, c, now, count);
    ELSIF c.kind = 'rolling window' THEN
        r := rate_limiter._rolling_check(s, c, now, count);
    ELSIF c.kind = 'token bucket' THEN
        per_ms := c.rate / c.period;
        r.value := least(s.value + elapsed * per_ms, c.capacity) - count;
        r.ts := greatest(now, s.ts);
        IF r.value < 0 THEN r.retry_after := -r.value / per_ms; END IF;
    ELSE
        windows := CASE WHEN c.cal_unit IS NULL THEN floor(elapsed / c.period)
                        ELSE greatest(rate_limiter._cal_index(c, s.ts + elapsed) - rate_limiter._cal_index(c, s.ts), 0)::float8 END;
        r.value := least(s.value + c.rate * windows, c.capacity) - count;
        r.ts := rate_limiter._window_after(c, s.ts, windows);
        IF r.value < 0 THEN
            r.retry_after := rate_limiter._window_after(c, r.ts, ceil(-r.value / c.rate)) - now;
        END IF;
    END IF;
    IF c.kind NOT IN ('sliding window', 'rolling window') THEN
        r.ok := r.value >= 0 OR (reserve AND NOT (-r.value > coalesce(c.max_reserved, rate_limiter._storable_debt(c, now))));
        r.available := r.value;
        -- What the value is left of: a later config of another capacity keeps what was used.
        r.counts := CASE WHEN c.split THEN NULL ELSE ARRAY[-c.capacity] END;
    END IF;
    r.reason := 'exhausted';
    -- A gap that has passed is forgotten, so the row can expire.
    IF s.granted_at IS NOT NULL AND c.min_gap IS NOT NULL AND now < s.granted_at + c.min_gap THEN
        gap_end := s.granted_at + c.min_gap;
        r.granted_at := s.granted_at;
        r.ok := false;
        r.reason := 'min_gap';
        r.retry_after := greatest(coalesce(r.retry_after, 0::float8), gap_end - now);
    END IF;
    IF r.ok AND count > 0 AND c.min_gap IS NOT NULL THEN
        r.granted_at := now;
    END IF;
    RETURN r;
END $$;
