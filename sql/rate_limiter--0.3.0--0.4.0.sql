-- rate_limiter 0.3.0 -> 0.4.0: nothing that runs with more rights than its caller resolves
-- a name through a schema someone else controls.
-- Run ALTER EXTENSION rate_limiter UPDATE after installing the library.
--
-- Like every script of 0.4.0, this one runs as a superuser with search_path = rate_limiter:
-- every operator and function is qualified with pg_catalog, so that a look-alike planted in
-- the schema is never resolved.

-- CHECK constraints compared a double precision column with an integer literal, which an
-- operator of exact types planted in the schema could take over: create them again, bound to
-- pg_catalog's operators.
ALTER TABLE rate_limiter.limits
    DROP CONSTRAINT limits_name_check,
    DROP CONSTRAINT limits_kind_check,
    DROP CONSTRAINT limits_rate_check,
    DROP CONSTRAINT limits_period_check,
    DROP CONSTRAINT limits_capacity_check,
    DROP CONSTRAINT limits_max_reserved_check,
    DROP CONSTRAINT limits_shards_check,
    DROP CONSTRAINT limits_start_check,
    DROP CONSTRAINT limits_min_gap_check,
    DROP CONSTRAINT limits_mode_check,
    DROP CONSTRAINT limits_buckets_check,
    DROP CONSTRAINT limits_lock_timeout_check,
    DROP CONSTRAINT limits_on_lock_timeout_check,
    DROP CONSTRAINT limits_deny_cache_check,
    DROP CONSTRAINT limits_deny_cache_is_for_one_row_per_key_in_mode_all,
    DROP CONSTRAINT limits_one_row_per_key_for_lock_timeout,
    DROP CONSTRAINT limits_buckets_are_for_rolling_window,
    DROP CONSTRAINT limits_one_row_per_key_for_min_gap_and_modes,
    DROP CONSTRAINT limits_start_is_for_windows,
    DROP CONSTRAINT limits_capacity_is_rate,
    DROP CONSTRAINT limits_reservations_are_for_token_bucket_and_fixed_window;
ALTER TABLE rate_limiter.limits
    ADD CONSTRAINT limits_name_check CHECK (name OPERATOR(pg_catalog.<>) '' AND pg_catalog.octet_length(name) OPERATOR(pg_catalog.<=) 128),
    ADD CONSTRAINT limits_kind_check CHECK (kind OPERATOR(pg_catalog.=) ANY (ARRAY['token bucket', 'fixed window', 'sliding window', 'rolling window'])),
    ADD CONSTRAINT limits_rate_check CHECK (rate OPERATOR(pg_catalog.>) 0::pg_catalog.float8 AND rate OPERATOR(pg_catalog.<) 'Infinity'::pg_catalog.float8),
    ADD CONSTRAINT limits_period_check CHECK (period OPERATOR(pg_catalog.>) '0'::pg_catalog.interval),
    ADD CONSTRAINT limits_capacity_check CHECK (capacity OPERATOR(pg_catalog.>=) 0::pg_catalog.float8 AND capacity OPERATOR(pg_catalog.<) 'Infinity'::pg_catalog.float8),
    ADD CONSTRAINT limits_max_reserved_check CHECK (max_reserved OPERATOR(pg_catalog.>=) 0::pg_catalog.float8 AND max_reserved OPERATOR(pg_catalog.<) 'Infinity'::pg_catalog.float8),
    ADD CONSTRAINT limits_shards_check CHECK (shards OPERATOR(pg_catalog.>=) 1 AND shards OPERATOR(pg_catalog.<=) 1024),
    ADD CONSTRAINT limits_start_check CHECK (pg_catalog.isfinite(start)),
    ADD CONSTRAINT limits_min_gap_check CHECK (min_gap OPERATOR(pg_catalog.>=) '0'::pg_catalog.interval),
    ADD CONSTRAINT limits_mode_check CHECK (mode OPERATOR(pg_catalog.=) ANY (ARRAY['all', 'partial', 'penalize'])),
    ADD CONSTRAINT limits_buckets_check CHECK (buckets OPERATOR(pg_catalog.>=) 1 AND buckets OPERATOR(pg_catalog.<=) 64),
    ADD CONSTRAINT limits_lock_timeout_check CHECK (lock_timeout OPERATOR(pg_catalog.>=) '0'::pg_catalog.interval),
    ADD CONSTRAINT limits_on_lock_timeout_check CHECK (on_lock_timeout OPERATOR(pg_catalog.=) ANY (ARRAY['deny', 'allow'])),
    ADD CONSTRAINT limits_deny_cache_check CHECK (deny_cache OPERATOR(pg_catalog.>=) '0'::pg_catalog.interval),
    ADD CONSTRAINT limits_deny_cache_is_for_one_row_per_key_in_mode_all
        CHECK (deny_cache IS NULL OR (shards OPERATOR(pg_catalog.=) 1 AND mode OPERATOR(pg_catalog.=) 'all')),
    ADD CONSTRAINT limits_one_row_per_key_for_lock_timeout
        CHECK (shards OPERATOR(pg_catalog.=) 1 OR lock_timeout IS NULL),
    ADD CONSTRAINT limits_buckets_are_for_rolling_window
        CHECK (kind OPERATOR(pg_catalog.=) 'rolling window' OR buckets IS NULL),
    ADD CONSTRAINT limits_one_row_per_key_for_min_gap_and_modes
        CHECK (shards OPERATOR(pg_catalog.=) 1 OR (min_gap IS NULL AND mode OPERATOR(pg_catalog.=) 'all')),
    ADD CONSTRAINT limits_start_is_for_windows
        CHECK (kind OPERATOR(pg_catalog.<>) 'token bucket' OR start IS NULL),
    ADD CONSTRAINT limits_capacity_is_rate
        CHECK (kind OPERATOR(pg_catalog.=) ANY (ARRAY['token bucket', 'fixed window']) OR capacity IS NULL OR capacity OPERATOR(pg_catalog.=) rate),
    ADD CONSTRAINT limits_reservations_are_for_token_bucket_and_fixed_window
        CHECK (kind OPERATOR(pg_catalog.=) ANY (ARRAY['token bucket', 'fixed window']) OR max_reserved IS NULL);
ALTER TABLE rate_limiter.blocks
    DROP CONSTRAINT blocks_name_check,
    DROP CONSTRAINT blocks_key_check,
    ADD CONSTRAINT blocks_name_check CHECK (name OPERATOR(pg_catalog.<>) '' AND pg_catalog.octet_length(name) OPERATOR(pg_catalog.<=) 128),
    ADD CONSTRAINT blocks_key_check CHECK (pg_catalog.octet_length(key) OPERATOR(pg_catalog.<=) 1024);

-- SECURITY DEFINER functions and the cache trigger run with a search_path of their own.
ALTER FUNCTION rate_limiter.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval)
    SET search_path TO pg_catalog, pg_temp;
ALTER FUNCTION rate_limiter.block(text, text, timestamptz, text) SET search_path TO pg_catalog, pg_temp;
ALTER FUNCTION rate_limiter.unblock(text, text) SET search_path TO pg_catalog, pg_temp;
ALTER FUNCTION rate_limiter.reset_rate_limit(text, text) SET search_path TO pg_catalog, pg_temp;
ALTER FUNCTION rate_limiter.prune(integer) SET search_path TO pg_catalog, pg_temp;
ALTER FUNCTION rate_limiter._limits_changed() SET search_path = pg_catalog, pg_temp;

-- A stable key for a client address. An IPv4-mapped IPv6 address (::ffff:0:0/96, decided by
-- its bits, however it was written) is the IPv4 address it maps; the address, its own mask
-- dropped, is masked to v4_prefix or v6_prefix, and the key is that network as cidr text.
-- In SQL so that the text is PostgreSQL's own cidr output.
CREATE FUNCTION rate_limiter.ip_key(addr inet, v4_prefix integer DEFAULT 32, v6_prefix integer DEFAULT 56)
RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path TO pg_catalog, pg_temp
AS $function$
DECLARE
    address inet := pg_catalog.set_masklen(addr, CASE pg_catalog.family(addr) WHEN 4 THEN 32 ELSE 128 END);
BEGIN
    IF v4_prefix OPERATOR(pg_catalog.<) 0 OR v4_prefix OPERATOR(pg_catalog.>) 32 THEN
        RAISE EXCEPTION 'rate_limiter: v4_prefix must be between 0 and 32, not %', v4_prefix
            USING ERRCODE = 'invalid_parameter_value', HINT = '32 keys each IPv4 address on its own; 24 keys its /24.';
    END IF;
    IF v6_prefix OPERATOR(pg_catalog.<) 0 OR v6_prefix OPERATOR(pg_catalog.>) 128 THEN
        RAISE EXCEPTION 'rate_limiter: v6_prefix must be between 0 and 128, not %', v6_prefix
            USING ERRCODE = 'invalid_parameter_value', HINT = '56 (the default) keys a typical customer''s whole IPv6 allocation; 64 keys one subnet.';
    END IF;
    IF address OPERATOR(pg_catalog.<<=) '::ffff:0.0.0.0/96'::inet THEN
        address := '0.0.0.0'::inet OPERATOR(pg_catalog.+) (address OPERATOR(pg_catalog.-) '::ffff:0.0.0.0'::inet);
    END IF;
    RETURN pg_catalog.network(pg_catalog.set_masklen(address,
        CASE pg_catalog.family(address) WHEN 4 THEN v4_prefix ELSE v6_prefix END))::text;
END
$function$;
COMMENT ON FUNCTION rate_limiter.ip_key(inet, integer, integer) IS
    'A rate-limit key for a client address: IPv4-mapped IPv6 as its IPv4 address, IPv4 masked to v4_prefix, IPv6 to v6_prefix, as cidr text.';
REVOKE ALL ON FUNCTION rate_limiter.ip_key(inet, integer, integer) FROM PUBLIC;

-- The allow list (0.4.0).
-- Keys never limited (rate_limiter.allow()): a call for an allowed pair is ok without its
-- state being read. Shaped as rate_limiter.blocks; a NULL name allows the key under every
-- limit. A block of the same pair wins.
CREATE TABLE rate_limiter.allows (
    name text COLLATE "C"
        CONSTRAINT allows_name_check CHECK (name OPERATOR(pg_catalog.<>) '' AND pg_catalog.octet_length(name) OPERATOR(pg_catalog.<=) 128),
    key text COLLATE "C"
        CONSTRAINT allows_key_check CHECK (pg_catalog.octet_length(key) OPERATOR(pg_catalog.<=) 1024),
    until timestamptz NOT NULL DEFAULT 'infinity',
    note text,
    created timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT allows_key_name_key UNIQUE NULLS NOT DISTINCT (key, name)
);
COMMENT ON TABLE rate_limiter.allows IS
    'Allowed keys: a call for (name, key) is ok with reason ''allowed'', its state neither read nor written, until until; a block of the same pair wins. Manage with rate_limiter.allow() and disallow().';
COMMENT ON COLUMN rate_limiter.allows.name IS 'The limit whose key is allowed; NULL allows the key under every limit.';
COMMENT ON COLUMN rate_limiter.allows.key IS 'The allowed key; NULL is the limit''s shared NULL key.';
COMMENT ON COLUMN rate_limiter.allows.until IS 'Allowed until this instant; ''infinity'' until disallowed. rate_limiter.prune() deletes allows that have ended.';
COMMENT ON COLUMN rate_limiter.allows.note IS 'Why, for the operator.';
COMMENT ON COLUMN rate_limiter.allows.created IS 'When the allow was made or last changed.';
SELECT pg_catalog.pg_extension_config_dump('rate_limiter.allows', '');
CREATE TRIGGER allows_changed
    AFTER INSERT OR UPDATE OR DELETE ON rate_limiter.allows
    FOR EACH ROW EXECUTE FUNCTION rate_limiter._limits_changed();
CREATE TRIGGER allows_truncated
    AFTER TRUNCATE ON rate_limiter.allows
    FOR EACH STATEMENT EXECUTE FUNCTION rate_limiter._limits_changed();
ALTER TABLE rate_limiter.allows ENABLE ALWAYS TRIGGER allows_changed;
ALTER TABLE rate_limiter.allows ENABLE ALWAYS TRIGGER allows_truncated;
CREATE FUNCTION rate_limiter."allow"(
	"name" TEXT,
	"key" TEXT,
	"until" timestamp with time zone DEFAULT 'infinity',
	"note" TEXT DEFAULT NULL
) RETURNS void
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'allow_wrapper';
CREATE FUNCTION rate_limiter."disallow"(
	"name" TEXT,
	"key" TEXT
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'disallow_wrapper';
REVOKE ALL ON TABLE rate_limiter.allows FROM PUBLIC;
REVOKE ALL ON FUNCTION rate_limiter.allow(text, text, timestamptz, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION rate_limiter.disallow(text, text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter.allow(text, text, timestamptz, text) IS
    'Never limit (name, key) until until (NULL name: under every limit): calls are ok with reason ''allowed'', state untouched; a block wins. Replaces an earlier allow of the pair.';
COMMENT ON FUNCTION rate_limiter.disallow(text, text) IS
    'Lift the allow of (name, key); returns whether there was one.';
COMMENT ON FUNCTION rate_limiter.prune(integer) IS
    'Delete up to max_rows rows of rate_limiter.state that hold what a fresh state would, or belong to named limits that no longer exist, and blocks and allows that have ended; returns how many. Skips rows in use.';
COMMENT ON COLUMN rate_limiter.decision.reason IS 'Why the call was denied: ''exhausted'' (no tokens for it), ''min_gap'' (too soon after the last granted call), ''blocked'' (see rate_limiter.blocks), ''timeout'' (wait_rate_limit waited and its timeout came first) or ''lock_timeout'' (the row stayed locked past the limit''s lock_timeout; also with ok when on_lock_timeout is ''allow''); ''allowed'' with ok when the key is in rate_limiter.allows; otherwise NULL.';

-- Credits (0.4.0).
CREATE FUNCTION rate_limiter.credit(
    name text,
    key text DEFAULT NULL,
    count double precision DEFAULT 1,
    config jsonb DEFAULT NULL
) RETURNS rate_limiter.decision
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'credit_fmgr';
REVOKE ALL ON FUNCTION rate_limiter.credit(text, text, double precision, jsonb) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter.credit(text, text, double precision, jsonb) IS
    'Give count tokens back to (name, key) inside the caller''s transaction, as much as the limit still counts (a token bucket up to capacity); returns the decision after it, granted minus what was given back.';

-- Every database's statistics, for superusers and pg_monitor (0.4.0).
CREATE FUNCTION rate_limiter.stats_every_database() RETURNS TABLE (
    database text,
    name text,
    calls bigint,
    allowed bigint,
    denied bigint,
    tokens_granted double precision,
    tokens_reserved double precision,
    last_allowed_at timestamptz,
    last_denied_at timestamptz,
    stats_reset timestamptz
)
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'stats_every_database_wrapper';
CREATE FUNCTION rate_limiter.top_denied_every_database() RETURNS TABLE (
    database text,
    name text,
    key text,
    denied bigint,
    approximate_error bigint
)
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'top_denied_every_database_wrapper';
REVOKE ALL ON FUNCTION rate_limiter.stats_every_database() FROM PUBLIC;
REVOKE ALL ON FUNCTION rate_limiter.top_denied_every_database() FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter.stats_every_database() IS
    'The rows of rate_limiter.stats of every database, with its name (superusers and pg_monitor members only).';
COMMENT ON FUNCTION rate_limiter.top_denied_every_database() IS
    'The rows of rate_limiter.top_denied of every database, with its name (superusers and pg_monitor members only).';
COMMENT ON FUNCTION rate_limiter._limits_changed() IS
    'Internal: trigger that invalidates every backend''s cache of rate_limiter.limits, rate_limiter.blocks and rate_limiter.allows.';

-- Hot limits (docs/hot-limits.md): a limit that concurrent transactions consume without
-- queueing on its row.
ALTER TABLE rate_limiter.limits
    ADD COLUMN hot boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT limits_hot_is_one_row_in_mode_all
        CHECK (NOT hot OR (shards OPERATOR(pg_catalog.=) 1 AND mode OPERATOR(pg_catalog.=) 'all' AND min_gap IS NULL AND lock_timeout IS NULL));
COMMENT ON COLUMN rate_limiter.limits.hot IS 'Concurrent transactions consume it without queueing on its row: admitted against shared memory, each call logged in rate_limiter.debits (needs shared_preload_libraries; see docs/hot-limits.md).';
-- The log of hot limits (docs/hot-limits.md): one row per consuming call, inserted by the
-- caller's transaction, so that calls on one key never wait for each other's row locks;
-- folded into the key's row of rate_limiter.state now and then. Numbered from one counter
-- in shared memory, so the primary key is the number alone (and the replica identity).
CREATE TABLE rate_limiter.debits (
    seq bigint CONSTRAINT debits_pkey PRIMARY KEY,
    name text COLLATE "C" NOT NULL,
    key text COLLATE "C",
    at timestamptz NOT NULL,
    count double precision NOT NULL
);
COMMENT ON TABLE rate_limiter.debits IS
    'Calls to hot limits not yet folded into rate_limiter.state: the state of a hot (name, key) is its state row with these applied in seq order. Written only by the rate_limiter functions.';
COMMENT ON COLUMN rate_limiter.debits.seq IS 'Admission order, from a counter in shared memory.';
COMMENT ON COLUMN rate_limiter.debits.name IS 'The hot limit''s name.';
COMMENT ON COLUMN rate_limiter.debits.key IS 'The key; NULL for the NULL key.';
COMMENT ON COLUMN rate_limiter.debits.at IS 'The instant the call was admitted at.';
COMMENT ON COLUMN rate_limiter.debits.count IS 'The tokens it took.';
-- As the install's REVOKE ALL ON ALL TABLES leaves it: only the owner, explicitly.
REVOKE ALL ON rate_limiter.debits FROM PUBLIC;

-- define() takes hot. A function's arguments cannot change in place: create it again, and
-- give back the EXECUTE grants it had.
DO $$
DECLARE
    grantee pg_catalog.regrole;
    grantees pg_catalog.regrole[];
BEGIN
    SELECT pg_catalog.array_agg(a.grantee::pg_catalog.regrole) INTO grantees
    FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
    WHERE p.oid OPERATOR(pg_catalog.=) 'rate_limiter.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval)'::pg_catalog.regprocedure
      AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
      AND a.grantee OPERATOR(pg_catalog.<>) p.proowner AND a.grantee OPERATOR(pg_catalog.<>) 0::pg_catalog.oid;
    DROP FUNCTION rate_limiter.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval);
    CREATE FUNCTION rate_limiter."define"(
        "name" TEXT,
        "kind" TEXT,
        "rate" double precision,
        "period" interval,
        "capacity" double precision DEFAULT NULL,
        "max_reserved" double precision DEFAULT NULL,
        "shards" INT DEFAULT 1,
        "start" timestamp with time zone DEFAULT NULL,
        "min_gap" interval DEFAULT NULL,
        "mode" TEXT DEFAULT 'all',
        "buckets" INT DEFAULT NULL,
        "lock_timeout" interval DEFAULT NULL,
        "on_lock_timeout" TEXT DEFAULT 'deny',
        "deny_cache" interval DEFAULT NULL,
        "hot" bool DEFAULT false
    ) RETURNS void
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE
    SET search_path TO pg_catalog, pg_temp
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'define_since_0_4_0_wrapper';
    REVOKE ALL ON FUNCTION rate_limiter.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean) FROM PUBLIC;
    COMMENT ON FUNCTION rate_limiter.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean) IS
        'Create or replace a named limit in rate_limiter.limits.';
    -- A regrole's text is the role's name quoted as an identifier already: %s, not %I.
    FOREACH grantee IN ARRAY coalesce(grantees, '{}') LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION rate_limiter.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean) TO %s', grantee);
    END LOOP;
END $$;
