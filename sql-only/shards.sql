-- Sharded limits (shards > 1), as src/limiter/rows.rs and bucket::plan keep them: the limit
-- split evenly over `shards` rows of (name, key); a call looks at one random shard, or at two
-- distinct ones from 3 shards up (the power of two choices), takes from the one that can
-- serve alone (the fuller when both can) or from both so they end level, and reports an
-- estimate of the whole limit from the shards it looked at. Where the extension skips a shard
-- another transaction holds and picks again, the edition waits for it, locking in ascending
-- shard order from the highest shard of the key its transaction holds (_held_shard), so that
-- no two transactions wait for each other: which shards a call looks at is random in both,
-- and what it answers is the same arithmetic.

-- Config::per_shard: rate, capacity and max_reserved divided evenly, a limit of one shard.
CREATE FUNCTION rate_limiter._per_shard(c rate_limiter._config) RETURNS rate_limiter._config
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF c.shards = 1 THEN RETURN c; END IF;
    c.rate := c.rate / c.shards::float8;
    c.capacity := c.capacity / c.shards::float8;
    c.max_reserved := c.max_reserved / c.shards::float8;
    c.shards := 1;
    c.split := true;
    RETURN c;
END $$;

-- The shards a call looks at: one at random, or two distinct ones from 3 shards up, from
-- `lowest` up (a call that will lock them: _held_shard).
CREATE FUNCTION rate_limiter._pick_shards(shards integer, lowest integer DEFAULT 0) RETURNS integer[]
LANGUAGE sql VOLATILE PARALLEL UNSAFE
BEGIN ATOMIC
    SELECT pg_catalog.array_agg(i) FROM (SELECT i FROM pg_catalog.generate_series(LEAST(COALESCE(lowest, 0), shards OPERATOR(pg_catalog.-) 1),
                                                                                  shards OPERATOR(pg_catalog.-) 1) i
                                         ORDER BY pg_catalog.random()
                                         LIMIT CASE WHEN shards OPERATOR(pg_catalog.>=) 3 THEN 2 ELSE 1 END) picked;
END;

-- The highest shard of (stored, key) whose row this transaction holds locked (its earlier
-- calls took from it), or NULL. A call locks only shards from it up, in ascending order, so
-- that two transactions that each took from a key never wait for each other in their next
-- calls (40P01). Kept in a setting local to the transaction, which a rolled-back savepoint
-- takes back with the locks (a setting prefixed rate_limiter. is the extension's).
CREATE FUNCTION rate_limiter._held_shard(stored text, key text) RETURNS integer
LANGUAGE sql STABLE PARALLEL SAFE
BEGIN ATOMIC
    SELECT (NULLIF(pg_catalog.current_setting('rate_limiter_edition.held_shards', true), '')::pg_catalog.jsonb
            OPERATOR(pg_catalog.->>) pg_catalog.md5(stored OPERATOR(pg_catalog.||) E'\x1f' OPERATOR(pg_catalog.||)
                                                    COALESCE(key, E'\x1e')))::integer;
END;

-- Notes that this transaction holds the row of `shard` of (stored, key) locked.
CREATE FUNCTION rate_limiter._hold_shard(stored text, key text, shard integer) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    held jsonb := coalesce(nullif(current_setting('rate_limiter_edition.held_shards', true), '')::jsonb, '{}');
    k text := md5(stored || E'\x1f' || coalesce(key, E'\x1e'));
BEGIN
    IF coalesce((held ->> k)::integer >= shard, false) THEN RETURN; END IF;
    PERFORM set_config('rate_limiter_edition.held_shards', (held || jsonb_build_object(k, shard))::text, true);
END $$;

-- The `shard` column of shard i: i for a named limit (base 0), -1 - i for an inline config
-- (base -1).
CREATE FUNCTION rate_limiter._stored_shard(base integer, i integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN base OPERATOR(pg_catalog.=) 0 THEN i ELSE -1 OPERATOR(pg_catalog.-) i END;

-- The row of shard `shard` of (stored, key) locked without waiting for another transaction
-- (a shard below one this transaction holds, where a wait could close a cycle: 40P01), or
-- busy. Created as `s` when missing: a concurrent creation is waited for 1 ms at most.
CREATE FUNCTION rate_limiter._lock_row_nowait(stored text, key text, shard integer, s rate_limiter._state,
                                              c rate_limiter._config, OUT at tid, OUT "row" rate_limiter.state, OUT busy boolean)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    found record;
    prior text := current_setting('lock_timeout');
BEGIN
    busy := false;
    SELECT x.ctid AS at, x AS found_row INTO found FROM rate_limiter.state x
    WHERE x.key IS NOT DISTINCT FROM _lock_row_nowait.key AND x.name = stored AND x.shard = _lock_row_nowait.shard
    FOR UPDATE SKIP LOCKED;
    IF found.at IS NOT NULL THEN
        at := found.at;
        "row" := found.found_row;
        RETURN;
    END IF;
    IF (rate_limiter._read_row(stored, key, shard)).at IS NOT NULL THEN
        busy := true;  -- another transaction holds it
        RETURN;
    END IF;
    BEGIN
        PERFORM set_config('lock_timeout', '1ms', true);
        at := rate_limiter._create_row(stored, key, shard, s, c);
        PERFORM set_config('lock_timeout', prior, true);
    EXCEPTION WHEN lock_not_available THEN
        at := NULL;
    END;
    busy := at IS NULL;
END $$;

-- Take count from a sharded (name, key), or give it back (crediting): the shards looked at
-- read without a lock and planned on; a denial returns there. Taking from one shard, its row
-- is written when it is the version read (created when missing); otherwise, or taking from
-- two, the rows are locked in ascending shard order (created full when missing), and the
-- call is decided again on the locked rows alone, as of the clock read after locking. A shard
-- below the highest one of the key this transaction holds (its earlier calls') is locked only
-- if that needs no wait; if it would, the call looks again from that highest shard up.
CREATE FUNCTION rate_limiter._take_sharded(whole rate_limiter._config, stored text, base integer, name text, key text,
                                           count double precision, reserve boolean, crediting boolean)
RETURNS rate_limiter.decision
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c rate_limiter._config := rate_limiter._per_shard(whole);
    held integer;
    lowest integer := 0;
    picked integer[];
    states rate_limiter._state[];
    ats tid[];
    now float8;
    planned record;
    taking integer[];
    row_ record;
    at tid;
    locked_states rate_limiter._state[];
    locked_ats tid[];
    looked_order integer[];
    i integer;
BEGIN
    <<attempt>>
    LOOP
        held := rate_limiter._held_shard(stored, key);
        picked := rate_limiter._pick_shards(whole.shards, lowest);
        states := '{}';
        ats := '{}';
        now := rate_limiter._now();
        FOREACH i IN ARRAY picked LOOP
            row_ := rate_limiter._read_row(stored, key, rate_limiter._stored_shard(base, i));
            ats := ats || row_.at;
            states := states || rate_limiter._state_of(row_.row, c, name, key, now);
        END LOOP;
        planned := CASE WHEN crediting THEN rate_limiter._plan_credit(states, c, whole.shards, now, count)
                        ELSE rate_limiter._plan(states, c, whole.shards, now, name, count, reserve) END;
        SELECT array_agg(j ORDER BY picked[j]) INTO taking FROM generate_series(1, cardinality(picked)) j WHERE (planned.changed)[j];
        IF taking IS NULL THEN RETURN planned.d; END IF;  -- nothing changes: nothing written, no lock
        IF cardinality(taking) = 1 AND (held IS NULL OR picked[taking[1]] >= held) THEN
            i := taking[1];
            IF ats[i] IS NULL THEN
                IF rate_limiter._create_row(stored, key, rate_limiter._stored_shard(base, picked[i]), (planned.afters)[i], c) IS NOT NULL THEN
                    PERFORM rate_limiter._hold_shard(stored, key, picked[i]);
                    RETURN planned.d;
                END IF;
            ELSE
                at := (rate_limiter._lock_row(stored, key, rate_limiter._stored_shard(base, picked[i]))).at;
                PERFORM rate_limiter._hold_shard(stored, key, picked[i]);
                IF at = ats[i] THEN
                    PERFORM rate_limiter._store(at, (planned.afters)[i], c);
                    RETURN planned.d;
                END IF;
            END IF;
        END IF;
        -- Every shard to change, locked in ascending order, created full when missing.
        locked_states := states;
        locked_ats := array_fill(NULL::tid, ARRAY[cardinality(picked)]);
        FOREACH i IN ARRAY taking LOOP
            IF picked[i] < held THEN
                row_ := rate_limiter._lock_row_nowait(stored, key, rate_limiter._stored_shard(base, picked[i]),
                                                      rate_limiter._state_of(NULL, c, name, key, rate_limiter._now()), c);
                IF row_.busy THEN
                    lowest := held;
                    CONTINUE attempt;
                END IF;
                locked_ats[i] := row_.at;
                locked_states[i] := CASE WHEN row_.row IS NULL THEN rate_limiter._state_of(NULL, c, name, key, rate_limiter._now())
                                         ELSE rate_limiter._state_of(row_.row, c, name, key, now) END;
            ELSE
                LOOP
                    row_ := rate_limiter._lock_row(stored, key, rate_limiter._stored_shard(base, picked[i]));
                    IF row_.at IS NOT NULL THEN
                        locked_ats[i] := row_.at;
                        locked_states[i] := rate_limiter._state_of(row_.row, c, name, key, now);
                        EXIT;
                    END IF;
                    states[i] := rate_limiter._state_of(NULL, c, name, key, rate_limiter._now());
                    at := rate_limiter._create_row(stored, key, rate_limiter._stored_shard(base, picked[i]), states[i], c);
                    IF at IS NOT NULL THEN
                        locked_ats[i] := at;
                        locked_states[i] := states[i];
                        EXIT;
                    END IF;
                END LOOP;
            END IF;
            PERFORM rate_limiter._hold_shard(stored, key, picked[i]);
        END LOOP;
        -- Decided again on the locked rows alone, in the order they were looked at.
        SELECT array_agg(j ORDER BY j) INTO looked_order FROM unnest(taking) j;
        now := rate_limiter._now();
        states := ARRAY(SELECT locked_states[j] FROM unnest(looked_order) WITH ORDINALITY o(j, n) ORDER BY n);
        planned := CASE WHEN crediting THEN rate_limiter._plan_credit(states, c, whole.shards, now, count)
                        ELSE rate_limiter._plan(states, c, whole.shards, now, name, count, reserve) END;
        FOR n IN 1 .. cardinality(looked_order) LOOP
            IF (planned.changed)[n] THEN
                PERFORM rate_limiter._store(locked_ats[looked_order[n]], (planned.afters)[n], c);
            END IF;
        END LOOP;
        RETURN planned.d;
    END LOOP;
END $$;

-- check_rate_limit of a sharded (name, key): the shards looked at, as of the snapshot.
CREATE FUNCTION rate_limiter._check_sharded(whole rate_limiter._config, stored text, base integer, name text, key text,
                                            count double precision, reserve boolean)
RETURNS rate_limiter.decision
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c rate_limiter._config := rate_limiter._per_shard(whole);
    states rate_limiter._state[] := '{}';
    now float8 := rate_limiter._now();
    i integer;
BEGIN
    FOREACH i IN ARRAY rate_limiter._pick_shards(whole.shards) LOOP
        states := states || rate_limiter._state_of((rate_limiter._read_row(stored, key, rate_limiter._stored_shard(base, i))).row,
                                                   c, name, key, now);
    END LOOP;
    RETURN (rate_limiter._plan(states, c, whole.shards, now, name, count, reserve)).d;
END $$;

-- The fullest as of now of `sample` random shards (the last of equals), and which
-- (rows::value).
CREATE FUNCTION rate_limiter._value_sharded(whole rate_limiter._config, stored text, base integer, name text, key text,
                                            sample integer, OUT s rate_limiter._state, OUT shard integer)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c rate_limiter._config := rate_limiter._per_shard(whole);
    now float8 := rate_limiter._now();
    one rate_limiter._state;
    best float8;
    i integer;
BEGIN
    FOR i IN SELECT x FROM generate_series(0, whole.shards - 1) x ORDER BY random() LIMIT least(greatest(sample, 1), whole.shards) LOOP
        one := rate_limiter._state_of((rate_limiter._read_row(stored, key, rate_limiter._stored_shard(base, i))).row, c, name, key, now);
        IF best IS NULL OR (rate_limiter._check(one, c, now, 0, false)).available >= best THEN
            best := (rate_limiter._check(one, c, now, 0, false)).available;
            s := one;
            shard := i;
        END IF;
    END LOOP;
END $$;
