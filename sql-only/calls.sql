-- define, the calls, and the administrator's calls of the edition.

-- 25006 as PreventCommandIfReadOnly raises it (a READ ONLY transaction, a hot standby).
CREATE FUNCTION rate_limiter._writable(command text, VARIADIC tables regclass[]) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t regclass;
    planted text;
BEGIN
    IF current_setting('transaction_read_only') = 'on' THEN
        RAISE EXCEPTION 'cannot execute % in a read-only transaction', command USING ERRCODE = '25006';
    END IF;
    -- The write to come runs with the owner's rights, as would a trigger or rule on the table
    -- (one a role with TRIGGER on it planted): refused, as the extension refuses it. Locked
    -- first, so that none is planted between this look and the write. The edition's two
    -- triggers are known by their whole shape: its function alone, run BEFORE each row (which
    -- skips the row) or with a WHEN of the planter's (run with the owner's rights), would not do.
    FOREACH t IN ARRAY tables LOOP
        EXECUTE format('LOCK TABLE %s IN ROW EXCLUSIVE MODE', t);
        IF (SELECT c.relhastriggers OR c.relhasrules FROM pg_class c WHERE c.oid OPERATOR(pg_catalog.=) t) THEN
            SELECT format('trigger "%s"', g.tgname) INTO planted FROM pg_trigger g
            WHERE g.tgrelid OPERATOR(pg_catalog.=) t
              AND NOT (g.tgrelid OPERATOR(pg_catalog.=) 'rate_limiter.limits'::regclass
                       AND ((g.tgname OPERATOR(pg_catalog.=) 'limits_hold_slot_calls_off'
                             AND g.tgfoid OPERATOR(pg_catalog.=) 'rate_limiter._hold_slot_calls_off()'::regprocedure
                             AND g.tgtype OPERATOR(pg_catalog.=) 62)
                         OR (g.tgname OPERATOR(pg_catalog.=) 'limits_keep_overrides'
                             AND g.tgfoid OPERATOR(pg_catalog.=) 'rate_limiter._overrides_follow_their_limit()'::regprocedure
                             AND g.tgtype OPERATOR(pg_catalog.=) 56))
                       AND g.tgqual IS NULL AND g.tgnargs OPERATOR(pg_catalog.=) 0 AND NOT g.tgisinternal)
            ORDER BY g.tgname LIMIT 1;
            IF planted IS NULL THEN
                SELECT format('a rule (pg_rewrite oid %s)', r.oid) INTO planted
                FROM pg_rewrite r WHERE r.ev_class OPERATOR(pg_catalog.=) t ORDER BY r.oid LIMIT 1;
            END IF;
            IF planted IS NOT NULL THEN
                PERFORM rate_limiter._raise('planted', t::text, planted);
            END IF;
        END IF;
        -- In REPEATABLE READ and SERIALIZABLE the catalog is read as of the transaction's
        -- snapshot, which a trigger created since is not in (the write would fire it): a
        -- table another role may create triggers on is then refused.
        IF current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' AND EXISTS (
            SELECT FROM pg_class c, aclexplode(c.relacl) a
            WHERE c.oid OPERATOR(pg_catalog.=) t AND a.privilege_type IN ('TRIGGER', 'REFERENCES')
              AND a.grantee OPERATOR(pg_catalog.<>) c.relowner) THEN
            PERFORM rate_limiter._raise('snapshot_blind', t::text, current_setting('transaction_isolation'));
        END IF;
    END LOOP;
END $$;

-- config::within: 22023 unless low <= v <= high.
CREATE FUNCTION rate_limiter._within(what text, v double precision, low double precision, high double precision, unit text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT (v >= low AND v <= high) THEN
        PERFORM rate_limiter._raise('range', format('%s must be between %s%s and %s%s, not %s%s', what,
            rate_limiter._display(low), unit, rate_limiter._display(high), unit, rate_limiter._display(v), unit));
    END IF;
END $$;

-- The config of a limits row, checked as Config::try_from and config::validate check it (the
-- same errors in the same order); then what only the extension does is refused (0A000).
CREATE FUNCTION rate_limiter._config_of(l rate_limiter.limits) RETURNS rate_limiter._config
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c rate_limiter._config;
    months int := (extract(year FROM l.period) * 12 + extract(month FROM l.period))::int;
    days int := extract(day FROM l.period)::int;
    micros numeric := (extract(hour FROM l.period) * 3600 + extract(minute FROM l.period) * 60) * 1000000
                      + extract(microseconds FROM l.period);
    calendar boolean := false;
    zone text;
    start float8 := rate_limiter._ms(l.start);
    lock_timeout float8 := rate_limiter._interval_ms(l.lock_timeout);
    deny_cache float8 := rate_limiter._interval_ms(l.deny_cache);
BEGIN
    IF l.shards < 0 THEN PERFORM rate_limiter._raise('config', format('shards must be >= 1, not %s', l.shards)); END IF;
    IF l.kind NOT IN ('token bucket', 'fixed window', 'sliding window', 'rolling window', 'concurrency') THEN
        PERFORM rate_limiter._raise('config', format('unknown kind "%s" (expected "token bucket", "fixed window", "sliding window", "rolling window" or "concurrency")', l.kind));
    END IF;
    IF l.buckets IS NOT NULL AND NOT l.buckets BETWEEN 1 AND 64 THEN
        PERFORM rate_limiter._raise('config', format('buckets must be an integer between 1 and 64, not %s', l.buckets));
    END IF;
    IF months <> 0 AND l.kind <> 'fixed window' THEN
        PERFORM rate_limiter._raise('calendar', format('a %s counts a fixed length, and a period of months ''%s'' has none', l.kind, l.period));
    END IF;
    IF l.kind = 'fixed window' THEN
        IF months <> 0 AND NOT (months > 0 AND days = 0 AND micros = 0) THEN
            PERFORM rate_limiter._raise('calendar', format('a calendar period is whole months, ''1 day'' or ''1 week'', not ''%s''', l.period));
        END IF;
        calendar := (months > 0 AND days = 0 AND micros = 0) OR (months = 0 AND days IN (1, 7) AND micros = 0);
    END IF;
    IF l.tz IS NOT NULL AND NOT calendar THEN
        PERFORM rate_limiter._raise('calendar', format('tz is for a fixed window of whole months, ''1 day'' or ''1 week'', not a %s of''%s''', l.kind, l.period));
    END IF;
    IF calendar THEN zone := rate_limiter._cal_zone(l.tz, false); END IF;
    IF l.mode NOT IN ('all', 'partial', 'penalize') THEN
        PERFORM rate_limiter._raise('config', format('unknown mode "%s" (expected "all", "partial" or "penalize")', l.mode));
    END IF;
    IF l.buckets IS NOT NULL AND l.kind <> 'rolling window' THEN
        PERFORM rate_limiter._raise('config', 'buckets applies only to a rolling window');
    END IF;
    IF l.on_lock_timeout NOT IN ('deny', 'allow') THEN
        PERFORM rate_limiter._raise('config', format('unknown on_lock_timeout "%s" (expected "deny" or "allow")', l.on_lock_timeout));
    END IF;
    c := ROW(l.kind, l.rate, rate_limiter._interval_ms(l.period), coalesce(l.capacity, l.rate), l.max_reserved,
             start, rate_limiter._interval_ms(l.min_gap),
             CASE WHEN l.kind = 'rolling window' THEN coalesce(l.buckets, 10) ELSE 0 END, l.mode,
             CASE WHEN calendar THEN CASE WHEN months > 0 THEN 'm' ELSE 'd' END END,
             CASE WHEN calendar THEN CASE WHEN months > 0 THEN months ELSE days END END,
             zone, rate_limiter._cal_anchor(zone, CASE WHEN months > 0 THEN 'm' ELSE 'd' END, days, start), l.shards, false)::rate_limiter._config;
    RETURN rate_limiter._validate(c, l.shards, lock_timeout, deny_cache, l.start IS NULL OR isfinite(l.start), l.hot, l.durable);
END $$;

-- config::validate, then what only the extension does refused (0A000): for a named limit's
-- row and an inline config alike.
CREATE FUNCTION rate_limiter._validate(c rate_limiter._config, shards integer, lock_timeout double precision,
    deny_cache double precision, start_storable boolean, hot boolean, durable boolean)
RETURNS rate_limiter._config
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT (c.rate > 0 AND c.rate < 'Infinity') THEN
        PERFORM rate_limiter._raise('config', format('rate must be a finite number > 0, not %s', rate_limiter._display(c.rate)));
    END IF;
    IF NOT (c.period > 0 AND c.period < 'Infinity') THEN
        PERFORM rate_limiter._raise('config', format('period must be a finite number > 0, not %s', rate_limiter._display(c.period)));
    END IF;
    IF NOT (c.capacity >= 0 AND c.capacity < 'Infinity') THEN
        PERFORM rate_limiter._raise('config', format('capacity must be a finite number >= 0, not %s', rate_limiter._display(c.capacity)));
    END IF;
    IF c.max_reserved IS NOT NULL AND NOT (c.max_reserved >= 0 AND c.max_reserved < 'Infinity') THEN
        PERFORM rate_limiter._raise('config', format('maxReserved must be a finite number >= 0, not %s', rate_limiter._display(c.max_reserved)));
    END IF;
    PERFORM rate_limiter._within('rate', c.rate, 0, 1e15, '');
    PERFORM rate_limiter._within('capacity', c.capacity, 0, 1e15, '');
    PERFORM rate_limiter._within('maxReserved', coalesce(c.max_reserved, 0), 0, 1e15, '');
    PERFORM rate_limiter._within('period', c.period, 1, 3155760000000, ' ms');
    IF c.kind = 'rolling window' THEN
        PERFORM rate_limiter._within('a rolling window''s cell (period / buckets)', c.period / greatest(c.buckets, 1), 1, 3155760000000, ' ms');
    END IF;
    PERFORM rate_limiter._within('minGap', coalesce(c.min_gap, 0), 0, 3155760000000, ' ms');
    PERFORM rate_limiter._within('denyCache', coalesce(deny_cache, 0), 0, 3155760000000, ' ms');
    PERFORM rate_limiter._within('lockTimeout', coalesce(lock_timeout, 0), 0, 2147483647, ' ms');
    IF NOT shards BETWEEN 1 AND 1024 THEN
        PERFORM rate_limiter._raise('config', format('shards must be between 1 and 1024, not %s', shards));
    END IF;
    -- A cached denial would skip what a denial does besides denying (ignored here, but the
    -- extension's config all the same).
    IF deny_cache IS NOT NULL AND c.mode <> 'all' THEN
        PERFORM rate_limiter._raise('unsupported', format('denyCache with mode ''%s''', c.mode));
    END IF;
    -- Settings that need one row per key: a sharded call spreads a key over rows.
    IF shards > 1 AND (c.min_gap IS NOT NULL OR c.mode <> 'all' OR lock_timeout IS NOT NULL OR deny_cache IS NOT NULL) THEN
        PERFORM rate_limiter._raise('unsupported', format('%s needs one row per key: use shards = 1',
            CASE WHEN c.min_gap IS NOT NULL THEN 'minGap' WHEN c.mode <> 'all' THEN format('mode ''%s''', c.mode)
                 WHEN lock_timeout IS NOT NULL THEN 'lockTimeout' ELSE 'denyCache' END));
    END IF;
    -- What the edition does not do, where the extension checks it (its further checks of
    -- these are its own).
    IF hot THEN
        PERFORM rate_limiter._raise('edition', 'hot limits (an escrow in shared memory)');
    ELSIF NOT durable THEN
        PERFORM rate_limiter._raise('edition', 'memory limits (durable => false: counts in shared memory)');
    END IF;
    IF c.kind = 'concurrency' THEN
        IF c.rate <> trunc(c.rate) OR c.rate > 1000 THEN
            PERFORM rate_limiter._raise('range', format('a concurrency limit holds a whole number of slots, 1 to 1000: rate must be one, not %s', rate_limiter._display(c.rate)));
        END IF;
        IF shards > 1 OR c.min_gap IS NOT NULL OR c.mode <> 'all' OR lock_timeout IS NOT NULL OR deny_cache IS NOT NULL THEN
            PERFORM rate_limiter._raise('slots', format('a concurrency limit with %s',
                CASE WHEN shards > 1 THEN 'shards > 1 (its slots are one set per key)' WHEN c.min_gap IS NOT NULL THEN 'minGap'
                     WHEN c.mode <> 'all' THEN 'a mode other than ''all'' (a slot is held or not)'
                     WHEN lock_timeout IS NOT NULL THEN 'lockTimeout (a call never waits for a slot another holds)'
                     ELSE 'denyCache (a slot frees whenever its holder ends)' END));
        END IF;
    END IF;
    IF c.kind IN ('sliding window', 'rolling window', 'concurrency') THEN
        IF c.capacity <> c.rate THEN
            PERFORM rate_limiter._raise('config', format('a %s holds rate tokens: capacity must be NULL or equal to rate (%s), not %s',
                c.kind, rate_limiter._display(c.rate), rate_limiter._display(c.capacity)));
        END IF;
        IF c.max_reserved IS NOT NULL THEN
            PERFORM rate_limiter._raise('unsupported', format('a %s has no reservations: leave maxReserved out', c.kind));
        END IF;
    END IF;
    IF c.start IS NOT NULL AND c.kind = 'token bucket' THEN
        PERFORM rate_limiter._raise('config', 'start applies only to a fixed, sliding or rolling window');
    END IF;
    IF c.start IS NOT NULL AND NOT start_storable THEN
        PERFORM rate_limiter._raise('time', format('start must be a finite instant PostgreSQL can store, not %s ms since the epoch', rate_limiter._display(c.start)));
    END IF;
    RETURN c;
END $$;

CREATE FUNCTION rate_limiter.define(name text, kind text, rate double precision, period interval,
    capacity double precision DEFAULT NULL, max_reserved double precision DEFAULT NULL, shards integer DEFAULT 1,
    start timestamptz DEFAULT NULL, min_gap interval DEFAULT NULL, mode text DEFAULT 'all', buckets integer DEFAULT NULL,
    lock_timeout interval DEFAULT NULL, on_lock_timeout text DEFAULT 'deny', deny_cache interval DEFAULT NULL,
    hot boolean DEFAULT false, enforce boolean DEFAULT true, tz text DEFAULT NULL, durable boolean DEFAULT true)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    l rate_limiter.limits;
BEGIN
    PERFORM rate_limiter._writable('define()', 'rate_limiter.limits');
    PERFORM rate_limiter._valid_name(name);
    IF kind IS NULL THEN PERFORM rate_limiter._raise('config', 'kind must not be NULL'); END IF;
    IF rate IS NULL THEN PERFORM rate_limiter._raise('config', 'rate must not be NULL'); END IF;
    IF period IS NULL THEN PERFORM rate_limiter._raise('config', 'period must not be NULL'); END IF;
    IF shards IS NULL THEN PERFORM rate_limiter._raise('config', 'shards must not be NULL'); END IF;
    IF mode IS NULL THEN PERFORM rate_limiter._raise('config', 'mode must not be NULL'); END IF;
    IF on_lock_timeout IS NULL THEN PERFORM rate_limiter._raise('config', 'on_lock_timeout must not be NULL'); END IF;
    IF hot IS NULL THEN PERFORM rate_limiter._raise('config', 'hot must not be NULL'); END IF;
    IF enforce IS NULL THEN PERFORM rate_limiter._raise('config', 'enforce must not be NULL'); END IF;
    IF durable IS NULL THEN PERFORM rate_limiter._raise('config', 'durable must not be NULL'); END IF;
    l := ROW(name, kind, rate, period, capacity, max_reserved, shards, start, min_gap, mode, buckets, lock_timeout,
             on_lock_timeout, deny_cache, hot, enforce, tz, durable)::rate_limiter.limits;
    PERFORM rate_limiter._config_of(l);
    INSERT INTO rate_limiter.limits AS o VALUES (l.*)
    ON CONFLICT ON CONSTRAINT limits_pkey DO UPDATE SET kind = excluded.kind, rate = excluded.rate, period = excluded.period,
        capacity = excluded.capacity, max_reserved = excluded.max_reserved, shards = excluded.shards,
        start = excluded.start, min_gap = excluded.min_gap, mode = excluded.mode, buckets = excluded.buckets,
        lock_timeout = excluded.lock_timeout, on_lock_timeout = excluded.on_lock_timeout,
        deny_cache = excluded.deny_cache, hot = excluded.hot, enforce = excluded.enforce, tz = excluded.tz,
        durable = excluded.durable;
    PERFORM rate_limiter._overrides_fit(l);
END $$;
COMMENT ON FUNCTION rate_limiter.define IS 'Create or replace a named limit in rate_limiter.limits.';

-- valid_key of src/call.rs: a NULL key is the shared one.
CREATE FUNCTION rate_limiter._valid_key(key text) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF octet_length(key) > 1024 THEN
        PERFORM rate_limiter._raise('argument', format('key is %s bytes, more than 1024; hash long keys first', octet_length(key)));
    END IF;
END $$;

-- The checks of a call's count, name and key (src/api/mod.rs request), in that order.
CREATE FUNCTION rate_limiter._arguments(name text, key text, count double precision) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF count IS NULL THEN PERFORM rate_limiter._raise('argument', 'count must not be NULL'); END IF;
    IF NOT (count >= 0 AND count < 'Infinity') THEN
        PERFORM rate_limiter._raise('argument', format('count must be a finite number >= 0, not %s', rate_limiter._display(count)));
    END IF;
    IF count > 1e15 THEN
        PERFORM rate_limiter._raise('range', format('count must be at most 1000000000000000, not %s', rate_limiter._display(count)));
    END IF;
    PERFORM rate_limiter._valid_name(name);
    PERFORM rate_limiter._valid_key(key);
END $$;

-- A named limit's config and shadow setting (42704 when there is none); an inline config is
-- the extension's.
-- The limit a call is judged under: the inline config when given, else the named limit's
-- (42704 when there is none); its shadow setting and deny cache; and where its state lives:
-- the rows named `stored`, with shard `shard` (an inline config's rows are the name marked
-- with the config's fingerprint, at shard -1: limiter/rows.rs, storage/row.rs). Its numbers
-- are `key`'s override's while one is in force, which may exempt the key.
CREATE FUNCTION rate_limiter._named(name text, key text, config jsonb, OUT c rate_limiter._config, OUT enforce boolean,
                                    OUT deny_cache double precision, OUT stored text, OUT shard integer,
                                    OUT lock_timeout double precision, OUT on_lock_timeout text, OUT exempt boolean)
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    l rate_limiter.limits;
    inline record;
    overridden record;
BEGIN
    exempt := false;
    IF config IS NOT NULL THEN
        inline := rate_limiter._config_of_json(config);
        c := inline.c;
        enforce := inline.enforce;
        deny_cache := inline.deny_cache;
        lock_timeout := inline.lock_timeout;
        on_lock_timeout := inline.on_lock_timeout;
        stored := name || '#' || rate_limiter._fingerprint(c);
        shard := -1;
        -- The key's override under that name, in force: its numbers in place of the call's
        -- own, counted by the call's own fingerprint all the same (overrides.rs inline_config_for).
        overridden := rate_limiter._override_numbers(name, key);
        IF overridden.in_force THEN
            IF c.kind = 'concurrency' THEN
                PERFORM rate_limiter._raise('unsupported', format('an override of "%s" for an inline concurrency config: define the limit by name and call it so', name));
            END IF;
            c := (rate_limiter._config_of_json(rate_limiter._in_json(config, overridden.rate, overridden.period,
                  overridden.capacity, overridden.max_reserved, overridden.min_gap))).c;
            exempt := overridden.exempt;
        END IF;
        RETURN;
    END IF;
    SELECT * INTO l FROM rate_limiter.limits AS x WHERE x.name = _named.name;
    IF NOT FOUND THEN PERFORM rate_limiter._raise('unknown', name); END IF;
    overridden := rate_limiter._overridden(l, key);
    c := rate_limiter._config_of(overridden.applied);
    exempt := overridden.exempt;
    enforce := l.enforce;
    deny_cache := rate_limiter._interval_ms(l.deny_cache);
    lock_timeout := rate_limiter._interval_ms(l.lock_timeout);
    on_lock_timeout := l.on_lock_timeout;
    stored := name;
    shard := 0;
END $$;

-- An inline config, read as config::from_json reads it (its members in byte order, each
-- checked as it comes; then what is missing, a rolling window's cells, the calendar), then
-- validated as a named limit's.
CREATE FUNCTION rate_limiter._config_of_json(config jsonb, OUT c rate_limiter._config, OUT enforce boolean,
                                             OUT deny_cache double precision, OUT lock_timeout double precision,
                                             OUT on_lock_timeout text)
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    m record;
    kind text;
    rate float8;
    period float8;
    period_interval interval;
    capacity float8;
    max_reserved float8;
    shards integer;
    start float8;
    min_gap float8;
    mode text;
    buckets integer;
    durable boolean;
    tz text;
    n float8;
    months int;
    days int;
    micros numeric;
    unit boolean := false;
    zone text;
    shown text;
    us float8;
BEGIN
    IF jsonb_typeof(config) <> 'object' THEN
        PERFORM rate_limiter._raise('malformed', format('expected a JSON object, got %s', rate_limiter._json_text(config)));
    END IF;
    enforce := true;
    on_lock_timeout := 'deny';
    FOR m IN SELECT e.key AS field, e.value AS v, jsonb_typeof(e.value) AS type, e.value #>> '{}' AS text
             FROM jsonb_each(config) e ORDER BY e.key COLLATE "C" LOOP
        -- An optional member given as null is left out (kind, rate and period need a value).
        CONTINUE WHEN m.type = 'null' AND m.field IN ('capacity', 'maxReserved', 'max_reserved', 'shards', 'start', 'minGap',
            'min_gap', 'mode', 'buckets', 'lockTimeout', 'lock_timeout', 'onLockTimeout', 'on_lock_timeout', 'denyCache',
            'deny_cache', 'enforce', 'hot', 'durable');
        CASE
        WHEN m.field = 'kind' THEN
            IF m.type <> 'string' THEN PERFORM rate_limiter._raise('malformed', format('"%s" must be a string, got %s', m.field, rate_limiter._json_text(m.v))); END IF;
            IF m.text NOT IN ('token bucket', 'fixed window', 'sliding window', 'rolling window', 'concurrency') THEN
                PERFORM rate_limiter._raise('config', format('unknown kind "%s" (expected "token bucket", "fixed window", "sliding window", "rolling window" or "concurrency")', m.text));
            END IF;
            kind := m.text;
        WHEN m.field IN ('rate', 'capacity', 'maxReserved', 'max_reserved', 'shards', 'buckets') THEN
            IF m.type <> 'number' THEN PERFORM rate_limiter._raise('malformed', format('"%s" must be a number, got %s', m.field, rate_limiter._json_text(m.v))); END IF;
            n := m.text::float8;
            CASE m.field
            WHEN 'rate' THEN rate := n;
            WHEN 'capacity' THEN capacity := n;
            WHEN 'shards' THEN
                IF n <> trunc(n) OR NOT n BETWEEN 1 AND 1024 THEN
                    PERFORM rate_limiter._raise('config', format('shards must be an integer between 1 and 1024, not %s', rate_limiter._display(n)));
                END IF;
                shards := n::integer;
            WHEN 'buckets' THEN
                IF n <> trunc(n) OR NOT n BETWEEN 1 AND 64 THEN
                    PERFORM rate_limiter._raise('config', format('buckets must be an integer between 1 and 64, not %s', rate_limiter._display(n)));
                END IF;
                buckets := n::integer;
            ELSE max_reserved := n;
            END CASE;
        WHEN m.field IN ('period', 'minGap', 'min_gap', 'lockTimeout', 'lock_timeout', 'denyCache', 'deny_cache') THEN
            -- Milliseconds, or interval text.
            IF m.type = 'string' THEN
                n := rate_limiter._interval_ms(m.text::interval);
            ELSIF m.type = 'number' THEN
                n := m.text::float8;
            ELSE
                PERFORM rate_limiter._raise('malformed', format('"%s" must be milliseconds or interval text, got %s', m.field, rate_limiter._json_text(m.v)));
            END IF;
            CASE m.field
            WHEN 'period' THEN
                period := n;
                period_interval := CASE WHEN m.type = 'string' THEN m.text::interval END;
            WHEN 'minGap', 'min_gap' THEN min_gap := n;
            WHEN 'lockTimeout', 'lock_timeout' THEN lock_timeout := n;
            ELSE deny_cache := n;
            END CASE;
        WHEN m.field = 'tz' THEN
            IF m.type NOT IN ('string', 'null') THEN PERFORM rate_limiter._raise('malformed', format('"%s" must be a time zone name, got %s', m.field, rate_limiter._json_text(m.v))); END IF;
            tz := m.text;
        WHEN m.field = 'start' THEN
            IF m.type = 'string' THEN
                start := rate_limiter._ms(m.text::timestamptz);
            ELSIF m.type = 'number' THEN
                start := m.text::float8;
            ELSE
                PERFORM rate_limiter._raise('malformed', format('"%s" must be ms since the epoch or timestamptz text, got %s', m.field, rate_limiter._json_text(m.v)));
            END IF;
        WHEN m.field IN ('mode', 'onLockTimeout', 'on_lock_timeout') THEN
            IF m.type <> 'string' THEN PERFORM rate_limiter._raise('malformed', format('"%s" must be a string, got %s', m.field, rate_limiter._json_text(m.v))); END IF;
            IF m.field = 'mode' AND m.text NOT IN ('all', 'partial', 'penalize') THEN
                PERFORM rate_limiter._raise('config', format('unknown mode "%s" (expected "all", "partial" or "penalize")', m.text));
            ELSIF m.field <> 'mode' AND m.text NOT IN ('deny', 'allow') THEN
                PERFORM rate_limiter._raise('config', format('unknown on_lock_timeout "%s" (expected "deny" or "allow")', m.text));
            END IF;
            IF m.field = 'mode' THEN mode := m.text; ELSE on_lock_timeout := m.text; END IF;
        WHEN m.field IN ('enforce', 'durable') THEN
            IF m.type <> 'boolean' THEN PERFORM rate_limiter._raise('malformed', format('"%s" must be a boolean, got %s', m.field, rate_limiter._json_text(m.v))); END IF;
            IF m.field = 'enforce' THEN enforce := m.text::boolean; ELSE durable := m.text::boolean; END IF;
        WHEN m.field = 'hot' AND m.type = 'boolean' AND m.text::boolean THEN
            PERFORM rate_limiter._raise('unsupported', 'hot with an inline config: define the limit by name');
        WHEN m.field = 'hot' AND m.type = 'boolean' THEN
            NULL;
        ELSE
            PERFORM rate_limiter._raise('config', format('unknown key "%s" (known: kind, rate, period, capacity, maxReserved, shards, start, minGap, mode, buckets, lockTimeout, onLockTimeout, denyCache, hot, durable, enforce, tz)', m.field));
        END CASE;
    END LOOP;
    IF kind IS NULL THEN PERFORM rate_limiter._raise('config', '"kind" is required'); END IF;
    IF rate IS NULL THEN PERFORM rate_limiter._raise('config', '"rate" is required'); END IF;
    IF period IS NULL THEN PERFORM rate_limiter._raise('config', '"period" is required'); END IF;
    IF buckets IS NOT NULL AND kind <> 'rolling window' THEN
        PERFORM rate_limiter._raise('config', 'buckets applies only to a rolling window');
    END IF;
    -- The calendar (config.rs calendar): only a period given as interval text can be one.
    months := coalesce((extract(year FROM period_interval) * 12 + extract(month FROM period_interval))::int, 0);
    days := coalesce(extract(day FROM period_interval)::int, 0);
    micros := coalesce((extract(hour FROM period_interval) * 3600 + extract(minute FROM period_interval) * 60) * 1000000
                       + extract(microseconds FROM period_interval), 0);
    unit := (months > 0 AND days = 0 AND micros = 0) OR (months = 0 AND days IN (1, 7) AND micros = 0);
    shown := CASE WHEN period_interval IS NOT NULL THEN format(' ''%s''', period_interval) ELSE '' END;
    IF unit AND kind = 'fixed window' THEN
        zone := rate_limiter._cal_zone(tz, true);
    ELSIF months <> 0 AND kind <> 'fixed window' THEN
        PERFORM rate_limiter._raise('calendar', format('a %s counts a fixed length, and a period of months%s has none', kind, shown));
    ELSIF months <> 0 THEN
        PERFORM rate_limiter._raise('calendar', format('a calendar period is whole months, ''1 day'' or ''1 week'', not%s', shown));
    ELSIF tz IS NOT NULL THEN
        PERFORM rate_limiter._raise('calendar', format('tz is for a fixed window of whole months, ''1 day'' or ''1 week'', not a %s of%s', kind, ltrim(shown)));
    END IF;
    us := CASE WHEN start IS NOT NULL THEN sign(start * 1000) * floor(abs(start * 1000) + 0.5) END;
    c := rate_limiter._validate(
        ROW(kind, rate, period, coalesce(capacity, rate), max_reserved, start, min_gap,
            CASE WHEN kind = 'rolling window' THEN coalesce(buckets, 10) ELSE 0 END, coalesce(mode, 'all'),
            CASE WHEN zone IS NOT NULL THEN CASE WHEN months > 0 THEN 'm' ELSE 'd' END END,
            CASE WHEN zone IS NOT NULL THEN CASE WHEN months > 0 THEN months ELSE days END END,
            zone, rate_limiter._cal_anchor(zone, CASE WHEN months > 0 THEN 'm' ELSE 'd' END, days, start), coalesce(shards, 1), false)::rate_limiter._config,
        coalesce(shards, 1), lock_timeout, deny_cache,
        us >= -210866803200000000::float8 AND us < 9224318016000000000::float8,
        false, coalesce(durable, true));
END $$;

-- config::fingerprint: SHA-256 of what shapes the arithmetic (kind, mode, numbers as
-- little-endian doubles, -0 as 0, an absent one as nine 0xff bytes), its first 16 bytes in
-- hex.
CREATE FUNCTION rate_limiter._fingerprint(c rate_limiter._config) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
BEGIN ATOMIC
    SELECT pg_catalog.encode(pg_catalog.substr(pg_catalog.sha256(CASE WHEN c.kind OPERATOR(pg_catalog.=) 'concurrency' THEN
        -- A concurrency limit's slots are all it has; period only says when to come back.
        pg_catalog.convert_to('rate_limiter config 1', 'UTF8') OPERATOR(pg_catalog.||) '\x00'::bytea
        OPERATOR(pg_catalog.||) pg_catalog.convert_to(c.kind, 'UTF8') OPERATOR(pg_catalog.||) '\x00'::bytea
        OPERATOR(pg_catalog.||) rate_limiter._le(c.rate) ELSE
        pg_catalog.convert_to('rate_limiter config 1', 'UTF8') OPERATOR(pg_catalog.||) '\x00'::bytea
        OPERATOR(pg_catalog.||) pg_catalog.convert_to(c.kind, 'UTF8') OPERATOR(pg_catalog.||) '\x00'::bytea
        OPERATOR(pg_catalog.||) pg_catalog.convert_to(c.mode, 'UTF8') OPERATOR(pg_catalog.||) '\x00'::bytea
        OPERATOR(pg_catalog.||) rate_limiter._le(c.rate) OPERATOR(pg_catalog.||) rate_limiter._le(c.period)
        OPERATOR(pg_catalog.||) rate_limiter._le(c.capacity)
        OPERATOR(pg_catalog.||) rate_limiter._le_optional(c.max_reserved) OPERATOR(pg_catalog.||) rate_limiter._le_optional(c.start)
        OPERATOR(pg_catalog.||) rate_limiter._le_optional(c.min_gap)
        OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.int4send(c.shards), 4, 1)
        OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.int4send(c.shards), 3, 1)
        OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.int4send(c.shards), 2, 1)
        OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.int4send(c.shards), 1, 1)
        OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.int4send(c.buckets), 4, 1)
        OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.int4send(c.buckets), 3, 1)
        OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.int4send(c.buckets), 2, 1)
        OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.int4send(c.buckets), 1, 1)
        OPERATOR(pg_catalog.||) CASE WHEN c.cal_unit IS NULL THEN ''::bytea
            ELSE pg_catalog.convert_to(c.cal_unit, 'UTF8')
                 OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.int4send(c.cal_n), 4, 1)
                 OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.int4send(c.cal_n), 3, 1)
                 OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.int4send(c.cal_n), 2, 1)
                 OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.int4send(c.cal_n), 1, 1)
                 OPERATOR(pg_catalog.||) pg_catalog.convert_to(c.cal_zone, 'UTF8') END END), 1, 16), 'hex');
END;

-- A consuming call's or a check's request: its arguments, its limit, then its count against
-- what one call could ever be granted.
CREATE FUNCTION rate_limiter._request(name text, key text, count double precision, reserve boolean, config jsonb,
                                      OUT c rate_limiter._config, OUT enforce boolean, OUT stored text, OUT shard integer,
                                      OUT lock_timeout double precision, OUT on_lock_timeout text, OUT exempt boolean)
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    named record;
BEGIN
    PERFORM rate_limiter._arguments(name, key, count);
    named := rate_limiter._named(name, key, config);
    exempt := named.exempt;
    c := named.c;
    enforce := named.enforce;
    stored := named.stored;
    shard := named.shard;
    lock_timeout := named.lock_timeout;
    on_lock_timeout := named.on_lock_timeout;
    PERFORM rate_limiter._usable(name, count, reserve, c);
END $$;

-- Whether limit c can answer a request of count at all (src/api/mod.rs usable).
CREATE FUNCTION rate_limiter._usable(name text, count double precision, reserve boolean, c rate_limiter._config)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    factor float8;
    per_shards text;
BEGIN
    IF c.kind = 'concurrency' THEN
        IF coalesce(reserve, false) THEN PERFORM rate_limiter._raise('slots', 'a concurrency limit has no reservations'); END IF;
        IF count <> trunc(count) THEN
            PERFORM rate_limiter._raise('argument', format('a concurrency limit counts whole slots: count must be a whole number, not %s', rate_limiter._display(count)));
        END IF;
    END IF;
    IF coalesce(reserve, false) AND c.kind NOT IN ('token bucket', 'fixed window') THEN
        PERFORM rate_limiter._raise('unsupported', format('a %s has no reservations', c.kind));
    END IF;
    IF coalesce(reserve, false) AND c.mode <> 'all' THEN
        PERFORM rate_limiter._raise('unsupported', format('mode ''%s'' has no reservations', c.mode));
    END IF;
    -- Config::impossible_count: what one call could ever be granted, of the shards it may draw
    -- from (all of one, or half of them from 3 shards up, as the Convex component counts).
    factor := CASE WHEN c.shards < 3 THEN 1::float8 ELSE c.shards::float8 / 2 END;
    per_shards := CASE WHEN c.shards > 1 THEN format(' per %s shards', c.shards) ELSE '' END;
    IF NOT coalesce(reserve, false) AND count > c.capacity / factor THEN
        PERFORM rate_limiter._raise('count', format('Rate limit %s count %s exceeds %s%s.', name, rate_limiter._display(count),
            rate_limiter._display(c.capacity / factor), per_shards), format('count = %s', rate_limiter._display(count)));
    ELSIF coalesce(reserve, false) AND c.max_reserved IS NOT NULL AND count > c.capacity / factor + c.max_reserved / factor THEN
        PERFORM rate_limiter._raise('count', format('Rate limit %s count %s exceeds %s%s.', name, rate_limiter._display(count),
            rate_limiter._display2(c.capacity / factor + c.max_reserved / factor), per_shards), format('count = %s', rate_limiter._display(count)));
    END IF;
END $$;

-- The block or allow list's answer for (name, key), as lists::listed: a block wins; an entry
-- that has ended counts for nothing. NULL when neither applies.
CREATE FUNCTION rate_limiter._listed(name text, key text, count double precision, capacity double precision, exempt boolean)
RETURNS rate_limiter.decision
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    until timestamptz;
    now float8;
    retry float8;
BEGIN
    -- Each list is probed through its unique index (key, name), for the name and for every
    -- limit (NULL name); a NULL key its own probe, or the query would be planned at every call.
    IF key IS NULL THEN
        SELECT max(b.until) INTO until FROM rate_limiter.blocks b WHERE b.key IS NULL AND (b.name = _listed.name OR b.name IS NULL);
    ELSE
        SELECT max(b.until) INTO until FROM rate_limiter.blocks b WHERE b.key = _listed.key AND (b.name = _listed.name OR b.name IS NULL);
    END IF;
    IF until IS NOT NULL THEN
        now := rate_limiter._now();
        IF rate_limiter._ms(until) > now THEN
            retry := CASE WHEN until = 'infinity' THEN NULL ELSE rate_limiter._ms(until) - now END;
            RETURN ROW(false, retry, 0, coalesce(retry, 0), 0, 'blocked', name)::rate_limiter.decision;
        END IF;
    END IF;
    IF key IS NULL THEN
        SELECT max(a.until) INTO until FROM rate_limiter.allows a WHERE a.key IS NULL AND (a.name = _listed.name OR a.name IS NULL);
    ELSE
        SELECT max(a.until) INTO until FROM rate_limiter.allows a WHERE a.key = _listed.key AND (a.name = _listed.name OR a.name IS NULL);
    END IF;
    IF exempt OR (until IS NOT NULL AND rate_limiter._ms(until) > rate_limiter._now()) THEN
        RETURN ROW(true, NULL, capacity, 0, count, 'allowed', NULL)::rate_limiter.decision;
    END IF;
    RETURN NULL;
END $$;

-- A denial answered as shadow mode answers it, and throws => true's RL429.
CREATE FUNCTION rate_limiter._answer(d rate_limiter.decision, enforce boolean, name text, key text, throws boolean)
RETURNS rate_limiter.decision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT d.ok AND NOT enforce AND d.reason IS DISTINCT FROM 'blocked' THEN
        d := ROW(true, d.retry_after, d.remaining, d.reset_after, 0, 'shadow', d.limited_by)::rate_limiter.decision;
    END IF;
    IF coalesce(throws, false) AND (NOT d.ok OR d.retry_after IS NOT NULL) AND d.reason IS DISTINCT FROM 'shadow' THEN
        RAISE EXCEPTION 'rate limit "%" exceeded', name USING ERRCODE = 'RL429',
            DETAIL = format('{"kind":"RateLimited","name":%s,"key":%s,"retryAfter":%s%s}', to_json(name),
                            coalesce(to_json(key)::text, 'null'), coalesce(rate_limiter._display(d.retry_after), 'null'),
                            CASE WHEN d.reason IS NOT NULL AND d.reason <> 'exhausted' THEN format(',"reason":%s', to_json(d.reason)) ELSE '' END),
            HINT = CASE WHEN d.retry_after IS NULL THEN 'The key is blocked until further notice: see rate_limiter.blocks.'
                        ELSE format('Retry after %s ms.', rate_limiter._display(d.retry_after)) END;
    END IF;
    RETURN d;
END $$;

-- Write state s, decided under config c, to the locked row at `at`, as storage's
-- write_locked does: its times as timestamptz, and from when it holds what a fresh one would.
CREATE FUNCTION rate_limiter._store(at tid, s rate_limiter._state, c rate_limiter._config) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- PL/pgSQL keeps the UPDATE's plan for the session; a SQL-standard body plans it at every call.
    UPDATE rate_limiter.state SET value = s.value, ts = rate_limiter._ts(s.ts),
        expires = rate_limiter._ts(rate_limiter._expires(s, c)), counts = s.counts, granted_at = rate_limiter._ts(s.granted_at)
    WHERE ctid = at;
END $$;

-- A state row's state; the state of a key never written, fresh as of now.
CREATE FUNCTION rate_limiter._state_of(r rate_limiter.state, c rate_limiter._config, name text, key text, now double precision)
RETURNS rate_limiter._state
LANGUAGE sql STABLE PARALLEL UNSAFE
RETURN CASE WHEN r.shard IS NOT NULL
            THEN ROW(r.value, rate_limiter._ms(r.ts), rate_limiter._ms(r.granted_at), r.counts)::rate_limiter._state
            -- A token bucket has no windows: its phase is never read, so never hashed.
            WHEN c.kind = 'token bucket' THEN rate_limiter._fresh(c, now, 0)
            ELSE rate_limiter._fresh(c, now, floor(rate_limiter._phase_fraction(name, key) * c.period)) END;
-- The row of shard `shard` of (stored, key) and where it is, read without a lock (_read_row)
-- or locked, waiting for a transaction that holds it (_lock_row); NULL when there is none.
-- A NULL key is its own probe of the unique index: one query for both would be planned anew
-- at every call.
CREATE FUNCTION rate_limiter._read_row(stored text, key text, shard integer, OUT at tid, OUT "row" rate_limiter.state)
LANGUAGE plpgsql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    found record;
BEGIN
    IF key IS NULL THEN
        SELECT s.ctid AS at, s AS found_row INTO found FROM rate_limiter.state s WHERE s.key IS NULL AND s.name = stored AND s.shard = _read_row.shard;
    ELSE
        SELECT s.ctid AS at, s AS found_row INTO found FROM rate_limiter.state s WHERE s.key = _read_row.key AND s.name = stored AND s.shard = _read_row.shard;
    END IF;
    at := found.at;
    "row" := found.found_row;
END $$;

-- Create the row of shard `shard` of (stored, key) holding state s (decided under config c):
-- where it is, or NULL when another transaction created it first (ours then waits for it to
-- end: lock theirs).
CREATE FUNCTION rate_limiter._create_row(stored text, key text, shard integer, s rate_limiter._state, c rate_limiter._config)
RETURNS tid
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    created tid;
BEGIN
    INSERT INTO rate_limiter.state AS x (name, key, shard, value, ts, expires, counts, granted_at)
    VALUES (stored, key, shard, s.value, rate_limiter._ts(s.ts), rate_limiter._ts(rate_limiter._expires(s, c)), s.counts,
            rate_limiter._ts(s.granted_at))
    ON CONFLICT ON CONSTRAINT state_key_name_shard_key DO NOTHING
    RETURNING x.ctid INTO created;
    RETURN created;
END $$;

CREATE FUNCTION rate_limiter._lock_row(stored text, key text, shard integer, OUT at tid, OUT "row" rate_limiter.state)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    found record;
BEGIN
    IF key IS NULL THEN
        SELECT s.ctid AS at, s AS found_row INTO found FROM rate_limiter.state s WHERE s.key IS NULL AND s.name = stored AND s.shard = _lock_row.shard FOR UPDATE;
    ELSE
        SELECT s.ctid AS at, s AS found_row INTO found FROM rate_limiter.state s WHERE s.key = _lock_row.key AND s.name = stored AND s.shard = _lock_row.shard FOR UPDATE;
    END IF;
    at := found.at;
    "row" := found.found_row;
END $$;

CREATE FUNCTION rate_limiter.check_rate_limit(name text, key text DEFAULT NULL, count double precision DEFAULT 1,
    reserve boolean DEFAULT false, throws boolean DEFAULT false, config jsonb DEFAULT NULL)
RETURNS rate_limiter.decision
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    req record := rate_limiter._request(name, key, count, reserve, config);
    d rate_limiter.decision := rate_limiter._listed(name, key, count, (req.c).capacity, req.exempt);
    r rate_limiter.state;
    now float8;
BEGIN
    IF d.ok IS NULL AND (req.c).kind = 'concurrency' THEN
        d := (rate_limiter._take_slots(req.c, req.stored, name, key, count, false, NULL)).d;
    ELSIF d.ok IS NULL AND (req.c).shards > 1 THEN
        d := rate_limiter._check_sharded(req.c, req.stored, req.shard, name, key, count, reserve);
    ELSIF d.ok IS NULL THEN  -- not listed
        r := (rate_limiter._read_row(req.stored, key, req.shard)).row;
        now := rate_limiter._now();
        d := (rate_limiter._decide(rate_limiter._state_of(r, req.c, name, key, now), req.c, now, name, count, reserve)).d;
    END IF;
    RETURN rate_limiter._answer(d, req.enforce, name, key, throws);
END $$;
COMMENT ON FUNCTION rate_limiter.check_rate_limit IS 'The answer rate_limit would give, without writing or locking anything.';

-- Take count from (name, key), as limiter/rows.rs does: the row read without a lock, a
-- denial answered from it at once; an allowed call creates the row, or locks it (waiting for
-- a transaction that holds it) and writes what it decided when the row is the version it
-- read, else reads the clock again and decides again on the newest.
CREATE FUNCTION rate_limiter.rate_limit(name text, key text DEFAULT NULL, count double precision DEFAULT 1,
    reserve boolean DEFAULT false, throws boolean DEFAULT false, config jsonb DEFAULT NULL)
RETURNS rate_limiter.decision
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    req record := rate_limiter._request(name, key, count, reserve, config);
    d rate_limiter.decision;
    read record;
    locked record;
    now float8;
    decided record;
BEGIN
    PERFORM rate_limiter._writable('rate_limit()', 'rate_limiter.state');
    d := rate_limiter._listed(name, key, count, (req.c).capacity, req.exempt);
    IF d.ok IS NOT NULL THEN  -- listed (a row IS NOT NULL only when no column is)
        RETURN rate_limiter._answer(d, req.enforce, name, key, throws);
    END IF;
    IF (req.c).kind = 'concurrency' THEN
        RETURN rate_limiter._answer((rate_limiter._take_slots(req.c, req.stored, name, key, count, true, NULL)).d,
                                    req.enforce, name, key, throws);
    END IF;
    IF (req.c).shards > 1 THEN
        RETURN rate_limiter._answer(rate_limiter._take_sharded(req.c, req.stored, req.shard, name, key, count, reserve, false),
                                    req.enforce, name, key, throws);
    END IF;
    IF req.lock_timeout IS NOT NULL THEN
        RETURN rate_limiter._answer(rate_limiter._take_within(req.c, req.stored, req.shard, req.lock_timeout,
            req.on_lock_timeout = 'allow', name, key, count, reserve), req.enforce, name, key, throws);
    END IF;
    read := rate_limiter._read_row(req.stored, rate_limit.key, req.shard);
    now := rate_limiter._now();
    decided := rate_limiter._decide(rate_limiter._state_of(read.row, req.c, name, key, now), req.c, now, name, count, reserve);
    LOOP
        EXIT WHEN decided.after IS NULL;  -- a denial writes nothing and waits for no one (but a penalty)
        IF read.at IS NULL THEN
            EXIT WHEN rate_limiter._create_row(req.stored, key, req.shard, decided.after, req.c) IS NOT NULL;
        END IF;
        -- The newest version, locked (waiting for a transaction that holds it).
        locked := rate_limiter._lock_row(req.stored, rate_limit.key, req.shard);
        IF locked.at IS DISTINCT FROM read.at OR locked.at IS NULL THEN
            -- Created, changed or deleted by a transaction that committed meanwhile: the clock
            -- read again and the call decided again, on what is there now.
            read := locked;
            now := rate_limiter._now();
            decided := rate_limiter._decide(rate_limiter._state_of(read.row, req.c, name, key, now), req.c, now, name, count, reserve);
            CONTINUE WHEN read.at IS NULL;  -- deleted: create it again
            EXIT WHEN decided.after IS NULL;
        END IF;
        PERFORM rate_limiter._store(locked.at, decided.after, req.c);
        EXIT;
    END LOOP;
    RETURN rate_limiter._answer(decided.d, req.enforce, name, key, throws);
END $$;
COMMENT ON FUNCTION rate_limiter.rate_limit IS 'Take count tokens from (name, key) inside the caller''s transaction; returns a decision, or raises RL429 with throws.';

-- rate_limit's ok alone. The extension's forms no decision row; the edition's is rate_limit's,
-- for the same surface.
CREATE FUNCTION rate_limiter.rate_limit_ok(name text, key text DEFAULT NULL, count double precision DEFAULT 1,
    reserve boolean DEFAULT false, throws boolean DEFAULT false, config jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE sql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT (rate_limiter.rate_limit(name, key, count, reserve, throws, config)).ok
$$;
COMMENT ON FUNCTION rate_limiter.rate_limit_ok IS 'rate_limit(...).ok, at less cost: takes as rate_limit does (and raises RL429 with throws), and returns only whether the call is ok.';

-- rate_limit under a lock_timeout (limiter/rows.rs write): rounds that never queue for a row
-- another transaction holds (each lock waits 1 ms at most, the function's own lock_timeout),
-- each reading, deciding and trying to write; between rounds a pause of 1 ms doubling up to
-- 20 ms, until lock_timeout ms of real time have passed: then the limit's policy answers
-- (denied, to retry after as long again; or let through unmetered), with what the last round
-- planned. Giving up aborts nothing and leaves no lock queued.
CREATE FUNCTION rate_limiter._take_within(c rate_limiter._config, stored text, shard integer, lock_timeout double precision,
                                          allow boolean, name text, key text, count double precision, reserve boolean)
RETURNS rate_limiter.decision
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp SET lock_timeout = 1 AS $$
DECLARE
    deadline timestamptz := clock_timestamp() + make_interval(secs => lock_timeout / 1000);
    pause float8 := 1;
    read record;
    locked record;
    now float8;
    decided record;
BEGIN
    LOOP
        read := rate_limiter._read_row(stored, _take_within.key, _take_within.shard);
        now := rate_limiter._now();
        decided := rate_limiter._decide(rate_limiter._state_of(read.row, c, name, key, now), c, now, name, count, reserve);
        IF decided.after IS NULL THEN RETURN decided.d; END IF;  -- a denial writes nothing and waits for no one
        BEGIN
            IF read.at IS NULL THEN
                IF rate_limiter._create_row(stored, key, _take_within.shard, decided.after, c) IS NOT NULL THEN
                    RETURN decided.d;
                END IF;
                CONTINUE;  -- committed meanwhile by another: the next round reads it
            END IF;
            locked := rate_limiter._lock_row(stored, _take_within.key, _take_within.shard);
            CONTINUE WHEN locked.at IS NULL;  -- deleted meanwhile: the next round creates it
            IF locked.at IS DISTINCT FROM read.at THEN
                -- Changed by a transaction that committed meanwhile: decided again on it.
                now := rate_limiter._now();
                decided := rate_limiter._decide(rate_limiter._state_of(locked.row, c, name, key, now), c, now, name, count, reserve);
                IF decided.after IS NULL THEN RETURN decided.d; END IF;
            END IF;
            PERFORM rate_limiter._store(locked.at, decided.after, c);
            RETURN decided.d;
        EXCEPTION WHEN lock_not_available THEN
            NULL;  -- another transaction holds the row (or is creating it)
        END;
        IF clock_timestamp() >= deadline THEN
            RETURN ROW(allow, CASE WHEN NOT allow THEN greatest(lock_timeout, 1) END, (decided.d).remaining, (decided.d).reset_after,
                       0, 'lock_timeout', name)::rate_limiter.decision;
        END IF;
        PERFORM pg_sleep(least(pause, greatest(rate_limiter._ms(deadline) - rate_limiter._ms(clock_timestamp()), 0)) / 1000);
        pause := least(pause * 2, 20);
    END LOOP;
END $$;

CREATE FUNCTION rate_limiter.reset_rate_limit(name text, key text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rate_limiter._writable('reset_rate_limit()', 'rate_limiter.state', 'rate_limiter.leases');
    PERFORM rate_limiter._valid_name(name);
    DELETE FROM rate_limiter.state s
    WHERE (s.key = reset_rate_limit.key OR (s.key IS NULL AND reset_rate_limit.key IS NULL))
      AND (s.name = reset_rate_limit.name  -- and every inline config's rows of the name
           OR (s.shard < 0 AND left(s.name, -33) = reset_rate_limit.name AND right(s.name, 33) ~ '^#[0-9a-f]{32}$'));
    DELETE FROM rate_limiter.leases l
    WHERE (l.key = reset_rate_limit.key OR (l.key IS NULL AND reset_rate_limit.key IS NULL))
      AND (l.name = reset_rate_limit.name
           OR (left(l.name, -33) = reset_rate_limit.name AND right(l.name, 33) ~ '^#[0-9a-f]{32}$'));
END $$;
COMMENT ON FUNCTION rate_limiter.reset_rate_limit IS 'Forget the state of (name, key), every shard, and a concurrency limit''s leases: it is full again (slots that transactions hold stay theirs).';

CREATE FUNCTION rate_limiter.block(name text, key text, until timestamptz DEFAULT 'infinity', note text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rate_limiter._writable('block()', 'rate_limiter.blocks');
    IF name IS NOT NULL THEN PERFORM rate_limiter._valid_name(name); END IF;
    PERFORM rate_limiter._valid_key(key);
    IF until IS NULL THEN PERFORM rate_limiter._raise('argument', 'until must not be NULL; use ''infinity'''); END IF;
    INSERT INTO rate_limiter.blocks AS b (name, key, until, note) VALUES (name, key, until, note)
    ON CONFLICT ON CONSTRAINT blocks_key_name_key DO UPDATE SET until = excluded.until, note = excluded.note, created = pg_catalog.now();
END $$;
COMMENT ON FUNCTION rate_limiter.block IS 'Deny (name, key) until until (NULL name: under every limit), with reason ''blocked''; replaces an earlier block of the pair.';

CREATE FUNCTION rate_limiter.unblock(name text, key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rate_limiter._writable('unblock()', 'rate_limiter.blocks');
    DELETE FROM rate_limiter.blocks b
    WHERE b.name IS NOT DISTINCT FROM unblock.name AND b.key IS NOT DISTINCT FROM unblock.key;
    RETURN FOUND;
END $$;
COMMENT ON FUNCTION rate_limiter.unblock IS 'Lift the block of (name, key); returns whether there was one.';

CREATE FUNCTION rate_limiter.allow(name text, key text, until timestamptz DEFAULT 'infinity', note text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rate_limiter._writable('allow()', 'rate_limiter.allows');
    IF name IS NOT NULL THEN PERFORM rate_limiter._valid_name(name); END IF;
    PERFORM rate_limiter._valid_key(key);
    IF until IS NULL THEN PERFORM rate_limiter._raise('argument', 'until must not be NULL; use ''infinity'''); END IF;
    INSERT INTO rate_limiter.allows AS a (name, key, until, note) VALUES (name, key, until, note)
    ON CONFLICT ON CONSTRAINT allows_key_name_key DO UPDATE SET until = excluded.until, note = excluded.note, created = pg_catalog.now();
END $$;
COMMENT ON FUNCTION rate_limiter.allow IS 'Never limit (name, key) until until (NULL name: under every limit): calls are ok with reason ''allowed'', state untouched; a block wins. Replaces an earlier allow of the pair.';

CREATE FUNCTION rate_limiter.disallow(name text, key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rate_limiter._writable('disallow()', 'rate_limiter.allows');
    DELETE FROM rate_limiter.allows a
    WHERE a.name IS NOT DISTINCT FROM disallow.name AND a.key IS NOT DISTINCT FROM disallow.key;
    RETURN FOUND;
END $$;
COMMENT ON FUNCTION rate_limiter.disallow IS 'Lift the allow of (name, key); returns whether there was one.';

-- Give count back to (name, key), as bucket::plan_credit for one row: the state refilled to
-- now rises by count, capped at the capacity (a debt is paid first). No lists, no shadow, no
-- count bound; written only when something was given back, so a credit never creates a row.
CREATE FUNCTION rate_limiter.credit(name text, key text DEFAULT NULL, count double precision DEFAULT 1, config jsonb DEFAULT NULL)
RETURNS rate_limiter.decision
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    named record;
    c rate_limiter._config;
    read record;
    locked record;
    now float8;
    credited record;
BEGIN
    PERFORM rate_limiter._arguments(name, key, count);
    named := rate_limiter._named(name, key, config);
    c := named.c;
    PERFORM rate_limiter._writable('credit()', 'rate_limiter.state');
    IF c.kind = 'concurrency' THEN
        PERFORM rate_limiter._raise('slots', format('credit on the concurrency limit "%s": release() its lease; a transaction''s slots end with it', name));
    END IF;
    IF c.shards > 1 THEN
        RETURN rate_limiter._take_sharded(c, named.stored, named.shard, name, key, count, false, true);
    END IF;
    read := rate_limiter._read_row(named.stored, credit.key, named.shard);
    now := rate_limiter._now();
    credited := rate_limiter._credited(rate_limiter._state_of(read.row, c, name, key, now), c, now, count);
    IF credited.given > 0 THEN
        -- The version read, locked (waiting for a transaction that holds it, whatever the
        -- limit's lock_timeout: a give-back is never dropped); else decided again on the newest.
        locked := rate_limiter._lock_row(named.stored, credit.key, named.shard);
        IF locked.at IS DISTINCT FROM read.at THEN
            now := rate_limiter._now();
            credited := rate_limiter._credited(rate_limiter._state_of(locked.row, c, name, key, now), c, now, count);
        END IF;
        IF credited.given > 0 AND locked.at IS NOT NULL THEN
            PERFORM rate_limiter._store(locked.at, credited.after, c);
        END IF;
    END IF;
    RETURN ROW(true, NULL, credited.available, greatest(0::float8, rate_limiter._reset_after(credited.after, c, now)),
               0::float8 - credited.given, NULL, NULL)::rate_limiter.decision;
END $$;
COMMENT ON FUNCTION rate_limiter.credit IS 'Give count tokens back to (name, key) inside the caller''s transaction, as much as the limit still counts (a token bucket up to capacity); returns the decision after it, granted minus what was given back.';

-- Delete what has ended, at most max_rows rows: blocks and allows whose until has passed,
-- then state rows whose expires has, then (READ COMMITTED, and when no transaction is
-- changing the limits) rows of limits that no longer exist. The number deleted.
CREATE FUNCTION rate_limiter.prune(max_rows integer DEFAULT 10000) RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now timestamptz;
    deleted bigint := 0;
    n bigint;
BEGIN
    PERFORM rate_limiter._writable('prune()', 'rate_limiter.blocks', 'rate_limiter.allows', 'rate_limiter.overrides', 'rate_limiter.leases',
                                   'rate_limiter.state');
    IF max_rows IS NULL OR max_rows < 0 THEN
        PERFORM rate_limiter._raise('argument', format('max_rows must be >= 0, not %s',
            CASE WHEN max_rows IS NULL THEN 'None' ELSE format('Some(%s)', max_rows) END));
    END IF;
    now := rate_limiter._ts(rate_limiter._now());
    WITH ended AS (SELECT ctid FROM rate_limiter.blocks WHERE until <= now LIMIT max_rows - deleted FOR UPDATE SKIP LOCKED)
    DELETE FROM rate_limiter.blocks WHERE ctid = ANY (ARRAY(SELECT ctid FROM ended)) AND until <= now;
    GET DIAGNOSTICS n = ROW_COUNT; deleted := deleted + n;
    IF deleted = max_rows THEN RETURN deleted; END IF;
    WITH ended AS (SELECT ctid FROM rate_limiter.allows WHERE until <= now LIMIT max_rows - deleted FOR UPDATE SKIP LOCKED)
    DELETE FROM rate_limiter.allows WHERE ctid = ANY (ARRAY(SELECT ctid FROM ended)) AND until <= now;
    GET DIAGNOSTICS n = ROW_COUNT; deleted := deleted + n;
    IF deleted = max_rows THEN RETURN deleted; END IF;
    -- Overrides that ended: their keys are decided under their limits again.
    WITH ended AS (SELECT ctid FROM rate_limiter.overrides WHERE until <= now LIMIT max_rows - deleted FOR UPDATE SKIP LOCKED)
    DELETE FROM rate_limiter.overrides WHERE ctid = ANY (ARRAY(SELECT ctid FROM ended)) AND until <= now;
    GET DIAGNOSTICS n = ROW_COUNT; deleted := deleted + n;
    IF deleted = max_rows THEN RETURN deleted; END IF;
    WITH ended AS (SELECT ctid FROM rate_limiter.leases WHERE expires_at <= now LIMIT max_rows - deleted FOR UPDATE SKIP LOCKED)
    DELETE FROM rate_limiter.leases WHERE ctid = ANY (ARRAY(SELECT ctid FROM ended)) AND expires_at <= now;
    GET DIAGNOSTICS n = ROW_COUNT; deleted := deleted + n;
    IF deleted = max_rows THEN RETURN deleted; END IF;
    WITH doomed AS (SELECT ctid FROM rate_limiter.state WHERE expires <= now LIMIT max_rows - deleted FOR UPDATE SKIP LOCKED)
    DELETE FROM rate_limiter.state WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed));
    GET DIAGNOSTICS n = ROW_COUNT; deleted := deleted + n;
    IF deleted = max_rows OR current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RETURN deleted;
    END IF;
    BEGIN
        LOCK TABLE rate_limiter.limits IN SHARE MODE NOWAIT;
    EXCEPTION WHEN lock_not_available THEN
        RETURN deleted;  -- a transaction is changing the limits: their rows wait for the next prune
    END;
    WITH doomed AS (SELECT ctid FROM rate_limiter.state s WHERE shard >= 0
                    AND NOT EXISTS (SELECT FROM rate_limiter.limits l WHERE l.name = s.name)
                    LIMIT max_rows - deleted FOR UPDATE SKIP LOCKED)
    DELETE FROM rate_limiter.state WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed));
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN deleted + n;
END $$;
COMMENT ON FUNCTION rate_limiter.prune IS 'Delete up to max_rows rows of rate_limiter.state that hold what a fresh state would, or belong to named limits that no longer exist, and blocks, allows, overrides and leases that have ended; returns how many. Skips rows in use.';

-- A number as Rust's `as u64` makes it (saturating, NaN and negatives 0), as text.
CREATE FUNCTION rate_limiter._u64(x double precision) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN x IS NULL OR x = 'NaN'::float8 OR x <= 0 THEN '0'
            WHEN x >= 18446744073709551616::float8 THEN '18446744073709551615'
            WHEN x < 9007199254740992::float8 THEN trunc(x)::bigint::text
            ELSE (trunc(x / 4294967296::float8)::numeric * 4294967296 + (x - trunc(x / 4294967296::float8) * 4294967296::float8)::numeric)::text END;

-- A count as a structured-field integer (http.rs sf_integer): floored, at most 15 digits
-- (RFC 9651), as text.
CREATE FUNCTION rate_limiter._sf_integer(x double precision) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN least(rate_limiter._u64(floor(x))::numeric, 999999999999999)::text;

-- Whole seconds, rounded up, of ms (http.rs seconds()), at most 15 digits.
CREATE FUNCTION rate_limiter._seconds(ms double precision) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN rate_limiter._sf_integer(ceil(CASE WHEN ms IS NULL OR ms = 'NaN'::float8 OR ms < 0 THEN 0::float8 ELSE ms END / 1000::float8));

-- Draft 11's quota and window, both integers (http.rs whole_quota): rate per period ms,
-- scaled by the least factor up to 3600 that makes both whole, else the whole tokens of the
-- window rounded up to a second.
CREATE FUNCTION rate_limiter._whole_quota(rate double precision, period double precision, OUT q text, OUT w text)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    secs float8 := period / 1000::float8;
    sq float8;
    sw float8;
BEGIN
    FOR factor IN 1 .. 3600 LOOP
        sq := rate * factor::float8;
        sw := secs * factor::float8;
        IF abs(sq - round(sq)) <= 1e-9::float8 * greatest(abs(sq), 1::float8)
           AND abs(sw - round(sw)) <= 1e-9::float8 * greatest(abs(sw), 1::float8) AND round(sw) >= 1 THEN
            q := rate_limiter._sf_integer(round(sq));
            w := rate_limiter._sf_integer(round(sw));
            RETURN;
        END IF;
    END LOOP;
    sw := greatest(ceil(secs), 1::float8);
    q := rate_limiter._sf_integer(rate * sw / secs);
    w := rate_limiter._sf_integer(sw);
END $$;

-- The headers of decision d (http.rs headers) in the syntax of draft 11 or 9: a policy per
-- limit (names, rates, periods in ms, whether each is a concurrency limit, its partition key
-- or NULL), RateLimit for the limit `current`.
CREATE FUNCTION rate_limiter._headers(names text[], rates double precision[], periods double precision[], concurrent boolean[],
                                      partitions text[], current text, d rate_limiter.decision, draft integer) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    policies text[] := '{}';
    headers jsonb;
    pk text := '';
    whole record;
BEGIN
    IF draft IS NULL THEN PERFORM rate_limiter._raise('argument', 'draft must not be NULL'); END IF;
    IF draft NOT IN (9, 11) THEN PERFORM rate_limiter._raise('argument', format('draft must be 9 or 11, not %s', draft)); END IF;
    IF d.ok IS NULL THEN PERFORM rate_limiter._raise('argument', 'decision.ok must not be NULL'); END IF;
    FOR i IN 1 .. cardinality(names) LOOP
        IF draft = 9 THEN
            -- Integers where the numbers are whole; a quota below one token is still one.
            policies := policies || format('%s;q=%s;w=%s', rate_limiter._sf_string(names[i]),
                CASE WHEN rates[i] = trunc(rates[i]) THEN rate_limiter._sf_integer(rates[i]) ELSE rate_limiter._display(rates[i]) END,
                greatest(rate_limiter._seconds(periods[i])::numeric, 1));
        ELSIF concurrent[i] THEN
            policies := policies || format('%s;q=%s;qu="concurrent-requests"%s', rate_limiter._sf_string(names[i]),
                rate_limiter._sf_integer(rates[i]), rate_limiter._pk(partitions[i]));
        ELSE
            whole := rate_limiter._whole_quota(rates[i], periods[i]);
            policies := policies || format('%s;q=%s;qu="requests";w=%s%s', rate_limiter._sf_string(names[i]),
                whole.q, whole.w, rate_limiter._pk(partitions[i]));
        END IF;
        IF names[i] = current AND draft = 11 THEN
            pk := rate_limiter._pk(partitions[i]);
        END IF;
    END LOOP;
    headers := jsonb_build_object(
        'RateLimit-Policy', array_to_string(policies, ', '),
        'RateLimit', format('%s;r=%s;t=%s%s', rate_limiter._sf_string(current), rate_limiter._sf_integer(coalesce(d.remaining, 0)),
            rate_limiter._seconds(CASE WHEN d.ok THEN coalesce(d.reset_after, 0) ELSE coalesce(d.retry_after, d.reset_after, 0) END), pk));
    IF NOT d.ok AND d.retry_after IS NOT NULL THEN
        headers := headers || jsonb_build_object('Retry-After', rate_limiter._seconds(d.retry_after));
    END IF;
    RETURN headers;
END $$;

-- ";pk=" and the key's bytes as a structured-field byte sequence (base64 between colons);
-- nothing for no key.
CREATE FUNCTION rate_limiter._pk(key text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN key IS NULL THEN '' ELSE ';pk=:' || translate(encode(convert_to(key, 'UTF8'), 'base64'), E'\n', '') || ':' END;

-- A structured-field string: printable ASCII only, with " and \ escaped (22023 otherwise,
-- which a header cannot carry).
CREATE FUNCTION rate_limiter._sf_string(name text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF name !~ '^[ -~]*$' OR octet_length(name) <> length(name) THEN
        PERFORM rate_limiter._raise('argument', format('the name "%s" is not printable ASCII, which an HTTP header cannot carry', name));
    END IF;
    RETURN '"' || replace(replace(name, '\', '\\'), '"', '\"') || '"';
END $$;

CREATE FUNCTION rate_limiter.http_headers(name text, d rate_limiter.decision, config jsonb DEFAULT NULL, key text DEFAULT NULL,
                                          draft integer DEFAULT 11, partition_key boolean DEFAULT false) RETURNS jsonb
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    named record;
BEGIN
    PERFORM rate_limiter._valid_name(name);
    PERFORM rate_limiter._valid_key(key);
    IF num_nulls(d) = 1 THEN  -- the argument itself, not a row of NULLs (which IS NULL too)
        PERFORM rate_limiter._raise('argument', 'd must not be NULL');
    END IF;
    named := rate_limiter._named(name, key, config);
    RETURN rate_limiter._headers(ARRAY[name], ARRAY[(named.c).rate], ARRAY[(named.c).period], ARRAY[(named.c).kind = 'concurrency'],
                                 ARRAY[CASE WHEN partition_key THEN key END], name, d, draft);
END $$;
COMMENT ON FUNCTION rate_limiter.http_headers IS 'RateLimit-Policy, RateLimit and (when denied) Retry-After headers for a decision of the limit on key, as a jsonb object, in draft 11''s syntax (draft => 9: draft 09''s); partition_key adds the key as pk.';

-- Draft 11's problem-details body of a denial (http.rs problem): quota-exceeded, naming the
-- limit that denied it; NULL when the decision is ok.
CREATE FUNCTION rate_limiter.http_problem(d rate_limiter.decision) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF num_nulls(d) = 1 THEN PERFORM rate_limiter._raise('argument', 'd must not be NULL'); END IF;
    IF d.ok IS NULL THEN PERFORM rate_limiter._raise('argument', 'decision.ok must not be NULL'); END IF;
    IF d.ok THEN RETURN NULL; END IF;
    IF d.limited_by IS NULL THEN PERFORM rate_limiter._raise('argument', 'decision.limited_by of a denial must not be NULL'); END IF;
    RETURN jsonb_build_object('type', 'https://iana.org/assignments/http-problem-types#quota-exceeded',
                              'title', 'Request cannot be satisfied as assigned quota has been exceeded',
                              'status', 429, 'violated-policies', jsonb_build_array(d.limited_by),
                              'rate_limiter-reason', coalesce(d.reason, ''));
END $$;
COMMENT ON FUNCTION rate_limiter.http_problem IS 'The problem-details body (application/problem+json) of a denial, of type quota-exceeded naming the limit that denied it; NULL when the decision is ok.';

-- The stored value and ts of (name, key), not refilled; a key never written, fresh as of now.
CREATE FUNCTION rate_limiter.rate_limit_value(name text, key text DEFAULT NULL, config jsonb DEFAULT NULL, sample_shards integer DEFAULT 1)
RETURNS TABLE(value double precision, ts timestamptz, shard integer, effective_config jsonb)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET extra_float_digits = 1 AS $$
DECLARE
    named record;
    c rate_limiter._config;
    r rate_limiter.state;
    s rate_limiter._state;
    sharded record;
    now float8;
BEGIN
    PERFORM rate_limiter._valid_name(name);
    PERFORM rate_limiter._valid_key(key);
    IF sample_shards IS NULL OR sample_shards < 1 THEN
        PERFORM rate_limiter._raise('argument', format('sample_shards must be >= 1, not %s',
            CASE WHEN sample_shards IS NULL THEN 'None' ELSE format('Some(%s)', sample_shards) END));
    END IF;
    named := rate_limiter._named(name, key, config);
    c := named.c;
    r := (rate_limiter._read_row(named.stored, key, named.shard)).row;
    now := rate_limiter._now();
    s := rate_limiter._state_of(r, c, name, key, now);
    shard := 0;
    IF c.kind = 'concurrency' THEN
        s := ROW(((rate_limiter._take_slots(c, named.stored, name, key, 0, false, NULL)).d).remaining, rate_limiter._now(), NULL, NULL)::rate_limiter._state;
    ELSIF c.shards > 1 THEN
        sharded := rate_limiter._value_sharded(c, named.stored, named.shard, name, key, sample_shards);
        s := sharded.s;
        shard := sharded.shard;
    END IF;
    -- As a call reads it: a level written under other numbers keeps what was used.
    s := rate_limiter._carried(s, rate_limiter._per_shard(c));
    value := s.value;
    ts := rate_limiter._ts(s.ts);
    effective_config := jsonb_strip_nulls(jsonb_build_object(
        'kind', c.kind, 'rate', rate_limiter._json_number(c.rate),
        'period', CASE WHEN c.cal_unit = 'm' AND c.cal_n = 1 THEN to_jsonb('1 month'::text)
                       WHEN c.cal_unit = 'm' AND c.cal_n = 12 THEN to_jsonb('1 year'::text)
                       WHEN c.cal_unit = 'm' AND c.cal_n % 12 = 0 THEN to_jsonb(format('%s years', c.cal_n / 12))
                       WHEN c.cal_unit = 'm' THEN to_jsonb(format('%s months', c.cal_n))
                       WHEN c.cal_unit = 'd' AND c.cal_n = 7 THEN to_jsonb('1 week'::text)
                       WHEN c.cal_unit = 'd' THEN to_jsonb('1 day'::text)
                       ELSE rate_limiter._json_number(c.period) END,
        'tz', CASE WHEN c.cal_zone <> 'UTC' THEN c.cal_zone END,
        'capacity', rate_limiter._json_number(c.capacity), 'maxReserved', rate_limiter._json_number(c.max_reserved),
        'shards', c.shards, 'start', CASE WHEN c.kind NOT IN ('token bucket', 'concurrency') THEN rate_limiter._json_number(coalesce(c.start, s.ts)) END,
        'buckets', CASE WHEN c.kind = 'rolling window' THEN c.buckets END,
        'minGap', rate_limiter._json_number(c.min_gap), 'mode', c.mode,
        'denyCache', rate_limiter._json_number(named.deny_cache),
        'lockTimeout', rate_limiter._json_number(named.lock_timeout),
        'onLockTimeout', CASE WHEN named.lock_timeout IS NOT NULL THEN named.on_lock_timeout END,
        'enforce', CASE WHEN NOT named.enforce THEN false END));
    RETURN NEXT;
END $$;
COMMENT ON FUNCTION rate_limiter.rate_limit_value IS 'The stored value and ts of (name, key) (fullest of sample_shards shards) and the effective config.';

-- A number as config::to_json writes it: whole numbers below 9e15 as integers, the rest in
-- their shortest form (and whole ones from 9e15 with ".0", as ryu writes them).
CREATE FUNCTION rate_limiter._json_number(v double precision) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET extra_float_digits = 1
RETURN CASE WHEN v IS NULL THEN NULL
            WHEN v = trunc(v) AND abs(v) < 9e15::float8 THEN to_jsonb(v::bigint)
            WHEN v = trunc(v) AND abs(v) < 1e16::float8 THEN (rate_limiter._display(v) || '.0')::jsonb
            ELSE to_jsonb(v) END;

-- rate_limit, sleeping retry_after and trying again while that fits in the timeout (real
-- time, measured after each try); then the last denial, with reason 'timeout' if it slept.
CREATE FUNCTION rate_limiter.wait_rate_limit(name text, key text DEFAULT NULL, count double precision DEFAULT 1,
    timeout interval DEFAULT '00:00:30', config jsonb DEFAULT NULL)
RETURNS rate_limiter.decision
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    limit_ms float8 := coalesce(rate_limiter._interval_ms(timeout), 'NaN'::float8);
    started timestamptz := clock_timestamp();
    waited boolean := false;
    d rate_limiter.decision;
    left_ms float8;
BEGIN
    PERFORM rate_limiter._arguments(name, key, count);
    IF NOT (limit_ms >= 0 AND limit_ms < 'Infinity') THEN
        PERFORM rate_limiter._raise('argument', format('timeout must be a finite interval >= 0, not %s ms', rate_limiter._display(limit_ms)));
    END IF;
    LOOP
        d := rate_limiter.rate_limit(name, key, count, false, false, config);
        left_ms := limit_ms - rate_limiter._ms(clock_timestamp()) + rate_limiter._ms(started);
        IF NOT d.ok AND d.retry_after IS NOT NULL AND d.retry_after <= left_ms THEN
            PERFORM pg_sleep(least(greatest(d.retry_after, 0), 31536000000) / 1000);
            waited := true;
        ELSIF NOT d.ok AND waited THEN
            RETURN ROW(d.ok, d.retry_after, d.remaining, d.reset_after, d.granted, 'timeout', d.limited_by)::rate_limiter.decision;
        ELSE
            RETURN d;
        END IF;
    END LOOP;
END $$;
COMMENT ON FUNCTION rate_limiter.wait_rate_limit IS 'rate_limit, sleeping until retry_after and trying again until granted or timeout would pass (then the denial, with reason ''timeout'' if it waited).';
