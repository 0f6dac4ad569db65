-- bucket/credit.rs for a token bucket and a fixed window: what the state holds after count
-- comes back at now, refilled as a call at now would, and how much came back.
CREATE FUNCTION rate_limiter._credited(s rate_limiter._state, c rate_limiter._config, now double precision, count double precision,
                                       OUT after rate_limiter._state, OUT given double precision, OUT available double precision)
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    refilled rate_limiter._check := rate_limiter._check(s, c, now, 0, false);
    now_state rate_limiter._state := ROW(refilled.value, refilled.ts, refilled.granted_at, refilled.counts)::rate_limiter._state;
    back rate_limiter._check;
    current float8;
    previous float8;
    from_current float8;
    from_previous float8;
    cells float8[];
    left_ float8;
    back_ float8;
BEGIN
    IF c.kind = 'sliding window' THEN
        -- From the current window's tokens, then the previous one's while it still weighs.
        current := rate_limiter._sliding_current(now_state, c);
        previous := coalesce(now_state.counts[1], 0);
        from_current := least(count, current);
        from_previous := least(count - from_current, previous);
        now_state := ROW(c.rate - (current - from_current), now_state.ts, now_state.granted_at,
                         ARRAY[previous - from_previous, current - from_current])::rate_limiter._state;
        given := from_current + from_previous;
    ELSIF c.kind = 'rolling window' THEN
        -- From the newest cells that hold tokens, back to the oldest that still counts.
        cells := now_state.counts;
        left_ := count;
        FOR i IN REVERSE array_length(cells, 1) .. 1 LOOP
            back_ := least(left_, cells[i]);
            cells[i] := cells[i] - back_;
            left_ := left_ - back_;
        END LOOP;
        given := count - left_;
        now_state := ROW(c.rate - rate_limiter._sum(cells), now_state.ts, now_state.granted_at, cells)::rate_limiter._state;
    ELSE
        given := greatest(least(count, c.capacity - refilled.value), 0::float8);
        now_state.value := refilled.value + given;
    END IF;
    back := rate_limiter._check(now_state, c, now, 0, false);
    after := ROW(back.value, back.ts, back.granted_at, back.counts)::rate_limiter._state;
    available := back.available;
END $$;
