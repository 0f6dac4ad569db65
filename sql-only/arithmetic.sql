-- The bucket arithmetic of src/bucket.rs, operation for operation (the same float8 rounding):
-- times in ms since the Unix epoch, durations in ms. Pure functions, IMMUTABLE, no table.

-- A timestamptz as ms since the Unix epoch, as clock::pg_us_to_ms: the integer microseconds
-- divided by 1000 once (numeric is exact, and its cast to float8 rounds once, as f64 division).
CREATE FUNCTION rate_limiter._ms(t timestamptz) RETURNS double precision
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN t OPERATOR(pg_catalog.=) 'infinity'::timestamptz THEN 'Infinity'::float8
            WHEN t OPERATOR(pg_catalog.=) '-infinity'::timestamptz THEN '-Infinity'::float8
            ELSE (extract(epoch FROM t) OPERATOR(pg_catalog.*) 1000)::float8 END;

-- ms as a timestamptz, as clock::ms_to_pg_us: microseconds rounded half away from zero.
CREATE FUNCTION rate_limiter._ts(ms double precision) RETURNS timestamptz
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN ms OPERATOR(pg_catalog.=) 'Infinity'::float8 THEN 'infinity'::timestamptz
            ELSE 'epoch'::timestamptz OPERATOR(pg_catalog.+) (interval '1 microsecond' OPERATOR(pg_catalog.*)
                 (pg_catalog.sign(ms OPERATOR(pg_catalog.*) 1000::float8) OPERATOR(pg_catalog.*)
                  pg_catalog.floor(pg_catalog.abs(ms OPERATOR(pg_catalog.*) 1000::float8) OPERATOR(pg_catalog.+) 0.5::float8))) END;

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
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN (CASE WHEN u >= 9223372036854775808 THEN u - 18446744073709551616 ELSE u END)::int8::bit(64);
CREATE FUNCTION rate_limiter._unsigned(b bit(64)) RETURNS numeric
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN b::int8 < 0 THEN b::int8::numeric + 18446744073709551616 ELSE b::int8::numeric END;

-- One shard's state, as bucket::State (token bucket and fixed window: no counts).
CREATE TYPE rate_limiter._state AS (value double precision, ts double precision, granted_at double precision);

-- The config the arithmetic reads, as bucket::Config (per shard).
CREATE TYPE rate_limiter._config AS (
    kind text, rate double precision, period double precision, capacity double precision,
    max_reserved double precision, start double precision, min_gap double precision);

-- bucket::Check: what taking `count` from a state at `now` gives.
CREATE TYPE rate_limiter._check AS (
    ok boolean, value double precision, ts double precision, available double precision,
    retry_after double precision, granted_at double precision, reason text);

-- bucket::END_OF_TIME_MS and storable_debt: what a key may owe without max_reserved.
CREATE FUNCTION rate_limiter._storable_debt(c rate_limiter._config, now double precision) RETURNS double precision
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN greatest(((9224318016000000::float8 - now) / c.period - 2::float8) * c.rate - c.capacity, 0::float8);

-- bucket::fresh_state: full, and for a fixed window in the window containing now, aligned to
-- start or else to the (name, key)'s phase.
CREATE FUNCTION rate_limiter._fresh(c rate_limiter._config, now double precision, phase double precision)
RETURNS rate_limiter._state
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN ROW(c.capacity,
           CASE c.kind WHEN 'token bucket' THEN now
           ELSE coalesce(c.start, phase) + floor((now - coalesce(c.start, phase)) / c.period) * c.period END,
           NULL)::rate_limiter._state;

-- bucket::convex_check and check: refill to now, take count, min_gap after the last grant.
CREATE FUNCTION rate_limiter._check(s rate_limiter._state, c rate_limiter._config, now double precision,
                                    count double precision, reserve boolean)
RETURNS rate_limiter._check
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    elapsed float8 := greatest(now - s.ts, 0::float8);
    r rate_limiter._check;
    per_ms float8;
    windows float8;
    gap_end float8;
BEGIN
    IF c.kind = 'token bucket' THEN
        per_ms := c.rate / c.period;
        r.value := least(s.value + elapsed * per_ms, c.capacity) - count;
        r.ts := greatest(now, s.ts);
        IF r.value < 0 THEN r.retry_after := -r.value / per_ms; END IF;
    ELSE
        windows := floor(elapsed / c.period);
        r.value := least(s.value + c.rate * windows, c.capacity) - count;
        r.ts := s.ts + windows * c.period;
        IF r.value < 0 THEN
            r.retry_after := (r.ts + ceil(-r.value / c.rate) * c.period) - now;
        END IF;
    END IF;
    r.ok := r.value >= 0 OR (reserve AND NOT (-r.value > coalesce(c.max_reserved, rate_limiter._storable_debt(c, now))));
    r.available := r.value;
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

-- bucket::reset_after: ms until a state is full again.
CREATE FUNCTION rate_limiter._reset_after(s rate_limiter._state, c rate_limiter._config, now double precision)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN c.capacity - s.value <= 0 THEN 0::float8
            WHEN c.kind = 'token bucket' THEN (c.capacity - s.value) / (c.rate / c.period)
            ELSE greatest((s.ts + ceil((c.capacity - s.value) / c.rate) * c.period) - now, 0::float8) END;

-- bucket::expires: from when the state holds what a fresh one would, checked with _check
-- itself so that rounding only makes it later.
CREATE FUNCTION rate_limiter._expires(s rate_limiter._state, c rate_limiter._config) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    at float8;
    step float8 := CASE c.kind WHEN 'token bucket' THEN 1::float8 ELSE c.period END;
    refilled rate_limiter._check;
BEGIN
    IF c.kind = 'token bucket' THEN
        at := s.ts + greatest((c.capacity - s.value) / (c.rate / c.period), 0::float8);
    ELSE
        at := s.ts + greatest(ceil((c.capacity - s.value) / c.rate), 0::float8) * c.period;
    END IF;
    at := ceil(greatest(at, coalesce(s.granted_at + c.min_gap, '-Infinity'::float8)));
    FOR i IN 1 .. 64 LOOP
        refilled := rate_limiter._check(s, c, at, 0, false);
        IF refilled.value >= c.capacity AND at >= s.ts AND refilled.granted_at IS NULL THEN
            RETURN at;
        END IF;
        at := at + step;
        step := step * 2;
    END LOOP;
    RETURN 'Infinity'::float8;
END $$;
