-- The planning (bucket/plan.rs, with bucket/modes.rs): what a call does to the shards it
-- looked at, and what it answers.

-- What one call decides on one state at now (bucket::plan for one shard, with what a denial
-- does instead by mode, bucket/modes.rs; Outcome::decision): the decision, and the state to
-- write when the call changes it (an ok call; a denial in the penalize mode; a level written
-- under another capacity), else NULL.
CREATE FUNCTION rate_limiter._decide(s rate_limiter._state, c rate_limiter._config, now double precision, name text,
                                     count double precision, reserve boolean,
                                     OUT d rate_limiter.decision, OUT after rate_limiter._state)
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    took rate_limiter._check := rate_limiter._check(s, c, now, count, coalesce(reserve, false));
    refilled rate_limiter._check;
    amount float8;
    part rate_limiter._check;
    penalized rate_limiter._check;
BEGIN
    IF NOT took.ok AND c.mode = 'partial' AND took.reason = 'exhausted' THEN
        -- As much of count as there is now, whole tokens when count is whole.
        amount := (rate_limiter._check(s, c, now, 0, false)).available;
        amount := least(CASE WHEN count = trunc(count) THEN floor(amount) ELSE amount END, count);
        IF amount > 0 THEN
            part := rate_limiter._check(s, c, now, amount, false);
            IF part.ok THEN
                after := ROW(part.value, part.ts, part.granted_at, part.counts)::rate_limiter._state;
                d := ROW(true, took.retry_after, part.available, greatest(0::float8, rate_limiter._reset_after(after, c, now)),
                         amount, NULL, NULL)::rate_limiter.decision;
                RETURN;
            END IF;
        END IF;
    ELSIF NOT took.ok AND c.mode = 'penalize' THEN
        -- Denied, and counted down to -capacity; the gap keeps counting from the last grant.
        refilled := rate_limiter._check(s, c, now, 0, false);
        penalized := rate_limiter._check(s, c, now, greatest(least(count, refilled.value + c.capacity), 0::float8), false);
        after := ROW(penalized.value, penalized.ts, took.granted_at, penalized.counts)::rate_limiter._state;
        d := ROW(false, (rate_limiter._check(after, c, now, count, false)).retry_after,
                 (rate_limiter._check(after, c, now, 0, false)).available,
                 greatest(0::float8, rate_limiter._reset_after(after, c, now)), 0, took.reason, name)::rate_limiter.decision;
        RETURN;
    END IF;
    IF took.ok THEN
        after := ROW(took.value, took.ts, took.granted_at, took.counts)::rate_limiter._state;
        d := ROW(true, took.retry_after, took.available, greatest(0::float8, rate_limiter._reset_after(after, c, now)),
                 count, NULL, NULL)::rate_limiter.decision;
    ELSE
        refilled := rate_limiter._check(s, c, now, 0, false);
        d := ROW(false, took.retry_after, refilled.available,
                 greatest(0::float8, rate_limiter._reset_after(ROW(refilled.value, refilled.ts, refilled.granted_at, refilled.counts)::rate_limiter._state, c, now)),
                 0, took.reason, name)::rate_limiter.decision;
        -- A level written under another capacity (numbers changed since) is written all the
        -- same, as it reads now, with an expiry under the numbers in force (limiter/rows.rs
        -- remarked): prune() keeps the row while the key still owes what it used.
        IF array_length(s.counts, 1) = 1 AND s.counts[1] < 0 AND array_length(refilled.counts, 1) = 1
           AND refilled.counts[1] < 0 AND refilled.counts[1] <> s.counts[1] THEN
            after := ROW(refilled.value, refilled.ts, refilled.granted_at, refilled.counts)::rate_limiter._state;
        END IF;
    END IF;
END $$;

-- What a call does to the states of the shards it looked at (bucket::plan, then
-- Outcome::decision): the decision, each shard's state after the call, and whether the call
-- changed it. `c` is one shard's config; `shards` the limit's.
CREATE FUNCTION rate_limiter._plan(states rate_limiter._state[], c rate_limiter._config, shards integer, now double precision,
                                   name text, count double precision, reserve boolean,
                                   OUT d rate_limiter.decision, OUT afters rate_limiter._state[], OUT changed boolean[])
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    one rate_limiter._check;
    two rate_limiter._check;
    refilled rate_limiter._check[];
    after rate_limiter._check[];
    taken boolean[] := ARRAY[false, false];
    denied rate_limiter._check;
    balance float8;
    retry float8;
    single record;
    ok boolean;
    granted float8 := 0;
    total float8 := 0;
BEGIN
    IF cardinality(states) = 1 THEN
        single := rate_limiter._decide(states[1], c, now, name, count, reserve);
        changed := ARRAY[NOT (single.after IS NULL)];  -- a row IS NOT NULL only when no column is
        afters := ARRAY[coalesce(single.after, states[1])];
        d := single.d;
        d.remaining := d.remaining * shards::float8;
        RETURN;
    END IF;
    refilled := ARRAY[rate_limiter._check(states[1], c, now, 0, false), rate_limiter._check(states[2], c, now, 0, false)];
    one := rate_limiter._check(states[1], c, now, count, reserve);
    two := rate_limiter._check(states[2], c, now, count, reserve);
    after := refilled;
    IF one.ok AND two.ok THEN
        IF one.available > two.available THEN after[1] := one; taken[1] := true; denied := one;
        ELSE after[2] := two; taken[2] := true; denied := two; END IF;
        ok := true;
    ELSIF one.ok THEN
        after[1] := one; taken[1] := true; denied := one; ok := true;
    ELSIF two.ok THEN
        after[2] := two; taken[2] := true; denied := two; ok := true;
    ELSE
        -- Neither can serve alone: take from both so they end level.
        balance := one.available + two.available + count;
        one := rate_limiter._check(states[1], c, now, one.available + count - balance / 2, reserve);
        two := rate_limiter._check(states[2], c, now, two.available + count - balance / 2, reserve);
        retry := CASE WHEN one.retry_after IS NULL AND two.retry_after IS NULL THEN NULL
                      ELSE greatest(coalesce(one.retry_after, 0), coalesce(two.retry_after, 0)) END;
        denied := one;
        denied.retry_after := retry;
        ok := one.ok AND two.ok;
        IF ok THEN after := ARRAY[one, two]; taken := ARRAY[true, true]; END IF;
    END IF;
    IF ok THEN granted := count; END IF;
    changed := taken;
    afters := ARRAY[ROW((after[1]).value, (after[1]).ts, (after[1]).granted_at, (after[1]).counts)::rate_limiter._state,
                    ROW((after[2]).value, (after[2]).ts, (after[2]).granted_at, (after[2]).counts)::rate_limiter._state];
    total := (after[1]).available + (after[2]).available;
    d := ROW(ok, denied.retry_after, total * shards::float8 / 2,
             greatest(0::float8, rate_limiter._reset_after(afters[1], c, now), rate_limiter._reset_after(afters[2], c, now)),
             granted, CASE WHEN NOT ok THEN denied.reason END, CASE WHEN NOT ok THEN name END)::rate_limiter.decision;
END $$;

-- Give count back to the shards looked at (bucket::plan_credit): to the emptiest of them now
-- (the first of equals), up to what it takes back.
CREATE FUNCTION rate_limiter._plan_credit(states rate_limiter._state[], c rate_limiter._config, shards integer, now double precision,
                                          count double precision,
                                          OUT d rate_limiter.decision, OUT afters rate_limiter._state[], OUT changed boolean[])
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer := cardinality(states);
    refilled rate_limiter._check;
    available float8[] := '{}';
    emptiest integer := 1;
    credited record;
    total float8 := 0;
    reset float8 := 0;
BEGIN
    afters := '{}';
    FOR i IN 1 .. n LOOP
        refilled := rate_limiter._check(states[i], c, now, 0, false);
        afters := afters || ROW(refilled.value, refilled.ts, refilled.granted_at, refilled.counts)::rate_limiter._state;
        available := available || refilled.available;
        IF refilled.available < available[emptiest] THEN emptiest := i; END IF;
    END LOOP;
    credited := rate_limiter._credited(states[emptiest], c, now, count);
    afters[emptiest] := credited.after;
    available[emptiest] := credited.available;
    changed := array_fill(false, ARRAY[n]);
    changed[emptiest] := credited.given > 0;
    FOR i IN 1 .. n LOOP
        total := total + available[i];
        reset := greatest(reset, rate_limiter._reset_after(afters[i], c, now));
    END LOOP;
    d := ROW(true, NULL, total * shards::float8 / n, reset, 0::float8 - credited.given, NULL, NULL)::rate_limiter.decision;
END $$;
