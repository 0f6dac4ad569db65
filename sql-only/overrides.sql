-- Overrides and tiers (docs/api.md, "Overrides: a key's own numbers"): a key of a named limit
-- decided under numbers of its own or its tier's, counted in the same rows, as the
-- extension's overrides.rs and api/admin.rs.

-- The override of (name, key) in force now, its numbers (a tier's, looked up) and whether it
-- exempts the key; in_force false when the key has none (overrides.rs numbers_of).
CREATE FUNCTION rate_limiter._override_numbers(name text, key text, OUT in_force boolean, OUT rate double precision,
    OUT period interval, OUT capacity double precision, OUT max_reserved double precision, OUT min_gap interval,
    OUT exempt boolean)
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    o rate_limiter.overrides;
    t rate_limiter.tiers;
BEGIN
    in_force := false;
    -- A NULL key its own probe of the index (name, key), as the lists' are.
    IF key IS NULL THEN
        SELECT * INTO o FROM rate_limiter.overrides x WHERE x.name = _override_numbers.name AND x.key IS NULL;
    ELSE
        SELECT * INTO o FROM rate_limiter.overrides x WHERE x.name = _override_numbers.name AND x.key = _override_numbers.key;
    END IF;
    IF o.name IS NULL OR rate_limiter._ms(o.until) <= rate_limiter._now() THEN
        RETURN;
    END IF;
    IF o.tier IS NOT NULL THEN
        SELECT * INTO t FROM rate_limiter.tiers x WHERE x.name = o.name AND x.tier = o.tier;
        IF NOT FOUND THEN PERFORM rate_limiter._raise('unknown_tier', o.tier, o.name); END IF;
        o.rate := t.rate; o.period := t.period; o.capacity := t.capacity;
        o.max_reserved := t.max_reserved; o.min_gap := t.min_gap; o.exempt := t.exempt;
    END IF;
    in_force := true;
    rate := o.rate; period := o.period; capacity := o.capacity;
    max_reserved := o.max_reserved; min_gap := o.min_gap; exempt := o.exempt;
END $$;

-- The limit's row `l` with the override of `key` in force now in place of its numbers (as
-- config/overrides.rs applied_to: a capacity not given follows a rate that is), and whether
-- it exempts the key; `l` itself and false when the key has none.
CREATE FUNCTION rate_limiter._overridden(l rate_limiter.limits, key text, OUT applied rate_limiter.limits, OUT exempt boolean)
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    o record;
BEGIN
    o := rate_limiter._override_numbers(l.name, key);
    applied := CASE WHEN o.in_force THEN rate_limiter._with_numbers(l, o.rate, o.period, o.capacity, o.max_reserved, o.min_gap) ELSE l END;
    exempt := o.in_force AND o.exempt;
END $$;

-- The overrides in force (their own numbers) and the tiers of the limit `l` checked under its
-- new row, as a call would check them (overrides.rs fit): the first that does not fit raises
-- what its key's calls would. The overrides by key (bytes, the NULL key first), then the tiers.
CREATE FUNCTION rate_limiter._overrides_fit(l rate_limiter.limits) RETURNS void
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n record;
BEGIN
    IF l.kind = 'concurrency' AND EXISTS (SELECT FROM rate_limiter.overrides o WHERE o.name = l.name AND o.until <> 'infinity') THEN
        PERFORM rate_limiter._raise('unsupported', format('the limit "%s" has overrides with an end (until), which a concurrency limit''s cannot have: remove_override() them first', l.name));
    END IF;
    FOR n IN SELECT o.rate, o.period, o.capacity, o.max_reserved, o.min_gap FROM rate_limiter.overrides o
             WHERE o.name = l.name AND o.tier IS NULL AND rate_limiter._ms(o.until) > rate_limiter._now()
             ORDER BY o.key COLLATE "C" NULLS FIRST LOOP
        PERFORM rate_limiter._config_of(rate_limiter._with_numbers(l, n.rate, n.period, n.capacity, n.max_reserved, n.min_gap));
    END LOOP;
    FOR n IN SELECT t.rate, t.period, t.capacity, t.max_reserved, t.min_gap FROM rate_limiter.tiers t
             WHERE t.name = l.name ORDER BY t.tier COLLATE "C" LOOP
        PERFORM rate_limiter._config_of(rate_limiter._with_numbers(l, n.rate, n.period, n.capacity, n.max_reserved, n.min_gap));
    END LOOP;
END $$;

-- An inline config's members with an override's numbers in place of the call's own (as
-- config/overrides.rs in_json: a period and a minimum gap as interval text, a capacity not
-- given following a rate that is, a member's aliases replaced by it).
CREATE FUNCTION rate_limiter._in_json(config jsonb, rate double precision, period interval, capacity double precision,
                                      max_reserved double precision, min_gap interval) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF rate IS NOT NULL THEN config := config || jsonb_build_object('rate', rate); END IF;
    IF period IS NOT NULL THEN config := config || jsonb_build_object('period', period::text); END IF;
    IF capacity IS NOT NULL OR rate IS NOT NULL THEN config := config || jsonb_build_object('capacity', capacity); END IF;
    IF max_reserved IS NOT NULL THEN
        config := config - 'max_reserved' || jsonb_build_object('maxReserved', max_reserved);
    END IF;
    IF min_gap IS NOT NULL THEN config := config - 'min_gap' || jsonb_build_object('minGap', min_gap::text); END IF;
    RETURN config;
END $$;

-- The limit's row with these numbers in place of its own (NULL: its own; a capacity not given
-- follows a rate that is, as define's does).
CREATE FUNCTION rate_limiter._with_numbers(l rate_limiter.limits, rate double precision, period interval,
                                           capacity double precision, max_reserved double precision, min_gap interval)
RETURNS rate_limiter.limits
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    l.capacity := CASE WHEN capacity IS NOT NULL OR rate IS NOT NULL THEN capacity ELSE l.capacity END;
    l.rate := coalesce(rate, l.rate);
    l.period := coalesce(period, l.period);
    l.max_reserved := coalesce(max_reserved, l.max_reserved);
    l.min_gap := coalesce(min_gap, l.min_gap);
    RETURN l;
END $$;

-- The named limit `name` (42704 when there is none), its numbers replaced by these and
-- checked as a limit's row is (overrides.rs applied): what override() and define_tier()
-- accept. A change of a concurrency limit's numbers waits for the transactions holding its
-- slots, as a change of the limit does.
CREATE FUNCTION rate_limiter._applied(name text, rate double precision, period interval, capacity double precision,
                                      max_reserved double precision, min_gap interval) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    l rate_limiter.limits;
BEGIN
    -- Locked to the end of the transaction: a DELETE or rename of the limit waits for the
    -- override() or define_tier() that checked it, and its trigger then deletes that row too;
    -- so does define()'s update (FOR SHARE, which an update of other columns waits for), whose
    -- check of the overrides then sees this one.
    SELECT * INTO l FROM rate_limiter.limits x WHERE x.name = _applied.name FOR SHARE;
    IF NOT FOUND THEN PERFORM rate_limiter._raise('unknown', name); END IF;
    PERFORM rate_limiter._config_of(rate_limiter._with_numbers(l, rate, period, capacity, max_reserved, min_gap));
    IF l.kind = 'concurrency' THEN
        LOCK TABLE rate_limiter.leases IN SHARE ROW EXCLUSIVE MODE;
    END IF;
END $$;

CREATE FUNCTION rate_limiter.override(name text, key text, rate double precision DEFAULT NULL, period interval DEFAULT NULL,
    capacity double precision DEFAULT NULL, max_reserved double precision DEFAULT NULL, min_gap interval DEFAULT NULL,
    exempt boolean DEFAULT false, tier text DEFAULT NULL, until timestamptz DEFAULT 'infinity', note text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t rate_limiter.tiers;
BEGIN
    PERFORM rate_limiter._writable('override()', 'rate_limiter.overrides');
    PERFORM rate_limiter._valid_name(name);
    PERFORM rate_limiter._valid_key(key);
    IF exempt IS NULL THEN PERFORM rate_limiter._raise('argument', 'exempt must not be NULL'); END IF;
    IF until IS NULL THEN PERFORM rate_limiter._raise('argument', 'until must not be NULL; use ''infinity'''); END IF;
    PERFORM rate_limiter._applied(name, rate, period, capacity, max_reserved, min_gap);
    -- Its end would let the slots it allowed be taken again under the limit's own number
    -- while its holders still hold theirs: remove_override() waits for them.
    IF until <> 'infinity' AND (SELECT x.kind FROM rate_limiter.limits x WHERE x.name = override.name) = 'concurrency' THEN
        PERFORM rate_limiter._raise('unsupported', format('an override of the concurrency limit "%s" with an end: remove_override() it when it is to end', name));
    END IF;
    IF tier IS NOT NULL THEN
        IF num_nonnulls(rate, period, capacity, max_reserved, min_gap) > 0 OR exempt THEN
            PERFORM rate_limiter._raise('argument', 'an override names a tier or gives numbers (or exempt), not both');
        END IF;
        -- Locked, so that remove_tier() waits for this override and then sees it.
        SELECT * INTO t FROM rate_limiter.tiers x WHERE x.name = override.name AND x.tier = override.tier FOR KEY SHARE;
        IF NOT FOUND THEN PERFORM rate_limiter._raise('unknown_tier', tier, name); END IF;
        PERFORM rate_limiter._applied(name, t.rate, t.period, t.capacity, t.max_reserved, t.min_gap);
    END IF;
    INSERT INTO rate_limiter.overrides AS o (name, key, tier, rate, period, capacity, max_reserved, min_gap, exempt, until, note)
    VALUES (name, key, tier, rate, period, capacity, max_reserved, min_gap, exempt, until, note)
    ON CONFLICT ON CONSTRAINT overrides_name_key_key DO UPDATE
    SET tier = excluded.tier, rate = excluded.rate, period = excluded.period, capacity = excluded.capacity,
        max_reserved = excluded.max_reserved, min_gap = excluded.min_gap, exempt = excluded.exempt,
        until = excluded.until, note = excluded.note, created = pg_catalog.now();
END $$;
COMMENT ON FUNCTION rate_limiter.override IS
    'Give (name, key) numbers of its own (define''s names; NULL: the limit''s), exempt it, or put it in a tier, until until: its calls are decided under them, its count kept.';

CREATE FUNCTION rate_limiter.remove_override(name text, key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    l rate_limiter.limits;
BEGIN
    PERFORM rate_limiter._writable('remove_override()', 'rate_limiter.overrides');
    PERFORM rate_limiter._valid_name(name);
    PERFORM rate_limiter._valid_key(key);
    SELECT * INTO l FROM rate_limiter.limits x WHERE x.name = remove_override.name;
    IF l.kind = 'concurrency' THEN
        LOCK TABLE rate_limiter.leases IN SHARE ROW EXCLUSIVE MODE;
    END IF;
    DELETE FROM rate_limiter.overrides o WHERE o.name = remove_override.name AND o.key IS NOT DISTINCT FROM remove_override.key;
    RETURN FOUND;
END $$;
COMMENT ON FUNCTION rate_limiter.remove_override IS 'Take back the override of (name, key); returns whether there was one. Its count is kept.';

-- A tier's name: a non-empty text of at most 128 bytes (api/admin.rs valid_tier).
CREATE FUNCTION rate_limiter._valid_tier(tier text) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF tier IS NULL OR tier = '' OR octet_length(tier) > 128 THEN
        PERFORM rate_limiter._raise('argument', 'tier must be a non-empty text of at most 128 bytes');
    END IF;
END $$;

CREATE FUNCTION rate_limiter.define_tier(name text, tier text, rate double precision DEFAULT NULL, period interval DEFAULT NULL,
    capacity double precision DEFAULT NULL, max_reserved double precision DEFAULT NULL, min_gap interval DEFAULT NULL,
    exempt boolean DEFAULT false, note text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rate_limiter._writable('define_tier()', 'rate_limiter.tiers');
    PERFORM rate_limiter._valid_name(name);
    PERFORM rate_limiter._valid_tier(tier);
    IF exempt IS NULL THEN PERFORM rate_limiter._raise('argument', 'exempt must not be NULL'); END IF;
    PERFORM rate_limiter._applied(name, rate, period, capacity, max_reserved, min_gap);
    INSERT INTO rate_limiter.tiers AS t (name, tier, rate, period, capacity, max_reserved, min_gap, exempt, note)
    VALUES (name, tier, rate, period, capacity, max_reserved, min_gap, exempt, note)
    ON CONFLICT ON CONSTRAINT tiers_pkey DO UPDATE
    SET rate = excluded.rate, period = excluded.period, capacity = excluded.capacity,
        max_reserved = excluded.max_reserved, min_gap = excluded.min_gap, exempt = excluded.exempt,
        note = excluded.note, created = pg_catalog.now();
END $$;
COMMENT ON FUNCTION rate_limiter.define_tier IS
    'Create or replace a tier of the named limit: numbers (NULL: the limit''s) that each override naming it gives its key.';

-- A removal that must see every override committed before it: an override() that commits
-- while it waits for the row the override locked is seen by a READ COMMITTED statement, never
-- by an older snapshot, and SQL has no other (the extension reads the latest snapshot, as a
-- foreign key's check does). Refused elsewhere rather than leaving an override naming nothing.
CREATE FUNCTION rate_limiter._read_committed(what text) RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM rate_limiter._raise('isolation', what, current_setting('transaction_isolation'));
    END IF;
END $$;

CREATE FUNCTION rate_limiter.remove_tier(name text, tier text) RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    naming bigint;
BEGIN
    PERFORM rate_limiter._writable('remove_tier()', 'rate_limiter.tiers');
    PERFORM rate_limiter._valid_name(name);
    PERFORM rate_limiter._valid_tier(tier);
    PERFORM rate_limiter._read_committed('remove_tier()');
    -- The tier locked first: an override() naming it that has not committed yet holds it, and
    -- is waited for and then counted.
    PERFORM FROM rate_limiter.tiers t WHERE t.name = remove_tier.name AND t.tier = remove_tier.tier FOR UPDATE;
    SELECT count(*) INTO naming FROM rate_limiter.overrides o WHERE o.name = remove_tier.name AND o.tier = remove_tier.tier;
    IF naming > 0 THEN
        PERFORM rate_limiter._raise('tier_in_use', tier, name, naming::text);
    END IF;
    DELETE FROM rate_limiter.tiers t WHERE t.name = remove_tier.name AND t.tier = remove_tier.tier;
    RETURN FOUND;
END $$;
COMMENT ON FUNCTION rate_limiter.remove_tier IS 'Remove a tier of the named limit that no override names; returns whether there was one.';

-- A limit's overrides and tiers go with it (a DELETE, a TRUNCATE, a new name), as the
-- extension's trigger deletes them: none is left to come back with a limit defined again
-- under the name.
CREATE FUNCTION rate_limiter._overrides_follow_their_limit() RETURNS trigger
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- It writes with the owner's rights: refused, as every write is, where a trigger or rule
    -- was planted on the tables it writes.
    PERFORM rate_limiter._writable('a change of rate_limiter.limits', 'rate_limiter.overrides', 'rate_limiter.tiers');
    -- A limit that goes (define() only updates): see _read_committed.
    IF TG_OP <> 'UPDATE' THEN
        PERFORM rate_limiter._read_committed(TG_OP || ' of rate_limiter.limits');
    END IF;
    DELETE FROM rate_limiter.overrides o WHERE NOT EXISTS (SELECT FROM rate_limiter.limits l WHERE l.name = o.name);
    DELETE FROM rate_limiter.tiers t WHERE NOT EXISTS (SELECT FROM rate_limiter.limits l WHERE l.name = t.name);
    RETURN NULL;
END $$;
CREATE TRIGGER limits_keep_overrides AFTER UPDATE OR DELETE OR TRUNCATE ON rate_limiter.limits
FOR EACH STATEMENT EXECUTE FUNCTION rate_limiter._overrides_follow_their_limit();
COMMENT ON TRIGGER limits_keep_overrides ON rate_limiter.limits IS
    'A limit''s overrides and tiers go with it: deleted, renamed or truncated.';
