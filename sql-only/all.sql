-- Several limits at once (rate_limit_all, check_rate_limit_all), as src/limiter/all.rs: all
-- taken or none.

-- A JSON value as the extension's error messages print it (serde_json's compact form: no
-- spaces, an object's members in byte order).
CREATE FUNCTION rate_limiter._json_text(v jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    number text;
BEGIN
    CASE jsonb_typeof(v)
    WHEN 'object' THEN
        RETURN '{' || coalesce((SELECT string_agg(to_json(e.key)::text || ':' || rate_limiter._json_text(e.value), ','
                                                  ORDER BY e.key COLLATE "C") FROM jsonb_each(v) e), '') || '}';
    WHEN 'array' THEN
        RETURN '[' || coalesce((SELECT string_agg(rate_limiter._json_text(e.value), ',' ORDER BY e.n)
                                FROM jsonb_array_elements(v) WITH ORDINALITY e(value, n)), '') || ']';
    WHEN 'number' THEN
        -- An integer stays one; any other number is a double, printed with a fraction.
        number := v #>> '{}';
        IF number ~ '^-?[0-9]+$' THEN RETURN number; END IF;
        number := rate_limiter._display(number::float8);
        RETURN CASE WHEN number ~ '^-?[0-9]+$' THEN number || '.0' ELSE number END;
    ELSE
        RETURN v::text;
    END CASE;
END $$;

-- The decision for all of several decisions, and which of them limits it (limiter/all.rs
-- combine): ok when every one is; the longest-waiting of those that agree with the whole
-- (an indefinite block waits longest; the last of equals) limits it.
CREATE FUNCTION rate_limiter._combine(ds rate_limiter.decision[], OUT d rate_limiter.decision, OUT limiting integer)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ok boolean := true;
    wait float8;
    longest float8;
    one rate_limiter.decision;
BEGIN
    FOR i IN 1 .. cardinality(ds) LOOP
        ok := ok AND (ds[i]).ok;
    END LOOP;
    FOR i IN 1 .. cardinality(ds) LOOP
        CONTINUE WHEN (ds[i]).ok <> ok;
        wait := coalesce((ds[i]).retry_after, CASE WHEN (ds[i]).ok THEN 0 ELSE 'Infinity'::float8 END);
        IF longest IS NULL OR wait >= longest THEN
            longest := wait;
            limiting := i;
        END IF;
    END LOOP;
    d := ROW(ok, NULL, 'Infinity', 0, CASE WHEN ok THEN 'Infinity'::float8 ELSE 0 END,
             (ds[limiting]).reason, (ds[limiting]).limited_by)::rate_limiter.decision;
    FOREACH one IN ARRAY ds LOOP
        IF ok AND one.retry_after IS NOT NULL THEN
            d.retry_after := greatest(d.retry_after, one.retry_after);
        END IF;
        -- When none is taken, a request that would pass still has what it would have taken.
        d.remaining := least(d.remaining, one.remaining + CASE WHEN ok THEN 0 ELSE one.granted END);
        d.reset_after := greatest(d.reset_after, one.reset_after);
        IF ok THEN d.granted := least(d.granted, one.granted); END IF;
    END LOOP;
    IF NOT ok THEN d.retry_after := (ds[limiting]).retry_after; END IF;
END $$;

-- The requests of rate_limit_all (and http_headers_all), checked as src/api/mod.rs parts
-- checks them: each in turn, its members in byte order, its arguments, once only, its limit
-- (named or inline), all or nothing.
CREATE FUNCTION rate_limiter._parts(requests jsonb, reserve boolean, OUT names text[], OUT keys text[], OUT counts double precision[],
                                    OUT configs rate_limiter._config[], OUT stored text[], OUT shards integer[],
                                    OUT exempts boolean[])
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
    item jsonb;
    member record;
    name text;
    key text;
    count float8;
    config jsonb;
    named record;
BEGIN
    names := '{}';
    keys := '{}';
    counts := '{}';
    configs := '{}';
    stored := '{}';
    shards := '{}';
    exempts := '{}';
    IF jsonb_typeof(requests) <> 'array' THEN
        PERFORM rate_limiter._raise('argument', format('requests: expected a JSON array of objects, got %s', rate_limiter._json_text(requests)));
    END IF;
    n := jsonb_array_length(requests);
    IF n = 0 THEN PERFORM rate_limiter._raise('argument', 'requests: name at least one limit'); END IF;
    IF n > 1000 THEN PERFORM rate_limiter._raise('argument', format('requests: %s limits, more than 1000', n)); END IF;
    FOR i IN 1 .. n LOOP
        item := requests -> (i - 1);
        IF jsonb_typeof(item) <> 'object' THEN
            PERFORM rate_limiter._raise('argument', format('requests: expected an object, got %s', rate_limiter._json_text(item)));
        END IF;
        name := NULL;
        key := NULL;
        count := 1;
        config := NULL;
        FOR member IN SELECT e.key AS field, e.value AS v, jsonb_typeof(e.value) AS type FROM jsonb_each(item) e ORDER BY e.key COLLATE "C" LOOP
            IF member.field = 'name' AND member.type = 'string' THEN name := member.v #>> '{}';
            ELSIF member.field = 'key' AND member.type IN ('string', 'null') THEN key := member.v #>> '{}';
            ELSIF member.field = 'count' AND member.type = 'number' THEN count := (member.v #>> '{}')::float8;
            ELSIF member.field = 'config' THEN config := CASE WHEN member.type <> 'null' THEN member.v END;
            ELSIF member.field IN ('name', 'key', 'count') THEN
                PERFORM rate_limiter._raise('argument', format('requests: "%s" must be %s, got %s', member.field,
                    CASE member.field WHEN 'name' THEN 'a string' WHEN 'key' THEN 'a string or null' ELSE 'a number' END,
                    rate_limiter._json_text(member.v)));
            ELSE
                PERFORM rate_limiter._raise('argument', format('requests: unknown member "%s" (known: name, key, count, config)', member.field));
            END IF;
        END LOOP;
        PERFORM rate_limiter._arguments(name, key, count);
        FOR j IN 1 .. i - 1 LOOP
            IF names[j] = name AND keys[j] IS NOT DISTINCT FROM key THEN
                PERFORM rate_limiter._raise('argument', format('requests: (%s, %s) appears twice; add the counts instead', name,
                    coalesce('Some(' || rate_limiter._debug(key) || ')', 'None')));
            END IF;
        END LOOP;
        named := rate_limiter._named(name, key, config);
        IF (named.c).mode <> 'all' THEN
            PERFORM rate_limiter._raise('unsupported', format('rate_limit_all takes all or nothing: "%s" has mode ''%s''', name, (named.c).mode));
        END IF;
        IF (named.c).kind = 'concurrency' THEN
            PERFORM rate_limiter._raise('slots', format('rate_limit_all with the concurrency limit "%s"', name));
        END IF;
        IF NOT named.enforce THEN
            PERFORM rate_limiter._raise('unsupported', format('rate_limit_all with the shadow limit "%s"', name));
        END IF;
        PERFORM rate_limiter._usable(name, count, reserve, named.c);
        names := names || name;
        keys := keys || key;
        counts := counts || count;
        configs := configs || named.c;
        stored := stored || named.stored;
        shards := shards || named.shard;
        exempts := exempts || named.exempt;
    END LOOP;
END $$;

-- Several limits decided as limiter/all.rs decides them: a block denies all; an allowed request takes
-- no part; the rest are read and decided without locks, and a denial returns there; else
-- every row is locked in one order (key, then name, bytewise), all are decided again on the
-- locked rows as of the clock read after locking, and written only when all are granted.
CREATE FUNCTION rate_limiter._all(requests jsonb, reserve boolean, consume boolean,
                                  OUT d rate_limiter.decision, OUT limiting_name text, OUT limiting_key text)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    got record;
    n integer;
    names text[];
    keys text[];
    counts float8[];
    configs rate_limiter._config[];
    stored text[];  -- where each request's state lives (its limit's rows, or its inline config's)
    shards integer[];
    answered rate_limiter.decision[] := '{}';
    parts integer[];  -- the requests decided here (neither blocked nor allowed)
    ds rate_limiter.decision[] := '{}';
    afters rate_limiter._state[] := '{}';
    r_part integer[] := '{}';  -- rows looked at: the request (index into parts) each is of,
    r_shard integer[] := '{}';  -- its shard,
    r_state rate_limiter._state[] := '{}';  -- its state as read,
    r_changed boolean[] := '{}';  -- whether the first decision changes it,
    r_at tid[];  -- and where it is, locked
    locked integer[];
    planned record;
    sh integer;
    r integer;
    w_at tid[] := '{}';  -- what is written: where, the state, its config
    w_config rate_limiter._config[] := '{}';
    combined record;
    now float8;
    p integer;
    fresh rate_limiter._state;
BEGIN
    IF requests IS NULL THEN PERFORM rate_limiter._raise('argument', 'requests must not be NULL'); END IF;
    IF consume THEN PERFORM rate_limiter._writable('rate_limit_all()', 'rate_limiter.state'); END IF;
    got := rate_limiter._parts(requests, reserve);
    names := got.names;
    keys := got.keys;
    counts := got.counts;
    configs := got.configs;
    stored := got.stored;
    shards := got.shards;
    n := cardinality(names);

    -- Blocks and allows: a block denies all, an allowed request is ok and takes no part.
    FOR i IN 1 .. n LOOP
        answered := answered || rate_limiter._listed(names[i], keys[i], counts[i], (configs[i]).capacity, (got.exempts)[i]);
    END LOOP;
    IF EXISTS (SELECT FROM unnest(answered) a WHERE NOT a.ok) THEN
        SELECT array_agg(i ORDER BY i) INTO parts FROM generate_series(1, n) i WHERE NOT (answered[i]).ok;
        combined := rate_limiter._combine((SELECT array_agg(answered[i] ORDER BY i) FROM unnest(parts) i));
        d := combined.d;
        limiting_name := names[parts[combined.limiting]];
        limiting_key := keys[parts[combined.limiting]];
        RETURN;
    END IF;
    SELECT array_agg(i ORDER BY i) INTO parts FROM generate_series(1, n) i WHERE (answered[i]).ok IS NULL;
    IF parts IS NULL THEN
        combined := rate_limiter._combine(answered);
        d := combined.d;
        limiting_name := names[combined.limiting];
        limiting_key := keys[combined.limiting];
        RETURN;
    END IF;

    -- Each request's shards looked at, read and decided without locks; a denial (or a check)
    -- returns here. Rows looked at, flat: their request, shard, row and state.
    now := rate_limiter._now();
    FOR j IN 1 .. cardinality(parts) LOOP
        p := parts[j];
        FOREACH sh IN ARRAY rate_limiter._pick_shards((configs[p]).shards,
                                                      CASE WHEN consume THEN rate_limiter._held_shard(stored[p], keys[p]) END) LOOP
            r_part := r_part || j;
            r_shard := r_shard || sh;
            r_state := r_state || rate_limiter._state_of((rate_limiter._read_row(stored[p], keys[p], rate_limiter._stored_shard(shards[p], sh))).row,
                                                         rate_limiter._per_shard(configs[p]), names[p], keys[p], now);
        END LOOP;
        planned := rate_limiter._plan(ARRAY(SELECT r_state[x] FROM generate_series(1, cardinality(r_part)) x WHERE r_part[x] = j ORDER BY x),
                                      rate_limiter._per_shard(configs[p]), (configs[p]).shards, now, names[p], counts[p], reserve);
        ds := ds || planned.d;
        r_changed := r_changed || planned.changed;
    END LOOP;
    IF consume AND NOT EXISTS (SELECT FROM unnest(ds) x WHERE NOT x.ok) THEN
        -- Every row to take from locked in one order, created when missing (full as of the
        -- clock then).
        r_at := array_fill(NULL::tid, ARRAY[cardinality(r_part)]);
        FOR r IN SELECT x FROM generate_series(1, cardinality(r_part)) x WHERE r_changed[x]
                 ORDER BY keys[parts[r_part[x]]] IS NOT NULL, keys[parts[r_part[x]]] COLLATE "C", names[parts[r_part[x]]] COLLATE "C",
                          stored[parts[r_part[x]]] COLLATE "C", r_shard[x] LOOP
            p := parts[r_part[r]];
            LOOP
                r_at[r] := (rate_limiter._lock_row(stored[p], keys[p], rate_limiter._stored_shard(shards[p], r_shard[r]))).at;
                EXIT WHEN r_at[r] IS NOT NULL;
                fresh := rate_limiter._state_of(NULL, rate_limiter._per_shard(configs[p]), names[p], keys[p], rate_limiter._now());
                r_at[r] := rate_limiter._create_row(stored[p], keys[p], rate_limiter._stored_shard(shards[p], r_shard[r]), fresh,
                                                    rate_limiter._per_shard(configs[p]));
                EXIT WHEN r_at[r] IS NOT NULL;  -- else created meanwhile by another: lock theirs
            END LOOP;
            PERFORM rate_limiter._hold_shard(stored[p], keys[p], r_shard[r]);
        END LOOP;
        -- Each request decided again on its locked rows alone, as of the clock read after
        -- locking; all written only when all are granted.
        now := rate_limiter._now();
        ds := '{}';
        afters := '{}';
        FOR j IN 1 .. cardinality(parts) LOOP
            p := parts[j];
            locked := ARRAY(SELECT x FROM generate_series(1, cardinality(r_part)) x WHERE r_part[x] = j AND r_changed[x] ORDER BY x);
            planned := rate_limiter._plan(ARRAY(SELECT rate_limiter._state_of(x, rate_limiter._per_shard(configs[p]), names[p], keys[p], now)
                                                FROM unnest(locked) WITH ORDINALITY l(row_index, n), rate_limiter.state x
                                                WHERE x.ctid OPERATOR(pg_catalog.=) r_at[l.row_index] ORDER BY l.n),
                                          rate_limiter._per_shard(configs[p]), (configs[p]).shards, now, names[p], counts[p], reserve);
            ds := ds || planned.d;
            FOR n IN 1 .. cardinality(locked) LOOP
                IF (planned.changed)[n] THEN
                    w_at := w_at || r_at[locked[n]];
                    afters := afters || (planned.afters)[n];
                    w_config := w_config || rate_limiter._per_shard(configs[p]);
                END IF;
            END LOOP;
        END LOOP;
        IF NOT EXISTS (SELECT FROM unnest(ds) x WHERE NOT x.ok) THEN
            FOR w IN 1 .. cardinality(w_at) LOOP
                PERFORM rate_limiter._store(w_at[w], afters[w], w_config[w]);
            END LOOP;
        END IF;
    END IF;
    combined := rate_limiter._combine(ds);
    d := combined.d;
    limiting_name := names[parts[combined.limiting]];
    limiting_key := keys[parts[combined.limiting]];
END $$;

CREATE FUNCTION rate_limiter.rate_limit_all(requests jsonb, reserve boolean DEFAULT false, throws boolean DEFAULT false)
RETURNS rate_limiter.decision
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record := rate_limiter._all(requests, coalesce(reserve, false), true);
BEGIN
    RETURN rate_limiter._answer(r.d, true, r.limiting_name, r.limiting_key, throws);
END $$;
COMMENT ON FUNCTION rate_limiter.rate_limit_all(jsonb, boolean, boolean) IS
    'Take from several limits at once, all or none: requests is a JSON array of {"name", "key", "count", "config"}.';

CREATE FUNCTION rate_limiter.check_rate_limit_all(requests jsonb, reserve boolean DEFAULT false, throws boolean DEFAULT false)
RETURNS rate_limiter.decision
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record := rate_limiter._all(requests, coalesce(reserve, false), false);
BEGIN
    RETURN rate_limiter._answer(r.d, true, r.limiting_name, r.limiting_key, throws);
END $$;
COMMENT ON FUNCTION rate_limiter.check_rate_limit_all(jsonb, boolean, boolean) IS
    'The answer rate_limit_all would give, without writing or locking anything.';

-- The rate-limit HTTP headers of a decision of rate_limit_all(requests): one policy per limit
-- named, and RateLimit for the limit that denied it, or else the first.
CREATE FUNCTION rate_limiter.http_headers_all(requests jsonb, d rate_limiter.decision, draft integer DEFAULT 11,
                                              partition_key boolean DEFAULT false) RETURNS jsonb
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    got record;
    names text[] := '{}';
    rates float8[] := '{}';
    periods float8[] := '{}';
    concurrent boolean[] := '{}';
    partitions text[] := '{}';
BEGIN
    IF requests IS NULL THEN PERFORM rate_limiter._raise('argument', 'requests must not be NULL'); END IF;
    IF num_nulls(d) = 1 THEN PERFORM rate_limiter._raise('argument', 'd must not be NULL'); END IF;
    got := rate_limiter._parts(requests, false);
    FOR i IN 1 .. cardinality(got.names) LOOP
        CONTINUE WHEN got.names[i] = ANY (names);
        names := names || got.names[i];
        rates := rates || (got.configs[i]).rate;
        periods := periods || (got.configs[i]).period;
        concurrent := concurrent || ((got.configs[i]).kind = 'concurrency');
        partitions := partitions || CASE WHEN partition_key THEN got.keys[i] END;
    END LOOP;
    RETURN rate_limiter._headers(names, rates, periods, concurrent, partitions, coalesce(d.limited_by, names[1]), d, draft);
END $$;
COMMENT ON FUNCTION rate_limiter.http_headers_all(jsonb, rate_limiter.decision, integer, boolean) IS
    'The same headers for a decision of rate_limit_all(requests): one policy per limit named, RateLimit for the limiting one.';
