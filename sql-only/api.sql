-- The SQL surface: the extension's functions, with its signatures, SQLSTATEs, messages and
-- hints (src/error.rs), for what needs no shared memory and no C.

-- A float8 as Rust's Display prints it (the extension's messages): the shortest digits that
-- read back as the same number, never an exponent, no ".0" on whole numbers.
CREATE FUNCTION rate_limiter._display(x double precision) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp SET extra_float_digits = 1 AS $$
DECLARE
    t text;
    m text;
    e int;
    neg boolean;
    digits text;
    point int;
BEGIN
    IF x = 'Infinity'::float8 THEN RETURN 'inf'; END IF;
    IF x = '-Infinity'::float8 THEN RETURN '-inf'; END IF;
    IF x = 'NaN'::float8 THEN RETURN 'NaN'; END IF;
    t := x::text;
    IF t = '-0' THEN RETURN '-0'; END IF;
    IF position('e' IN t) = 0 THEN RETURN t; END IF;
    neg := left(t, 1) = '-';
    m := split_part(ltrim(t, '-'), 'e', 1);
    e := split_part(t, 'e', 2)::int;
    digits := replace(m, '.', '');
    point := coalesce(nullif(position('.' IN m), 0) - 1, length(m)) + e;  -- digits before the point
    IF point <= 0 THEN
        t := '0.' || repeat('0', -point) || digits;
    ELSIF point >= length(digits) THEN
        t := digits || repeat('0', point - length(digits));
    ELSE
        t := left(digits, point) || '.' || substr(digits, point + 1);
    END IF;
    RETURN CASE WHEN neg THEN '-' ELSE '' END || t;
END $$;

-- A float8 as Rust's {:.2} prints it: its exact binary value rounded half to even at two
-- decimals (the bits, read from float8send, as m * 2^e, are exact in numeric).
CREATE FUNCTION rate_limiter._display2(x double precision) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    bits bytea := float8send(x);
    raw numeric := 0;
    exponent int;
    mantissa numeric;
    exact numeric;
    scaled numeric;
    whole numeric;
    rest numeric;
BEGIN
    FOR i IN 0 .. 7 LOOP raw := raw * 256 + get_byte(bits, i); END LOOP;
    exponent := (floor(raw / 4503599627370496) % 2048)::int;
    mantissa := raw % 4503599627370496;
    IF exponent > 0 THEN mantissa := mantissa + 4503599627370496; END IF;
    exponent := greatest(exponent, 1) - 1075;
    -- x * 100 exactly, then rounded half to even.
    IF exponent >= 0 THEN
        scaled := mantissa * (2::numeric ^ exponent) * 100;
        rest := 0;
        whole := scaled;
    ELSE
        -- mantissa * 100 / 2^-exponent: the integer part and the exact remainder's size.
        whole := floor(mantissa * 100 / (2::numeric ^ (-exponent)));
        rest := mantissa * 100 - whole * (2::numeric ^ (-exponent));
        IF rest * 2 > 2::numeric ^ (-exponent) OR (rest * 2 = 2::numeric ^ (-exponent) AND whole % 2 = 1) THEN
            whole := whole + 1;
        END IF;
    END IF;
    RETURN CASE WHEN x < 0 OR (x = 0 AND left(x::text, 1) = '-') THEN '-' ELSE '' END
        || (floor(whole / 100))::text || '.' || lpad((whole % 100)::text, 2, '0');
END $$;

-- A text as Rust's Debug prints it: quoted, with \, " and control characters escaped.
CREATE FUNCTION rate_limiter._debug(t text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    out text := '"';
    code int;
BEGIN
    FOR i IN 1 .. length(t) LOOP
        code := ascii(substr(t, i, 1));
        out := out || CASE WHEN code = 92 THEN '\\' WHEN code = 34 THEN '\"' WHEN code = 9 THEN '\t'
                           WHEN code = 13 THEN '\r' WHEN code = 10 THEN '\n'
                           WHEN code < 32 OR code BETWEEN 127 AND 159 THEN '\u{' || to_hex(code) || '}'
                           ELSE substr(t, i, 1) END;
    END LOOP;
    RETURN out || '"';
END $$;

-- The shapes of src/error.rs: each raises its SQLSTATE with the extension's message and hint.
CREATE FUNCTION rate_limiter._raise(kind text, message text, detail text DEFAULT NULL, extra text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    CASE kind
    WHEN 'argument' THEN
        RAISE EXCEPTION 'invalid rate limit argument: %', message USING ERRCODE = '22023',
            HINT = 'name must be a non-empty text of at most 128 bytes other than *other*, key at most 1024 bytes, count a finite number >= 0; rate_limit_all takes at most 1000 limits.';
    WHEN 'config' THEN
        RAISE EXCEPTION 'invalid rate limit config: %', message USING ERRCODE = '22023',
            HINT = 'A config looks like {"kind": "token bucket", "rate": 10, "period": 60000}: kind ''token bucket'', ''fixed window'', ''sliding window'', ''rolling window'' or ''concurrency'', rate > 0, period > 0 (ms or interval text), optional capacity >= 0, maxReserved >= 0, shards >= 1, start (ms since epoch).';
    WHEN 'slots' THEN
        RAISE EXCEPTION 'not supported: %', message USING ERRCODE = '0A000',
            HINT = 'A concurrency limit (kind ''concurrency'', rate = the most slots held at once, 1 to 1000) is taken with rate_limit or acquire (a slot until the transaction ends, or a lease) and given back by the transaction''s end or release(). It has no reservations, credit, shards, modes, minGap, lockTimeout, denyCache or hot, takes no part in rate_limit_all, and counts whole slots; acquire, release and renew take only a concurrency limit.';
    WHEN 'malformed' THEN
        RAISE EXCEPTION 'malformed rate limit config: %', message USING ERRCODE = '22P02',
            HINT = 'A config looks like {"kind": "token bucket", "rate": 10, "period": 60000}: kind ''token bucket'', ''fixed window'', ''sliding window'', ''rolling window'' or ''concurrency'', rate > 0, period > 0 (ms or interval text), optional capacity >= 0, maxReserved >= 0, shards >= 1, start (ms since epoch).';
    WHEN 'range' THEN
        RAISE EXCEPTION 'rate limit number out of range: %', message USING ERRCODE = '22023',
            HINT = 'rate, capacity, maxReserved, a count and a credit are at most 1e15; a period is 1 ms to 100 years, minGap and denyCache at most 100 years, lockTimeout at most 2147483647 ms (as PostgreSQL''s lock_timeout); a rolling window''s cells are at least 1 ms (period / buckets); a lease at most rate_limiter.max_lease (a day unless a superuser set it longer). A limit defined before these bounds: define it again within them.';
    WHEN 'calendar' THEN
        RAISE EXCEPTION 'invalid calendar window: %', message USING ERRCODE = '22023',
            HINT = 'A fixed window whose period is whole months (''1 month'', ''3 months'', ''1 year''), ''1 day'' or ''1 week'' starts its windows on the calendar, in the time zone tz (default UTC; a name PostgreSQL knows, such as ''Europe/Berlin''), at start''s day and time when given. The other kinds count fixed lengths: give them one, such as ''30 days''. Inline configs of one session may name at most 100 POSIX-style zone specs (such as ''<+03>-3''); zones of the tz database, and named limits'' zones, are never counted.';
    WHEN 'unknown' THEN
        RAISE EXCEPTION 'rate limit "%" does not exist', message USING ERRCODE = '42704',
            HINT = 'Define it with rate_limiter.define(name, kind, rate, period) or pass config => ''{...}''::jsonb.';
    WHEN 'unknown_tier' THEN
        RAISE EXCEPTION 'tier "%" of rate limit "%" does not exist', message, detail USING ERRCODE = '42704',
            HINT = 'Define it with rate_limiter.define_tier(name, tier, rate => ..., period => ...).';
    WHEN 'tier_in_use' THEN
        RAISE EXCEPTION 'tier "%" of rate limit "%" is named by % override(s)', message, detail, extra USING ERRCODE = '23503',
            HINT = 'Move those keys to another tier or their own numbers with rate_limiter.override(), or remove_override() them, first.';
    WHEN 'count' THEN
        RAISE EXCEPTION '%', message USING ERRCODE = '22023', DETAIL = detail,
            HINT = 'No call can take more than the capacity (plus max_reserved when reserving); raise capacity or split the work into smaller counts.';
    WHEN 'time' THEN
        RAISE EXCEPTION 'instant out of range: %', message USING ERRCODE = '22008',
            HINT = 'Instants must lie between 4714 BC and 294276 AD: use a finite start and rate_limiter.fake_now, and a period that keeps windows inside that range.';
    WHEN 'unsupported' THEN
        RAISE EXCEPTION 'not supported: %', message USING ERRCODE = '0A000',
            HINT = 'Reservations (reserve => true, maxReserved) need a token bucket or a fixed window in mode ''all''; minGap, modes other than ''all'', lockTimeout and denyCache need shards = 1; denyCache needs mode ''all''; rate_limit_all takes limits in mode ''all'' only. A hot limit is named, shards = 1, mode ''all'', without minGap or lockTimeout, and takes no credit and no part in rate_limit_all. A memory limit (durable false) is a token bucket, fixed or sliding window, shards = 1, mode ''all'', without minGap or lockTimeout. A limit in shadow mode (enforce false) takes no part in rate_limit_all either: call it on its own, or SET rate_limiter.shadow for the whole call.';
    WHEN 'planted' THEN
        RAISE EXCEPTION 'rate_limiter will not write %: it has %, which the extension did not create', message, detail
            USING ERRCODE = '55000',
            HINT = 'The extension writes its tables with its owner''s rights, which a trigger or rule on them would run with. Drop it (DROP TRIGGER ... ON the table), and grant no TRIGGER on the extension''s tables (docs/security.md).';
    WHEN 'write_denied' THEN
        RAISE EXCEPTION 'permission denied to limit the writes of %', message USING ERRCODE = '42501',
            HINT = 'limit_writes and unlimit_writes change the table''s triggers, which charge the limit with the extension''s rights for whoever writes: run them as the table''s owner (or a member of its role), granted EXECUTE on rate_limiter.rate_limit.';
    WHEN 'write_column' THEN
        RAISE EXCEPTION 'a write limit''s column: %', message USING ERRCODE = '42703',
            HINT = 'key names a column of the table of a type whose text no setting changes (text, integers, numeric, uuid, boolean, network addresses, enums; NULL is one key of its own) and count a column of an integer, numeric or floating-point type (each row counts 1 without it). For an expression, add a generated column (GENERATED ALWAYS AS (...) STORED) and name it.';
    WHEN 'snapshot_blind' THEN
        RAISE EXCEPTION 'rate_limiter will not write % in a % transaction: another role may create triggers on it', message, detail
            USING ERRCODE = '55000',
            HINT = 'The edition writes its tables with its owner''s rights; outside READ COMMITTED it reads the catalog as of the transaction''s snapshot and could miss a trigger created since. REVOKE TRIGGER, REFERENCES ON the table FROM every other role (docs/security.md), or call it in a READ COMMITTED transaction.';
    WHEN 'isolation' THEN
        RAISE EXCEPTION 'not supported: % in a % transaction in the SQL-only edition', message, detail USING ERRCODE = '0A000',
            HINT = 'remove_tier() and a DELETE or TRUNCATE of rate_limiter.limits must see an override() that commits while they wait for it, which only a READ COMMITTED statement does in SQL: run it in a READ COMMITTED transaction.';
    WHEN 'edition' THEN
        -- What only the compiled extension does: shared memory, C, the background worker.
        RAISE EXCEPTION 'not supported: % in the SQL-only edition', message USING ERRCODE = '0A000',
            HINT = 'The SQL-only edition keeps every kind of limit, named or inline, sharded or not, in every mode, but hot and memory limits; the rest needs the rate_limiter extension (CREATE EXTENSION rate_limiter), see sql-only/README.md.';
    END CASE;
END $$;

-- Whether a setting's text is a boolean false as PostgreSQL reads one ('off', 'no', 'f', ...).
CREATE FUNCTION rate_limiter._is_false(v text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN NOT v::boolean;
EXCEPTION WHEN invalid_text_representation THEN
    RETURN false;
END $$;

-- now in ms: the real clock (clock_timestamp(), as the extension's GetCurrentTimestamp), or
-- rate_limiter.fake_now for a superuser or the database's owner. Without the library the
-- setting is anyone's to set: for anyone else it is refused, never taken.
CREATE FUNCTION rate_limiter._now() RETURNS double precision
LANGUAGE plpgsql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    fake text := current_setting('rate_limiter.fake_now', true);
    shadow text := coalesce(current_setting('rate_limiter.shadow', true), '');
    -- The caller's active role: SET ROLE's, else the login's (SECURITY DEFINER changes neither).
    caller name := CASE current_setting('role') WHEN 'none' THEN session_user ELSE current_setting('role') END;
    at timestamptz;
BEGIN
    IF shadow <> '' AND NOT rate_limiter._is_false(shadow) THEN
        PERFORM rate_limiter._raise('edition', 'the session setting rate_limiter.shadow (define a limit with enforce => false)');
    END IF;
    IF coalesce(fake, '') = '' THEN
        RETURN rate_limiter._ms(clock_timestamp());
    END IF;
    IF NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = caller)
       AND NOT pg_catalog.pg_has_role(caller, (SELECT d.datdba FROM pg_catalog.pg_database d
                                               WHERE d.datname = current_database()), 'MEMBER') THEN
        RAISE EXCEPTION 'permission denied to set rate_limiter.fake_now' USING ERRCODE = '42501',
            HINT = 'rate_limiter.fake_now moves the limiter''s clock: only superusers and the database''s owner may set it (RESET rate_limiter.fake_now).';
    END IF;
    at := fake::timestamptz;
    IF NOT isfinite(at) THEN
        PERFORM rate_limiter._raise('time', 'rate_limiter.fake_now must be a finite timestamp');
    END IF;
    RETURN rate_limiter._ms(at);
END $$;

-- valid_name and valid_key of src/call.rs.
CREATE FUNCTION rate_limiter._valid_name(name text) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF name IS NULL THEN PERFORM rate_limiter._raise('argument', 'name must not be NULL'); END IF;
    IF name = '' THEN PERFORM rate_limiter._raise('argument', 'name must not be empty'); END IF;
    IF octet_length(name) > 128 THEN
        PERFORM rate_limiter._raise('argument', format('name is %s bytes, more than 128', octet_length(name)));
    END IF;
    IF name = '*other*' THEN PERFORM rate_limiter._raise('argument', 'the name *other* is reserved'); END IF;
    IF octet_length(name) > 33 AND right(name, 33) ~ '^#[0-9a-f]{32}$' THEN
        PERFORM rate_limiter._raise('argument', format('a name ending in ''#'' and 32 hex digits is reserved, not %s', rate_limiter._debug(name)));
    END IF;
END $$;

-- An interval as ms, as clock::interval_ms: a year 365.25 days, a month 30, in float8 in its
-- order of operations.
CREATE FUNCTION rate_limiter._interval_ms(i interval) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    months float8 := (extract(year FROM i) * 12 + extract(month FROM i))::float8;
    micros float8 := ((extract(hour FROM i) * 3600 + extract(minute FROM i) * 60) * 1000000 + extract(microseconds FROM i))::float8;
    days float8 := extract(day FROM i)::float8 + trunc(months / 12::float8) * 365.25::float8
                   + (months - trunc(months / 12::float8) * 12::float8) * 30::float8;
BEGIN
    RETURN days * 86400000::float8 + micros / 1000::float8;
END $$;
