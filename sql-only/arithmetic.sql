-- The bucket arithmetic of src/bucket.rs, operation for operation (the same float8 rounding):
-- times in ms since the Unix epoch, durations in ms. No table; IMMUTABLE but where a calendar
-- window reads its time zone's rules (STABLE, and never in a parallel worker: the zone is
-- looked up as SET TimeZone does).

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

-- One shard's state, as bucket::State: counts are the sliding window's {previous, current}
-- (NULL for a token bucket and a fixed window).
CREATE TYPE rate_limiter._state AS (value double precision, ts double precision, granted_at double precision,
                                    counts double precision[]);

-- The config the arithmetic reads, as bucket::Config (per shard).
CREATE TYPE rate_limiter._config AS (
    kind text, rate double precision, period double precision, capacity double precision,
    max_reserved double precision, start double precision, min_gap double precision, buckets integer,
    mode text, cal_unit text, cal_n integer, cal_zone text, cal_anchor double precision, shards integer);

-- Calendar windows (bucket/calendar.rs): a fixed window whose period is whole months, one day
-- or one week starts its windows on the calendar in a time zone. Boundaries are computed on
-- the local wall clock (ms since 1970-01-01 read as if UTC) and turned into instants by the
-- zone; the k-th boundary is the anchor plus k units, the day of the month cut to the month's
-- last. A config's calendar: cal_unit 'm' (months) or 'd' (days), cal_n of them, cal_zone
-- (the zone's name as PostgreSQL spells it) and cal_anchor (a boundary's local time).

-- The zone called tz as PostgreSQL's SET TimeZone finds it (config/zone.rs: pg_tzset), by
-- the name it gives it; NULL and 'UTC' (any case) are UTC. The setting is the function's own:
-- restored when it returns.
CREATE FUNCTION rate_limiter._cal_zone(tz text, inline boolean) RETURNS text
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp SET TimeZone = 'UTC' AS $$
BEGIN
    IF tz IS NULL OR upper(tz) = 'UTC' THEN RETURN 'UTC'; END IF;
    -- PostgreSQL keeps every POSIX-style spec it loads for the process's life, and there is
    -- no end to their spellings: a caller's inline config names a zone of the tz database
    -- (the extension bounds a session's specs; the edition has nowhere to count them).
    IF inline AND NOT EXISTS (SELECT FROM pg_timezone_names z WHERE upper(z.name) = upper(tz)) THEN
        -- A spec gives an offset in digits; a name without one is no zone at all.
        IF tz !~ '[0-9]' THEN
            PERFORM rate_limiter._raise('calendar', format('time zone "%s" is not one PostgreSQL knows', tz));
        END IF;
        PERFORM rate_limiter._raise('edition', format('the time zone spec "%s" in an inline config (name a zone of the tz database, or define the limit by name)', tz));
    END IF;
    -- SET TimeZone also takes hours and intervals, which name no zone.
    IF tz !~* '^\s*(interval|[-+0-9.])' THEN
        BEGIN
            PERFORM set_config('TimeZone', tz, true);
            RETURN current_setting('TimeZone');
        EXCEPTION WHEN invalid_parameter_value THEN
            NULL;
        END;
    END IF;
    PERFORM rate_limiter._raise('calendar', format('time zone "%s" is not one PostgreSQL knows', tz));
END $$;

-- Milliseconds the wall clock of zone is ahead of UTC at utc_ms (pg_localtime's tm_gmtoff at
-- the whole second; 0 where it cannot place the instant).
CREATE FUNCTION rate_limiter._cal_offset(zone text, utc_ms double precision) RETURNS double precision
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp SET TimeZone = 'UTC' AS $$
DECLARE
    seconds float8 := floor(utc_ms / 1000);
BEGIN
    IF zone = 'UTC' THEN RETURN 0; END IF;
    -- Past the instants PostgreSQL can show, the zone's offset a day within them (its rules
    -- change there no more).
    seconds := least(greatest(seconds, -210866803200 + 86400), 9224318016000 - 86400);
    PERFORM set_config('TimeZone', zone, true);
    RETURN extract(timezone FROM to_timestamp(seconds))::float8 * 1000;
END $$;

-- The instant the wall clock of zone shows local_ms: where a change of offset skips that time
-- or shows it twice, the offset in force before the change decides (Zone::utc).
CREATE FUNCTION rate_limiter._cal_utc(zone text, local_ms double precision) RETURNS double precision
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    before float8 := rate_limiter._cal_offset(zone, local_ms - 43200000);
    after float8 := rate_limiter._cal_offset(zone, local_ms + 43200000);
BEGIN
    IF rate_limiter._cal_offset(zone, local_ms - before) = before THEN RETURN local_ms - before; END IF;
    IF rate_limiter._cal_offset(zone, local_ms - after) = after THEN RETURN local_ms - after; END IF;
    RETURN local_ms - before;
END $$;

-- Howard Hinnant's civil calendar in whole days since 1970-01-01 (floor division throughout).
CREATE FUNCTION rate_limiter._days_from_civil(y bigint, m bigint, d bigint) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    yy bigint := CASE WHEN m <= 2 THEN y - 1 ELSE y END;
    era bigint := floor(yy / 400.0);
    yoe bigint := yy - era * 400;
    doy bigint := (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
BEGIN
    RETURN era * 146097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719468;
END $$;

CREATE FUNCTION rate_limiter._civil_from_days(z bigint, OUT y bigint, OUT m bigint, OUT d bigint)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    zz bigint := z + 719468;
    era bigint := floor(zz / 146097.0);
    doe bigint := zz - era * 146097;
    yoe bigint := (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    doy bigint := doe - (365 * yoe + yoe / 4 - yoe / 100);
    mp bigint := (5 * doy + 2) / 153;
BEGIN
    d := doy - (153 * mp + 2) / 5 + 1;
    m := CASE WHEN mp < 10 THEN mp + 3 ELSE mp - 9 END;
    y := yoe + era * 400 + CASE WHEN m <= 2 THEN 1 ELSE 0 END;
END $$;

-- Months since January 1970 of a local time.
CREATE FUNCTION rate_limiter._month_number(local_ms double precision) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    date record := rate_limiter._civil_from_days(floor(local_ms / 86400000)::bigint);
BEGIN
    RETURN date.y * 12 + date.m - 1 - 1970 * 12;
END $$;

-- local_ms plus months on the calendar, the day cut to the month's last, the time kept.
CREATE FUNCTION rate_limiter._add_months(local_ms double precision, months bigint) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    day float8 := floor(local_ms / 86400000);
    date record := rate_limiter._civil_from_days(day::bigint);
    total bigint := date.y * 12 + (date.m - 1) + months;
    y bigint := floor(total / 12.0);
    m bigint := total - floor(total / 12.0)::bigint * 12 + 1;
    last bigint := CASE WHEN m = 2 AND y % 4 = 0 AND (y % 100 <> 0 OR y % 400 = 0) THEN 29 WHEN m = 2 THEN 28
                        WHEN m IN (4, 6, 9, 11) THEN 30 ELSE 31 END;
BEGIN
    RETURN rate_limiter._days_from_civil(y, m, least(date.d, last))::float8 * 86400000 + (local_ms - day * 86400000);
END $$;

-- The instant the k-th window after the anchor's begins (Calendar::boundary).
CREATE FUNCTION rate_limiter._cal_boundary(c rate_limiter._config, k bigint) RETURNS double precision
LANGUAGE sql STABLE PARALLEL UNSAFE
RETURN rate_limiter._cal_utc(c.cal_zone, CASE WHEN c.cal_unit = 'd' THEN c.cal_anchor + k::float8 * c.cal_n::float8 * 86400000::float8
                                              ELSE rate_limiter._add_months(c.cal_anchor, k * c.cal_n) END);

-- Which window at falls in: boundary(k) <= at < boundary(k + 1) (Calendar::index).
CREATE FUNCTION rate_limiter._cal_index(c rate_limiter._config, at double precision) RETURNS bigint
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    clamped float8 := least(greatest(at, -9224318016000000::float8), 9224318016000000::float8);
    local float8 := clamped + rate_limiter._cal_offset(c.cal_zone, clamped);
    k bigint;
BEGIN
    IF c.cal_unit = 'd' THEN
        k := floor((local - c.cal_anchor) / (c.cal_n::float8 * 86400000::float8))::bigint;
    ELSE
        k := floor((rate_limiter._month_number(local) - rate_limiter._month_number(c.cal_anchor)) / c.cal_n::numeric)::bigint;
    END IF;
    -- Off by one at most, near a boundary or a change of offset: a few steps at most.
    FOR i IN 1 .. 4 LOOP
        IF rate_limiter._cal_boundary(c, k) > clamped THEN
            k := k - 1;
        ELSIF rate_limiter._cal_boundary(c, k + 1) <= clamped THEN
            k := k + 1;
        ELSE
            EXIT;
        END IF;
    END LOOP;
    RETURN k;
END $$;

-- The start of the window windows after the one starting at start; infinity past the last
-- instant PostgreSQL can store (Calendar::after).
CREATE FUNCTION rate_limiter._cal_after(c rate_limiter._config, start double precision, windows double precision)
RETURNS double precision
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    k float8 := rate_limiter._cal_index(c, start)::float8 + windows;
BEGIN
    IF k <> k OR k > rate_limiter._cal_index(c, 9224318016000000) THEN RETURN 'Infinity'; END IF;
    RETURN rate_limiter._cal_boundary(c, k::bigint);
END $$;

-- Calendar::new's anchor: a boundary on the local wall clock, start's when given, else the
-- epoch's midnight on the 1st (months, days) or the first Monday (weeks); NULL without a zone.
CREATE FUNCTION rate_limiter._cal_anchor(zone text, unit text, days integer, start double precision) RETURNS double precision
LANGUAGE sql STABLE PARALLEL UNSAFE
RETURN CASE WHEN zone IS NULL THEN NULL
            WHEN start IS NOT NULL THEN start + rate_limiter._cal_offset(zone, start)
            WHEN unit = 'd' AND days = 7 THEN 4::float8 * 86400000::float8
            ELSE 0::float8 END;

-- Config::window_after: the start of the window `windows` after the one starting at start.
CREATE FUNCTION rate_limiter._window_after(c rate_limiter._config, start double precision, windows double precision)
RETURNS double precision
LANGUAGE sql STABLE PARALLEL UNSAFE
RETURN CASE WHEN c.cal_unit IS NULL THEN start + windows * c.period
            WHEN windows > 0 THEN rate_limiter._cal_after(c, start, windows)
            ELSE start END;

-- bucket::Check: what taking `count` from a state at `now` gives.
CREATE TYPE rate_limiter._check AS (
    ok boolean, value double precision, ts double precision, available double precision,
    retry_after double precision, granted_at double precision, reason text, counts double precision[]);

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

-- bucket::END_OF_TIME_MS and storable_debt: what a key may owe without max_reserved.
CREATE FUNCTION rate_limiter._storable_debt(c rate_limiter._config, now double precision) RETURNS double precision
LANGUAGE sql STABLE STRICT PARALLEL UNSAFE
RETURN greatest(((9224318016000000::float8 - now)
                  -- A calendar window is as long as its longest: a month of 31 days, a day of 25 hours.
                  / CASE WHEN c.cal_unit = 'm' THEN greatest(c.cal_n::float8 * 31::float8 * 86400000::float8, c.period)
                         WHEN c.cal_unit = 'd' THEN greatest(c.cal_n::float8 * 86400000::float8 + 3600000::float8, c.period)
                         ELSE c.period END
                  - 2::float8) * c.rate - c.capacity, 0::float8);

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
        r.counts := s.counts;
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

-- bucket::reset_after: ms until a state is full again.
CREATE FUNCTION rate_limiter._reset_after(s rate_limiter._state, c rate_limiter._config, now double precision)
RETURNS double precision
LANGUAGE sql STABLE PARALLEL UNSAFE
RETURN CASE WHEN c.kind = 'sliding window' THEN rate_limiter._sliding_reset_after(s, c, now)
            WHEN c.kind = 'rolling window' THEN rate_limiter._rolling_reset_after(s, c, now)
            WHEN c.capacity - s.value <= 0 THEN 0::float8
            WHEN c.kind = 'token bucket' THEN (c.capacity - s.value) / (c.rate / c.period)
            ELSE greatest(rate_limiter._window_after(c, s.ts, ceil((c.capacity - s.value) / c.rate)) - now, 0::float8) END;

-- bucket::expires: from when the state holds what a fresh one would, checked with _check
-- itself so that rounding only makes it later.
CREATE FUNCTION rate_limiter._expires(s rate_limiter._state, c rate_limiter._config) RETURNS double precision
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    at float8;
    step float8 := CASE c.kind WHEN 'token bucket' THEN 1::float8 WHEN 'rolling window' THEN c.period / c.buckets ELSE c.period END;
    refilled rate_limiter._check;
BEGIN
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
        IF refilled.value >= c.capacity AND at >= s.ts AND refilled.granted_at IS NULL
           AND rate_limiter._last_nonzero(refilled.counts) = 0 THEN
            RETURN at;
        END IF;
        at := at + step;
        step := step * 2;
    END LOOP;
    RETURN 'Infinity'::float8;
END $$;


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
