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
