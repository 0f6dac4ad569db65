-- rate_limiter 0.2.0 -> 0.4.0, straight: what 0.2.0 -> 0.3.0 and 0.3.0 -> 0.4.0 do, written
-- so that a superuser running it resolves nothing through a schema someone else controls.
-- PostgreSQL takes the shortest update path, so this script replaces the released
-- 0.2.0 -> 0.3.0 script (whose unqualified operators an owner of the schema could take over,
-- and which failed on grantees whose names need quoting) on the way to 0.4.0.
-- Run ALTER EXTENSION rate_limiter UPDATE after installing the library.
--
-- It runs as a superuser with search_path = rate_limiter: every operator and function is
-- qualified with pg_catalog (OPERATOR(pg_catalog.op), whose precedence is that of any
-- other operator: hence the parentheses), so that a look-alike planted in the schema is
-- never resolved.

-- Rows written by 0.2.0 do not know when they expire. For named limits, a conservative
-- instant: when the shard has refilled from its stored value, plus one period. Rows of
-- inline configs (whose config is not stored) get one at their next write.
ALTER TABLE rate_limiter.state ADD COLUMN expires timestamptz;
UPDATE rate_limiter.state s SET expires = coalesce((
    SELECT CASE WHEN e.at OPERATOR(pg_catalog.<) 1e11::pg_catalog.float8 THEN pg_catalog.to_timestamp(e.at) ELSE 'infinity' END
    FROM (
        SELECT pg_catalog.date_part('epoch', s.ts)
             OPERATOR(pg_catalog.+) (pg_catalog.date_part('epoch', l.period)
               OPERATOR(pg_catalog.*) ((greatest(coalesce(l.capacity, l.rate)
                   OPERATOR(pg_catalog.-) (s.value OPERATOR(pg_catalog.*) l.shards::pg_catalog.float8), 0::pg_catalog.float8)
                 OPERATOR(pg_catalog./) l.rate) OPERATOR(pg_catalog.+) 1::pg_catalog.float8)) AS at
        FROM rate_limiter.limits l
        WHERE l.name OPERATOR(pg_catalog.=) s.name
    ) e), 'infinity');
ALTER TABLE rate_limiter.state
    ALTER COLUMN expires SET NOT NULL,
    REPLICA IDENTITY FULL;
-- Rows of inline configs are told apart by their shard number (see the comment below).
-- 0.2.0 did not tell them apart: rows of names that are not defined are taken as inline.
UPDATE rate_limiter.state s SET shard = (-1)::pg_catalog.int2 OPERATOR(pg_catalog.-) s.shard
WHERE NOT EXISTS (SELECT FROM rate_limiter.limits l WHERE l.name OPERATOR(pg_catalog.=) s.name);
COMMENT ON COLUMN rate_limiter.state.shard IS
    'Shard number: 0 to shards - 1 for named limits, -1 - shard for inline configs.';
COMMENT ON COLUMN rate_limiter.state.expires IS 'From this instant the row holds what a fresh state would, and rate_limiter.prune() may delete it.';

-- The cache trigger fires always, and per row: an apply worker fires row triggers only.
DROP TRIGGER limits_changed ON rate_limiter.limits;
CREATE TRIGGER limits_changed
    AFTER INSERT OR UPDATE OR DELETE ON rate_limiter.limits
    FOR EACH ROW EXECUTE FUNCTION rate_limiter._limits_changed();
CREATE TRIGGER limits_truncated
    AFTER TRUNCATE ON rate_limiter.limits
    FOR EACH STATEMENT EXECUTE FUNCTION rate_limiter._limits_changed();
ALTER TABLE rate_limiter.limits ENABLE ALWAYS TRIGGER limits_changed;
ALTER TABLE rate_limiter.limits ENABLE ALWAYS TRIGGER limits_truncated;

CREATE FUNCTION rate_limiter."prune"(
	"max_rows" INT DEFAULT 10000
) RETURNS bigint
SECURITY DEFINER
VOLATILE PARALLEL UNSAFE
LANGUAGE c
SET search_path TO pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'prune_wrapper';
REVOKE ALL ON FUNCTION rate_limiter.prune(integer) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter.prune(integer) IS
    'Delete up to max_rows rows of rate_limiter.state that hold what a fresh state would, or belong to named limits that no longer exist; returns how many. Skips rows in use.';

-- The sliding and rolling windows: kinds, their constraints, and the counts they keep
-- beside value.
-- 0.2.0's CHECK constraints compared a double precision column with an integer literal,
-- which an operator of exact types planted in the schema could take over: all of them are
-- created again below, bound to pg_catalog's operators, with the new columns' own.
ALTER TABLE rate_limiter.limits
    DROP CONSTRAINT limits_name_check,
    DROP CONSTRAINT limits_kind_check,
    DROP CONSTRAINT limits_rate_check,
    DROP CONSTRAINT limits_period_check,
    DROP CONSTRAINT limits_capacity_check,
    DROP CONSTRAINT limits_max_reserved_check,
    DROP CONSTRAINT limits_shards_check,
    DROP CONSTRAINT limits_start_check,
    DROP CONSTRAINT limits_start_is_for_fixed_window;
COMMENT ON COLUMN rate_limiter.limits.kind IS '''token bucket'' (continuous refill), ''fixed window'' (rate tokens at each window start), ''sliding window'' (the previous window weighs as it slides out) or ''rolling window'' (at most rate in any period, counted in cells).';
COMMENT ON COLUMN rate_limiter.limits.start IS 'Window kinds: windows (a rolling window''s cells) are aligned to this instant; NULL picks a phase per (name, key).';
ALTER TABLE rate_limiter.state ADD COLUMN counts double precision[];
COMMENT ON COLUMN rate_limiter.state.ts IS 'Token bucket: last update. Fixed and sliding window: start of the window value belongs to. Rolling window: start of the newest cell.';
COMMENT ON COLUMN rate_limiter.state.counts IS 'Sliding window: {tokens taken in the window before ts}. Rolling window: tokens taken per counting cell, oldest first, the last starting at ts. NULL for the other kinds.';

-- The decision says why a call was denied and by which limit (added at the end, so callers
-- that select columns by name or use (rate_limit(...)).ok keep working).
ALTER TYPE rate_limiter.decision ADD ATTRIBUTE reason text, ADD ATTRIBUTE limited_by text;
COMMENT ON COLUMN rate_limiter.decision.reason IS 'Why the call was denied: ''exhausted'' (no tokens for it); NULL when ok.';
COMMENT ON COLUMN rate_limiter.decision.limited_by IS 'The name of the limit that denied the call; NULL when ok.';

-- Minimum gap, modes and a rolling window's cells: settings of a limit, and the instant
-- the gap counts from.
ALTER TABLE rate_limiter.limits
    ADD COLUMN min_gap interval,
    ADD COLUMN mode text NOT NULL DEFAULT 'all',
    ADD COLUMN buckets integer,
    ADD COLUMN lock_timeout interval,
    ADD COLUMN on_lock_timeout text NOT NULL DEFAULT 'deny';
COMMENT ON COLUMN rate_limiter.limits.lock_timeout IS 'Most time a consuming call waits for a row another transaction holds; NULL waits as UPDATE does.';
COMMENT ON COLUMN rate_limiter.limits.on_lock_timeout IS 'When lock_timeout passes: ''deny'' (ok = false) or ''allow'' (ok, granted = 0, unmetered); reason is ''lock_timeout'' either way.';
COMMENT ON COLUMN rate_limiter.limits.buckets IS 'Rolling window: the cells a period is cut into, 1 to 64; NULL means 10.';
ALTER TABLE rate_limiter.limits ADD COLUMN deny_cache interval;
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
COMMENT ON COLUMN rate_limiter.limits.deny_cache IS 'Most time a denial may be answered again from shared memory without reading the state (needs shared_preload_libraries); NULL never.';
COMMENT ON COLUMN rate_limiter.limits.min_gap IS 'Least time between two granted calls of one (name, key); NULL for none.';
COMMENT ON COLUMN rate_limiter.limits.mode IS '''all'' (all of count or nothing), ''partial'' (as much of count as there is) or ''penalize'' (denied calls count too, down to -capacity).';
ALTER TABLE rate_limiter.state ADD COLUMN granted_at timestamptz;
COMMENT ON COLUMN rate_limiter.state.granted_at IS 'The last granted call, while the limit''s min_gap after it has not passed; else NULL.';
COMMENT ON COLUMN rate_limiter.decision.reason IS 'Why the call was denied: ''exhausted'' (no tokens for it), ''min_gap'' (too soon after the last granted call), ''blocked'' (see rate_limiter.blocks), ''timeout'' (wait_rate_limit waited and its timeout came first) or ''lock_timeout'' (the row stayed locked past the limit''s lock_timeout; also with ok when on_lock_timeout is ''allow''); otherwise NULL.';

-- define() takes the new settings. A function's arguments cannot change in place: create it
-- again, and give back the EXECUTE grants it had.
DO $$
DECLARE
    grantee pg_catalog.regrole;
    grantees pg_catalog.regrole[];
BEGIN
    SELECT pg_catalog.array_agg(a.grantee::pg_catalog.regrole) INTO grantees
    FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
    WHERE p.oid OPERATOR(pg_catalog.=) 'rate_limiter.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz)'::pg_catalog.regprocedure
      AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
      AND a.grantee OPERATOR(pg_catalog.<>) p.proowner AND a.grantee OPERATOR(pg_catalog.<>) 0::pg_catalog.oid;
    DROP FUNCTION rate_limiter.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz);
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

-- Several limits at once, all or none.
CREATE FUNCTION rate_limiter.rate_limit_all(
    requests jsonb,
    reserve boolean DEFAULT false,
    throws boolean DEFAULT false
) RETURNS rate_limiter.decision
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'rate_limit_all_fmgr';

CREATE FUNCTION rate_limiter.check_rate_limit_all(
    requests jsonb,
    reserve boolean DEFAULT false,
    throws boolean DEFAULT false
) RETURNS rate_limiter.decision
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'check_rate_limit_all_fmgr';
REVOKE ALL ON FUNCTION rate_limiter.rate_limit_all(jsonb, boolean, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION rate_limiter.check_rate_limit_all(jsonb, boolean, boolean) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter.rate_limit_all(jsonb, boolean, boolean) IS
    'Take from several limits at once, all or none: requests is a JSON array of {"name", "key", "count", "config"}.';
COMMENT ON FUNCTION rate_limiter.check_rate_limit_all(jsonb, boolean, boolean) IS
    'The answer rate_limit_all would give, without writing or locking anything.';

-- HTTP headers for a decision (draft-ietf-httpapi-ratelimit-headers).
CREATE FUNCTION rate_limiter."http_headers"(
	"name" TEXT,
	"d" rate_limiter.decision,
	"config" jsonb DEFAULT NULL
) RETURNS jsonb
STABLE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'http_headers_wrapper';
CREATE FUNCTION rate_limiter."http_headers_all"(
	"requests" jsonb,
	"d" rate_limiter.decision
) RETURNS jsonb
STABLE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'http_headers_all_wrapper';
REVOKE ALL ON FUNCTION rate_limiter.http_headers(text, rate_limiter.decision, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION rate_limiter.http_headers_all(jsonb, rate_limiter.decision) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter.http_headers(text, rate_limiter.decision, jsonb) IS
    'RateLimit-Policy, RateLimit and (when denied) Retry-After headers for a decision of the limit, as a jsonb object.';
COMMENT ON FUNCTION rate_limiter.http_headers_all(jsonb, rate_limiter.decision) IS
    'The HTTP headers for a decision of rate_limit_all(requests): one policy per limit.';

-- Block lists.
-- Keys denied without their state being read (rate_limiter.block()). The unique index leads
-- with key, as the state's does; a NULL name blocks the key under every limit.
CREATE TABLE rate_limiter.blocks (
    name text COLLATE "C"
        CONSTRAINT blocks_name_check CHECK (name OPERATOR(pg_catalog.<>) '' AND pg_catalog.octet_length(name) OPERATOR(pg_catalog.<=) 128),
    key text COLLATE "C"
        CONSTRAINT blocks_key_check CHECK (pg_catalog.octet_length(key) OPERATOR(pg_catalog.<=) 1024),
    until timestamptz NOT NULL DEFAULT 'infinity',
    note text,
    created timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT blocks_key_name_key UNIQUE NULLS NOT DISTINCT (key, name)
);
COMMENT ON TABLE rate_limiter.blocks IS
    'Blocked keys: a call for (name, key) is denied with reason ''blocked'' until until. Manage with rate_limiter.block() and unblock().';
COMMENT ON COLUMN rate_limiter.blocks.name IS 'The limit whose key is blocked; NULL blocks the key under every limit.';
COMMENT ON COLUMN rate_limiter.blocks.key IS 'The blocked key; NULL is the limit''s shared NULL key.';
COMMENT ON COLUMN rate_limiter.blocks.until IS 'Denied until this instant; ''infinity'' until unblocked. rate_limiter.prune() deletes blocks that have ended.';
COMMENT ON COLUMN rate_limiter.blocks.note IS 'Why, for the operator.';
COMMENT ON COLUMN rate_limiter.blocks.created IS 'When the block was made or last changed.';
SELECT pg_catalog.pg_extension_config_dump('rate_limiter.blocks', '');
CREATE TRIGGER blocks_changed
    AFTER INSERT OR UPDATE OR DELETE ON rate_limiter.blocks
    FOR EACH ROW EXECUTE FUNCTION rate_limiter._limits_changed();
CREATE TRIGGER blocks_truncated
    AFTER TRUNCATE ON rate_limiter.blocks
    FOR EACH STATEMENT EXECUTE FUNCTION rate_limiter._limits_changed();
ALTER TABLE rate_limiter.blocks ENABLE ALWAYS TRIGGER blocks_changed;
ALTER TABLE rate_limiter.blocks ENABLE ALWAYS TRIGGER blocks_truncated;
CREATE FUNCTION rate_limiter."block"(
	"name" TEXT,
	"key" TEXT,
	"until" timestamp with time zone DEFAULT 'infinity',
	"note" TEXT DEFAULT NULL
) RETURNS void
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'block_wrapper';
CREATE FUNCTION rate_limiter."unblock"(
	"name" TEXT,
	"key" TEXT
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'unblock_wrapper';
REVOKE ALL ON TABLE rate_limiter.blocks FROM PUBLIC;
REVOKE ALL ON FUNCTION rate_limiter.block(text, text, timestamptz, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION rate_limiter.unblock(text, text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter.block(text, text, timestamptz, text) IS
    'Deny (name, key) until until (NULL name: under every limit), with reason ''blocked''; replaces an earlier block of the pair.';
COMMENT ON FUNCTION rate_limiter.unblock(text, text) IS
    'Lift the block of (name, key); returns whether there was one.';
COMMENT ON FUNCTION rate_limiter._limits_changed() IS
    'Internal: trigger that invalidates every backend''s cache of rate_limiter.limits, rate_limiter.blocks and rate_limiter.allows.';
COMMENT ON FUNCTION rate_limiter.prune(integer) IS
    'Delete up to max_rows rows of rate_limiter.state that hold what a fresh state would, or belong to named limits that no longer exist, and blocks that have ended; returns how many. Skips rows in use.';

-- Waiting until ready.
CREATE FUNCTION rate_limiter.wait_rate_limit(
    name text,
    key text DEFAULT NULL,
    count double precision DEFAULT 1,
    timeout interval DEFAULT '30 seconds',
    config jsonb DEFAULT NULL
) RETURNS rate_limiter.decision
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'wait_rate_limit_fmgr';
REVOKE ALL ON FUNCTION rate_limiter.wait_rate_limit(text, text, double precision, interval, jsonb) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter.wait_rate_limit(text, text, double precision, interval, jsonb) IS
    'rate_limit, sleeping until retry_after and trying again until granted or timeout would pass (then the denial, with reason ''timeout'' if it waited).';

-- Statistics.
CREATE FUNCTION rate_limiter._stats() RETURNS TABLE (
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
AS 'MODULE_PATHNAME', '_stats_wrapper';
CREATE FUNCTION rate_limiter._top_denied() RETURNS TABLE (
    name text,
    key text,
    denied bigint,
    approximate_error bigint
)
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', '_top_denied_wrapper';
CREATE FUNCTION rate_limiter.stats_reset(name text DEFAULT NULL) RETURNS bigint
VOLATILE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'stats_reset_wrapper';

CREATE VIEW rate_limiter.stats AS SELECT * FROM rate_limiter._stats();
COMMENT ON VIEW rate_limiter.stats IS
    'Consuming calls per limit name since the server started or stats_reset (attempts: calls whose transaction rolls back count too). Needs shared_preload_libraries = ''rate_limiter''; empty otherwise.';
COMMENT ON COLUMN rate_limiter.stats.name IS 'Limit name; ''*other*'' counts every name beyond rate_limiter.stats_max_names.';
COMMENT ON COLUMN rate_limiter.stats.calls IS 'Consuming calls (rate_limit, wait_rate_limit, each limit of rate_limit_all); allowed + denied.';
COMMENT ON COLUMN rate_limiter.stats.allowed IS 'Calls answered ok (reservations and on_lock_timeout = ''allow'' included).';
COMMENT ON COLUMN rate_limiter.stats.denied IS 'Calls answered not ok, whatever the reason.';
COMMENT ON COLUMN rate_limiter.stats.tokens_granted IS 'Tokens taken by allowed calls that may go now.';
COMMENT ON COLUMN rate_limiter.stats.tokens_reserved IS 'Tokens taken by reservations that must wait (ok with retry_after).';
COMMENT ON COLUMN rate_limiter.stats.last_allowed_at IS 'When the last allowed call was counted; NULL if none since stats_reset.';
COMMENT ON COLUMN rate_limiter.stats.last_denied_at IS 'When the last denied call was counted; NULL if none since stats_reset.';
COMMENT ON COLUMN rate_limiter.stats.stats_reset IS 'When this row started counting: its first call, or the last stats_reset of it.';
CREATE VIEW rate_limiter.top_denied AS SELECT * FROM rate_limiter._top_denied();
COMMENT ON VIEW rate_limiter.top_denied IS
    'The most denied keys per limit name, approximately: a space-saving sketch of 64 keys per name. Needs shared_preload_libraries = ''rate_limiter''.';
COMMENT ON COLUMN rate_limiter.top_denied.name IS 'Limit name, as in rate_limiter.stats.';
COMMENT ON COLUMN rate_limiter.top_denied.key IS 'The key (NULL for the global key); keys over 62 bytes are shown cut, ending in …';
COMMENT ON COLUMN rate_limiter.top_denied.denied IS 'Denials counted for the key: at least the true count, at most approximate_error more.';
COMMENT ON COLUMN rate_limiter.top_denied.approximate_error IS 'How many of denied may belong to keys this one replaced in the sketch; 0 means exact.';
COMMENT ON FUNCTION rate_limiter._stats() IS 'Internal: the rows of rate_limiter.stats.';
COMMENT ON FUNCTION rate_limiter._top_denied() IS 'Internal: the rows of rate_limiter.top_denied.';
COMMENT ON FUNCTION rate_limiter.stats_reset(text) IS
    'Zero the statistics and top denied keys of one limit name, or of all when NULL; returns how many rows of rate_limiter.stats were reset.';
REVOKE ALL ON TABLE rate_limiter.stats, rate_limiter.top_denied FROM PUBLIC;
REVOKE ALL ON FUNCTION rate_limiter._stats(), rate_limiter._top_denied(), rate_limiter.stats_reset(text) FROM PUBLIC;

-- The functions 0.2.0 had that run with more rights than their caller get a search_path of
-- their own, as the ones created above have.
ALTER FUNCTION rate_limiter.reset_rate_limit(text, text) SET search_path TO pg_catalog, pg_temp;
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
