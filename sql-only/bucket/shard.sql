-- One shard (bucket/shard.rs): its phase, its fresh state, when it is full again, and when
-- its row may go.

-- bucket::phase_fraction: FNV-1a over the name's bytes, a marker and the key's, finished by
-- splitmix64, as a fraction in [0, 1). 64-bit unsigned arithmetic in numeric, XOR in bit(64).
CREATE FUNCTION rate_limiter._phase_fraction(name text, key text) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    two64 CONSTANT numeric := 18446744073709551616;
    h numeric := 14695981039346656037;
    bytes bytea := convert_to(name, 'UTF8') || CASE WHEN key IS NULL THEN '\x00'::bytea ELSE '\x01'::bytea || convert_to(key, 'UTF8') END;
    b int;
    low int;
    bits bit(64);
BEGIN
    FOR i IN 0 .. length(bytes) - 1 LOOP
        b := get_byte(bytes, i);
        low := (h % 256)::int;
        h := (h - low + (low # b)) * 1099511628211 % two64;
    END LOOP;
    -- splitmix64's finish: h ^= h >> 30; h *= C1; h ^= h >> 27; h *= C2; h ^= h >> 31.
    bits := rate_limiter._bits(h);
    h := rate_limiter._unsigned(bits # (bits >> 30)) * 13787848793156543929 % two64;
    bits := rate_limiter._bits(h);
    h := rate_limiter._unsigned(bits # (bits >> 27)) * 10723151780598845931 % two64;
    bits := rate_limiter._bits(h);
    h := rate_limiter._unsigned(bits # (bits >> 31));
    RETURN floor(h / 2048)::float8 / 9007199254740992::float8;
END $$;

-- An unsigned 64-bit number (numeric in [0, 2^64)) as its bits, and back.
CREATE FUNCTION rate_limiter._bits(u numeric) RETURNS bit(64)
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (CASE WHEN u >= 9223372036854775808 THEN u - 18446744073709551616 ELSE u END)::int8::bit(64);
CREATE FUNCTION rate_limiter._unsigned(b bit(64)) RETURNS numeric
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN CASE WHEN b::int8 < 0 THEN b::int8::numeric + 18446744073709551616 ELSE b::int8::numeric END;

-- bucket::fresh_state: full, and for a fixed window in the window containing now, aligned to
-- start or else to the (name, key)'s phase.
CREATE FUNCTION rate_limiter._fresh(c rate_limiter._config, now double precision, phase double precision)
RETURNS rate_limiter._state
LANGUAGE sql STABLE PARALLEL UNSAFE
RETURN ROW(c.capacity,
           CASE c.kind WHEN 'token bucket' THEN now
           WHEN 'rolling window' THEN rate_limiter._cell_start(c, coalesce(c.start, phase), now)
           WHEN 'fixed window' THEN
               CASE WHEN c.cal_unit IS NOT NULL THEN rate_limiter._cal_boundary(c, rate_limiter._cal_index(c, now))
                    ELSE coalesce(c.start, phase) + floor((now - coalesce(c.start, phase)) / c.period) * c.period END
           ELSE coalesce(c.start, phase) + floor((now - coalesce(c.start, phase)) / c.period) * c.period END,
           NULL, NULL)::rate_limiter._state;

-- bucket::reset_after: ms until a state is full again.
CREATE FUNCTION rate_limiter._reset_after(s rate_limiter._state, c rate_limiter._config, now double precision)
RETURNS double precision
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    s := rate_limiter._carried(s, c);
    RETURN CASE WHEN c.kind = 'sliding window' THEN rate_limiter._sliding_reset_after(s, c, now)
                WHEN c.kind = 'rolling window' THEN rate_limiter._rolling_reset_after(s, c, now)
                WHEN c.capacity - s.value <= 0 THEN 0::float8
                WHEN c.kind = 'token bucket' THEN (c.capacity - s.value) / (c.rate / c.period)
                ELSE greatest(rate_limiter._window_after(c, s.ts, ceil((c.capacity - s.value) / c.rate)) - now, 0::float8) END;
END $$;

-- bucket::expires: from when the state holds what a fresh one would, checked with _check
-- itself so that rounding only makes it later.
CREATE FUNCTION rate_limiter._expires(s rate_limiter._state, c rate_limiter._config) RETURNS double precision
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    at float8;
    step float8 := CASE c.kind WHEN 'token bucket' THEN 1::float8 WHEN 'rolling window' THEN c.period / c.buckets ELSE c.period END;
    refilled rate_limiter._check;
BEGIN
    s := rate_limiter._carried(s, c);
    IF c.kind = 'token bucket' THEN
        at := s.ts + greatest((c.capacity - s.value) / (c.rate / c.period), 0::float8);
    ELSIF c.kind = 'rolling window' THEN
        at := CASE WHEN rate_limiter._last_nonzero(s.counts) = 0 THEN s.ts
                   ELSE (rate_limiter._us(s.ts) + rate_limiter._last_nonzero(s.counts) * rate_limiter._cell_width(c))::float8 / 1000::float8 END;
    ELSIF c.kind = 'sliding window' THEN
        at := s.ts + (CASE WHEN rate_limiter._sliding_current(s, c) > 0 THEN 2 WHEN coalesce(s.counts[1], 0) > 0 THEN 1 ELSE 0 END)::float8 * c.period;
    ELSE
        at := rate_limiter._window_after(c, s.ts, greatest(ceil((c.capacity - s.value) / c.rate), 0::float8));
    END IF;
    at := ceil(greatest(at, coalesce(s.granted_at + c.min_gap, '-Infinity'::float8)));
    FOR i IN 1 .. 64 LOOP
        refilled := rate_limiter._check(s, c, at, 0, false);
        -- A token bucket's or fixed window's one count is its capacity, not tokens taken.
        IF refilled.value >= c.capacity AND at >= s.ts AND refilled.granted_at IS NULL
           AND ((array_length(refilled.counts, 1) = 1 AND refilled.counts[1] < 0) OR rate_limiter._last_nonzero(refilled.counts) = 0) THEN
            RETURN at;
        END IF;
        at := at + step;
        step := step * 2;
    END LOOP;
    RETURN 'Infinity'::float8;
END $$;
