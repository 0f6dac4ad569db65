-- Concurrency limits (src/limiter/concurrency.rs, bucket/concurrency.rs): a call takes `count`
-- of the `rate` slots of (name, key) or is denied. A slot is held by a transaction (a
-- transaction-level advisory lock, until the transaction or the subtransaction that took it
-- ends) or by a lease (a row of rate_limiter.leases, until it expires or is released). The
-- slots of one (name, key) are searched one call at a time, under a session-level advisory
-- lock held only for the search: under it, a slot nobody locks is free unless a lease holds
-- it, and the leases are read again after the takes, so that a lease whose transaction
-- committed meanwhile (releasing its locks) is seen. That takes READ COMMITTED: a snapshot
-- kept for the transaction would not see that lease, and the call would admit one too many.

-- A secret of this install: it keys the advisory locks of the slots, which any role that can
-- connect may take (pg_advisory_lock is PUBLIC's), so that none can compute them.
CREATE TABLE rate_limiter._secret (secret bytea NOT NULL);
INSERT INTO rate_limiter._secret
SELECT pg_catalog.decode(pg_catalog.replace(pg_catalog.gen_random_uuid()::text OPERATOR(pg_catalog.||) pg_catalog.gen_random_uuid()::text, '-', ''), 'hex');
COMMENT ON TABLE rate_limiter._secret IS 'The SQL-only edition''s secret: 32 random bytes that key the advisory locks of concurrency limits'' slots. Its owner''s alone.';
COMMENT ON COLUMN rate_limiter._secret.secret IS 'The secret bytes (from gen_random_uuid, PostgreSQL''s strong random source).';

-- The advisory lock of slot `slot` of (stored, key), -1 its search lock: SHA-256 of the
-- install's secret, so that no role can name another's slots (the extension's lock tags are
-- beyond SQL's reach; an advisory lock is anyone's to take, but not to compute).
CREATE FUNCTION rate_limiter._slot_lock(stored text, key text, slot integer) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
BEGIN ATOMIC
    SELECT ('x' OPERATOR(pg_catalog.||) pg_catalog.encode(pg_catalog.substr(pg_catalog.sha256(
        (SELECT s.secret FROM rate_limiter._secret s LIMIT 1)
        OPERATOR(pg_catalog.||) pg_catalog.convert_to('rate_limiter edition slots 1', 'UTF8') OPERATOR(pg_catalog.||) '\x00'::bytea
        OPERATOR(pg_catalog.||) pg_catalog.convert_to(stored, 'UTF8')
        OPERATOR(pg_catalog.||) CASE WHEN key IS NULL THEN '\x00'::bytea
                                     ELSE '\x01'::bytea OPERATOR(pg_catalog.||) pg_catalog.convert_to(key, 'UTF8') END
        OPERATOR(pg_catalog.||) pg_catalog.int4send(slot)), 1, 8), 'hex'))::bit(64)::bigint;
END;

-- The slots of (stored, key) whose lock a transaction holds now (this one's among them).
CREATE FUNCTION rate_limiter._locked_slots(stored text, key text, rate integer) RETURNS integer[]
LANGUAGE sql VOLATILE PARALLEL UNSAFE
BEGIN ATOMIC
    SELECT COALESCE(pg_catalog.array_agg(s.slot ORDER BY s.slot), '{}')
    FROM pg_catalog.generate_series(0, rate OPERATOR(pg_catalog.-) 1) AS s(slot)
    WHERE EXISTS (SELECT FROM pg_catalog.pg_locks l
                  WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory' AND l.objsubid OPERATOR(pg_catalog.=) 1 AND l.granted
                    AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                                                           WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
                    AND ((l.classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) l.objid::pg_catalog.int8)
                        OPERATOR(pg_catalog.=) rate_limiter._slot_lock(stored, key, s.slot));
END;

-- This transaction's held slot locks: every bigint advisory lock of this backend (what it
-- holds of the server's shared lock table this way).
CREATE FUNCTION rate_limiter._held_here() RETURNS integer
LANGUAGE sql VOLATILE PARALLEL UNSAFE
BEGIN ATOMIC
    SELECT pg_catalog.count(*)::integer FROM pg_catalog.pg_locks l
    WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory' AND l.objsubid OPERATOR(pg_catalog.=) 1 AND l.granted
      AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid();
END;

-- The slots of (stored, key) that unexpired leases hold at now (read with the latest
-- snapshot of a read committed statement), and when the soonest and the latest end.
CREATE FUNCTION rate_limiter._leased(stored text, key text, now double precision,
                                     OUT leased integer[], OUT soonest double precision, OUT latest double precision)
LANGUAGE sql VOLATILE PARALLEL UNSAFE
BEGIN ATOMIC
    SELECT COALESCE(pg_catalog.array_agg(l.slot ORDER BY l.slot), '{}'), pg_catalog.min(rate_limiter._ms(l.expires_at)),
           pg_catalog.max(rate_limiter._ms(l.expires_at))
    FROM rate_limiter.leases l
    WHERE l.name OPERATOR(pg_catalog.=) stored AND l.expires_at OPERATOR(pg_catalog.>) rate_limiter._ts(now)
      AND (l.key OPERATOR(pg_catalog.=) _leased.key OR (l.key IS NULL AND _leased.key IS NULL));
END;

-- At most 32 slot locks a transaction (the extension's rate_limiter.max_slots_per_transaction,
-- its default): each is an entry of the lock table every database shares. 53400 otherwise.
CREATE FUNCTION rate_limiter._within_slots_per_transaction(asked integer) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    held integer := rate_limiter._held_here();
BEGIN
    IF asked > 0 AND held + asked > 32 THEN
        RAISE EXCEPTION 'this transaction holds % concurrency slots and asks for % more, over rate_limiter.max_slots_per_transaction (32)',
            held, asked USING ERRCODE = '53400',
            HINT = 'Each slot a transaction holds is an entry of the server''s shared lock table, which every database shares. Hold fewer at once: end the transaction, or take slots by lease in transactions of their own (a committed lease holds its slots with no lock). A superuser may raise rate_limiter.max_slots_per_transaction, well inside max_locks_per_transaction.';
    END IF;
END $$;

-- The answer to a call for `count` slots of a limit of `rate` slots and `period`, given what
-- was held besides what the call took (bucket::concurrency::answer, limiter::decision).
CREATE FUNCTION rate_limiter._slots_decision(name text, rate double precision, period double precision, held integer,
    by_transactions integer, soonest double precision, latest double precision, count double precision, took boolean,
    now double precision) RETURNS rate_limiter.decision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    free float8 := rate - held;
    ok boolean := took OR count <= free;
    reset float8 := greatest(CASE WHEN latest IS NULL THEN 0::float8 ELSE greatest(latest - now, 0::float8) END,
                             CASE WHEN by_transactions > 0 THEN period ELSE 0::float8 END);
BEGIN
    RETURN ROW(ok,
               CASE WHEN NOT ok THEN CASE WHEN soonest IS NULL THEN period ELSE least(greatest(soonest - now, 0::float8), period) END END,
               CASE WHEN took THEN free - count ELSE free END,
               CASE WHEN took AND count > 0 THEN greatest(reset, period) ELSE reset END,
               CASE WHEN took THEN count ELSE 0 END,
               CASE WHEN NOT ok THEN 'exhausted' END,
               CASE WHEN NOT ok THEN name END)::rate_limiter.decision;
END $$;

-- Take `want` slots of (stored, key) (0: take none, only answer), held by this transaction
-- and, with lease_ms, by a lease until then; the decision and the lease's id.
CREATE FUNCTION rate_limiter._take_slots(c rate_limiter._config, stored text, name text, key text, count double precision,
                                         acquiring boolean, lease_ms double precision, OUT d rate_limiter.decision, OUT lease_id uuid)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    rate integer := c.rate::integer;
    want integer := CASE WHEN acquiring THEN count::integer ELSE 0 END;
    search bigint := rate_limiter._slot_lock(stored, key, -1);
    now float8;
    leased integer[];
    locked integer[];
    taken integer[] := '{}';
    lost integer[];
    soonest float8;
    latest float8;
    before integer[];
    searching boolean := false;
    pause float8 := 1;
    held integer;
    by_transactions integer;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM rate_limiter._raise('edition', format('a concurrency limit''s slots in a %s transaction (the SQL-only edition sees leases committed meanwhile only in read committed)',
            current_setting('transaction_isolation')));
    END IF;
    PERFORM rate_limiter._within_slots_per_transaction(want);
    -- A call that changes the limit waits for every transaction that called a concurrency
    -- limit, and keeps new ones out until it commits (the trigger on rate_limiter.limits).
    LOCK TABLE rate_limiter.leases IN ROW EXCLUSIVE MODE;
    BEGIN
        -- The search lock is the session's (a transaction's would keep other calls out until
        -- this one ends): taken by polling inside this block, so that an error or a cancel at
        -- any point gives it back, and waited for no longer than the statement may run.
        LOOP
            searching := pg_try_advisory_lock(search);
            EXIT WHEN searching;
            PERFORM pg_sleep(pause / 1000);
            pause := least(pause * 2, 20);
        END LOOP;
        now := rate_limiter._now();
        SELECT * INTO leased, soonest, latest FROM rate_limiter._leased(stored, key, now);
        LOOP
            -- Slots locked by transactions; those this call has taken are its own count.
            locked := ARRAY(SELECT unnest(rate_limiter._locked_slots(stored, key, rate)) EXCEPT SELECT unnest(taken));
            -- Free slots, taken in slot order while wanted and all the call asks for fits.
            IF cardinality(ARRAY(SELECT unnest(leased) UNION SELECT unnest(locked))) + count <= rate THEN
                FOR s IN 0 .. rate - 1 LOOP
                    EXIT WHEN cardinality(taken) >= want;
                    CONTINUE WHEN s = ANY (leased) OR s = ANY (locked) OR s = ANY (taken);
                    IF pg_try_advisory_xact_lock(rate_limiter._slot_lock(stored, key, s)) THEN
                        taken := taken || s;
                    ELSE
                        locked := locked || s;  -- locked since it was read
                    END IF;
                END LOOP;
            END IF;
            -- A lease whose transaction committed since the read holds its slot: read again
            -- now that the locks are ours.
            before := leased;
            SELECT * INTO leased, soonest, latest FROM rate_limiter._leased(stored, key, now);
            lost := ARRAY(SELECT unnest(taken) INTERSECT SELECT unnest(leased));
            taken := ARRAY(SELECT unnest(taken) EXCEPT SELECT unnest(lost) ORDER BY 1);
            EXIT WHEN cardinality(lost) = 0 AND (cardinality(taken) = want
                OR NOT EXISTS (SELECT unnest(before) EXCEPT SELECT unnest(leased) EXCEPT SELECT unnest(locked)));
        END LOOP;
        -- What others hold as this search found it (a holder that has ended since counts
        -- still: the answer is of the moment the slots were judged).
        locked := ARRAY(SELECT unnest(locked) EXCEPT SELECT unnest(taken));
        held := cardinality(ARRAY(SELECT unnest(leased) UNION SELECT unnest(locked)));
        by_transactions := cardinality(ARRAY(SELECT unnest(locked) EXCEPT SELECT unnest(leased)));
        PERFORM pg_advisory_unlock(search);
        searching := false;
    EXCEPTION WHEN OTHERS OR query_canceled THEN
        IF searching THEN PERFORM pg_advisory_unlock(search); END IF;
        RAISE;
    END;
    IF NOT acquiring OR cardinality(taken) < want OR held + count > rate THEN
        -- Denied: a slot it took stays locked until the transaction ends (a transaction-level
        -- lock is not given back), counted as held by a transaction for the others.
        d := rate_limiter._slots_decision(name, c.rate, c.period, held, by_transactions, soonest, latest, count, false, now);
        RETURN;
    END IF;
    IF lease_ms IS NOT NULL AND want > 0 THEN
        lease_id := gen_random_uuid();
        INSERT INTO rate_limiter.leases AS l (name, key, slot, lease_id, expires_at)
        SELECT stored, key, s, lease_id, rate_limiter._ts(now + lease_ms) FROM unnest(taken) s
        ON CONFLICT ON CONSTRAINT leases_name_key_slot_key DO UPDATE SET lease_id = excluded.lease_id, expires_at = excluded.expires_at;
    END IF;
    d := rate_limiter._slots_decision(name, c.rate, c.period, held, by_transactions, soonest, latest, count, true, now);
END $$;

-- A change of rate_limiter.limits (define, or the owner's own statements) waits for every
-- transaction that called a concurrency limit to end, and keeps new calls out until it
-- commits: a lowered rate is never judged by slots above it that a transaction still holds
-- (as the extension's change of a limit waits).
CREATE FUNCTION rate_limiter._hold_slot_calls_off() RETURNS trigger
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    LOCK TABLE rate_limiter.leases IN SHARE ROW EXCLUSIVE MODE;
    RETURN NULL;
END $$;
CREATE TRIGGER limits_hold_slot_calls_off BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON rate_limiter.limits
FOR EACH STATEMENT EXECUTE FUNCTION rate_limiter._hold_slot_calls_off();
COMMENT ON TRIGGER limits_hold_slot_calls_off ON rate_limiter.limits IS
    'A change of the limits waits for every transaction that called a concurrency limit, and keeps new calls out until it commits.';

-- A lease's length: more than 0, at most a day (the extension's rate_limiter.max_lease, which
-- only a superuser may raise: a setting the edition cannot protect, so its default).
CREATE FUNCTION rate_limiter._lease_ms(lease interval) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ms float8 := rate_limiter._interval_ms(lease);
BEGIN
    IF NOT (ms > 0 AND ms <= 86400000) THEN
        PERFORM rate_limiter._raise('range', format('a lease must be longer than 0 and at most rate_limiter.max_lease (86400 s), not %s ms',
            rate_limiter._display(ms)));
    END IF;
    RETURN ms;
END $$;

CREATE FUNCTION rate_limiter.acquire(name text, key text DEFAULT NULL, count double precision DEFAULT 1,
    lease interval DEFAULT NULL, throws boolean DEFAULT false, config jsonb DEFAULT NULL,
    OUT ok boolean, OUT retry_after double precision, OUT remaining double precision, OUT reset_after double precision,
    OUT granted double precision, OUT reason text, OUT limited_by text, OUT lease_id uuid)
RETURNS record
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ms float8;
    named record;
    d rate_limiter.decision;
    took record;
BEGIN
    PERFORM rate_limiter._arguments(name, key, count);
    IF lease IS NOT NULL THEN ms := rate_limiter._lease_ms(lease); END IF;
    PERFORM rate_limiter._writable('acquire()', 'rate_limiter.leases');
    named := rate_limiter._named(name, key, config);
    IF (named.c).kind <> 'concurrency' THEN
        PERFORM rate_limiter._raise('slots', format('"%s" is a %s, not a concurrency limit: call rate_limit() for it', name, (named.c).kind));
    END IF;
    PERFORM rate_limiter._usable(name, count, false, named.c);
    d := rate_limiter._listed(name, key, count, (named.c).capacity, named.exempt);
    IF d.ok IS NULL THEN
        took := rate_limiter._take_slots(named.c, named.stored, name, key, count, true, ms);
        d := took.d;
        lease_id := took.lease_id;
    END IF;
    d := rate_limiter._answer(d, named.enforce, name, key, throws);
    ok := d.ok; retry_after := d.retry_after; remaining := d.remaining; reset_after := d.reset_after;
    granted := d.granted; reason := d.reason; limited_by := d.limited_by;
END $$;
COMMENT ON FUNCTION rate_limiter.acquire(text, text, double precision, interval, boolean, jsonb) IS
    'Take count slots of the concurrency limit (name, key): held until the caller''s transaction ends, or with lease until it expires or release(); returns a decision and the lease''s id, or raises RL429 with throws.';

-- The rows of the lease `id` of (name, key), under the named limit's name or any inline
-- config's of it.
CREATE FUNCTION rate_limiter._lease_stored(name text, key text, id uuid) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
BEGIN ATOMIC
    SELECT l.name FROM rate_limiter.leases l
    WHERE (l.name OPERATOR(pg_catalog.=) _lease_stored.name
           OR (pg_catalog.left(l.name, -33) OPERATOR(pg_catalog.=) _lease_stored.name
               AND pg_catalog.right(l.name, 33) OPERATOR(pg_catalog.~) '^#[0-9a-f]{32}$'))
      AND (l.key OPERATOR(pg_catalog.=) _lease_stored.key OR (l.key IS NULL AND _lease_stored.key IS NULL))
      AND l.lease_id OPERATOR(pg_catalog.=) id
    LIMIT 1;
END;

CREATE FUNCTION rate_limiter.release(name text, key text, lease_id uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    held boolean;
BEGIN
    PERFORM rate_limiter._valid_name(name);
    PERFORM rate_limiter._valid_key(key);
    IF lease_id IS NULL THEN RETURN false; END IF;
    PERFORM rate_limiter._writable('release()', 'rate_limiter.leases');
    WITH ended AS (
        DELETE FROM rate_limiter.leases l
        WHERE l.name = rate_limiter._lease_stored(release.name, release.key, release.lease_id)
          AND (l.key = release.key OR (l.key IS NULL AND release.key IS NULL)) AND l.lease_id = release.lease_id
        RETURNING l.expires_at > rate_limiter._ts(rate_limiter._now()) AS held)
    SELECT coalesce(bool_or(ended.held), false) INTO held FROM ended;
    RETURN held;
END $$;
COMMENT ON FUNCTION rate_limiter.release(text, text, uuid) IS
    'End a lease of a concurrency limit in the caller''s transaction; returns whether it still held its slots.';

CREATE FUNCTION rate_limiter.renew(name text, key text, lease_id uuid, lease interval) RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ms float8;
    stored text;
    held integer[];
    now float8;
    moved integer;
BEGIN
    IF lease IS NULL THEN PERFORM rate_limiter._raise('argument', 'lease must not be NULL'); END IF;
    ms := rate_limiter._lease_ms(lease);
    PERFORM rate_limiter._valid_name(name);
    PERFORM rate_limiter._valid_key(key);
    IF lease_id IS NULL THEN RETURN false; END IF;
    PERFORM rate_limiter._writable('renew()', 'rate_limiter.leases');
    stored := rate_limiter._lease_stored(name, key, lease_id);
    IF stored IS NULL THEN RETURN false; END IF;
    now := rate_limiter._now();
    held := ARRAY(SELECT l.slot FROM rate_limiter.leases l
                  WHERE l.name = stored AND (l.key = renew.key OR (l.key IS NULL AND renew.key IS NULL))
                    AND l.lease_id = renew.lease_id AND l.expires_at > rate_limiter._ts(now) ORDER BY l.slot);
    IF cardinality(held) = 0 THEN RETURN false; END IF;
    PERFORM rate_limiter._within_slots_per_transaction(cardinality(held));
    -- Its slots locked (waited for, in slot order) until the transaction ends, so that no
    -- call takes them as the old end passes before this commits; judged by the clock then.
    PERFORM pg_advisory_xact_lock(rate_limiter._slot_lock(stored, key, s)) FROM unnest(held) s;
    now := rate_limiter._now();
    UPDATE rate_limiter.leases l SET expires_at = rate_limiter._ts(now + ms)
    WHERE l.name = stored AND (l.key = renew.key OR (l.key IS NULL AND renew.key IS NULL))
      AND l.lease_id = renew.lease_id AND l.expires_at > rate_limiter._ts(now);
    GET DIAGNOSTICS moved = ROW_COUNT;
    RETURN moved = cardinality(held);
END $$;
COMMENT ON FUNCTION rate_limiter.renew(text, text, uuid, interval) IS
    'Move the end of a lease to lease from now in the caller''s transaction; returns false when it had already ended.';
