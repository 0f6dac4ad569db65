-- rate_limiter 0.8.0, the SQL-only edition, as a pg_tle extension named rate_limiter_sql: the
-- install script of sql-only/rate_limiter.sql as an extension's (written by sql-only/build.py).
-- Untested against pg_tle itself, which is not packaged for Debian; the test command installs
-- the same script as a trusted extension of PostgreSQL's own (tests/test_sql_only.py).
--
-- As a role that may use pg_tle (pgtle_admin), into a database without the extension:
--   psql -v ON_ERROR_STOP=1 -d DB -f pg_tle.sql
SELECT pgtle.install_extension('rate_limiter_sql', '0.8.0',
    'Rate limits inside your transactions: the SQL-only edition of rate_limiter', $_pgtle_$
-- rate_limiter 0.8.0, the SQL-only edition: plain SQL and PL/pgSQL for databases where no
-- compiled extension can be installed (RDS, Cloud SQL, Azure, Supabase, Neon). Written by
-- sql-only/build.py: edit its parts (sql-only/*.sql, sql/bootstrap.sql), not this file.
--
-- Install as the database's owner (no superuser needed), into a database without the
-- extension:   psql -v ON_ERROR_STOP=1 -d DB -f rate_limiter.sql
DO $$
BEGIN
    IF pg_catalog.current_setting('server_version_num')::int OPERATOR(pg_catalog.<) 150000 THEN
        RAISE EXCEPTION 'rate_limiter needs PostgreSQL 15 or later, not %', pg_catalog.current_setting('server_version')
            USING ERRCODE = '0A000';
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'rate_limiter') THEN
        RAISE EXCEPTION 'the rate_limiter extension is installed in this database' USING ERRCODE = '42710',
            HINT = 'The SQL-only edition is for databases where the extension cannot be installed; keep the extension.';
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname OPERATOR(pg_catalog.=) 'rate_limiter') THEN
        RAISE EXCEPTION 'schema rate_limiter exists already' USING ERRCODE = '42P06',
            HINT = 'The edition installs into a schema of its own: drop or rename the schema first.';
    END IF;
END $$;
SET LOCAL search_path = pg_catalog, pg_temp;
CREATE SCHEMA rate_limiter;
COMMENT ON SCHEMA rate_limiter IS 'rate_limiter 0.8.0, SQL-only edition (sql-only/README.md).';

-- The extension's tables and decision type (sql/bootstrap.sql).

CREATE TABLE rate_limiter.limits (
    name text PRIMARY KEY
        CONSTRAINT limits_name_check CHECK (name OPERATOR(pg_catalog.<>) '' AND pg_catalog.octet_length(name) OPERATOR(pg_catalog.<=) 128),
    kind text NOT NULL
        CONSTRAINT limits_kind_check CHECK (kind OPERATOR(pg_catalog.=) ANY (ARRAY['token bucket', 'fixed window', 'sliding window', 'rolling window', 'concurrency'])),
    rate double precision NOT NULL
        CONSTRAINT limits_rate_check CHECK (rate OPERATOR(pg_catalog.>) 0::pg_catalog.float8 AND rate OPERATOR(pg_catalog.<) 'Infinity'::pg_catalog.float8),
    period interval NOT NULL
        CONSTRAINT limits_period_check CHECK (period OPERATOR(pg_catalog.>) '0'::pg_catalog.interval),
    capacity double precision
        CONSTRAINT limits_capacity_check CHECK (capacity OPERATOR(pg_catalog.>=) 0::pg_catalog.float8 AND capacity OPERATOR(pg_catalog.<) 'Infinity'::pg_catalog.float8),
    max_reserved double precision
        CONSTRAINT limits_max_reserved_check CHECK (max_reserved OPERATOR(pg_catalog.>=) 0::pg_catalog.float8 AND max_reserved OPERATOR(pg_catalog.<) 'Infinity'::pg_catalog.float8),
    shards integer NOT NULL DEFAULT 1
        CONSTRAINT limits_shards_check CHECK (shards OPERATOR(pg_catalog.>=) 1 AND shards OPERATOR(pg_catalog.<=) 1024),
    start timestamptz
        CONSTRAINT limits_start_check CHECK (pg_catalog.isfinite(start)),
    min_gap interval
        CONSTRAINT limits_min_gap_check CHECK (min_gap OPERATOR(pg_catalog.>=) '0'::pg_catalog.interval),
    mode text NOT NULL DEFAULT 'all'
        CONSTRAINT limits_mode_check CHECK (mode OPERATOR(pg_catalog.=) ANY (ARRAY['all', 'partial', 'penalize'])),
    buckets integer
        CONSTRAINT limits_buckets_check CHECK (buckets OPERATOR(pg_catalog.>=) 1 AND buckets OPERATOR(pg_catalog.<=) 64),
    lock_timeout interval
        CONSTRAINT limits_lock_timeout_check CHECK (lock_timeout OPERATOR(pg_catalog.>=) '0'::pg_catalog.interval),
    on_lock_timeout text NOT NULL DEFAULT 'deny'
        CONSTRAINT limits_on_lock_timeout_check CHECK (on_lock_timeout OPERATOR(pg_catalog.=) ANY (ARRAY['deny', 'allow'])),
    deny_cache interval
        CONSTRAINT limits_deny_cache_check CHECK (deny_cache OPERATOR(pg_catalog.>=) '0'::pg_catalog.interval),
    hot boolean NOT NULL DEFAULT false,
    enforce boolean NOT NULL DEFAULT true,
    tz text,
    durable boolean NOT NULL DEFAULT true,
    CONSTRAINT limits_deny_cache_is_for_one_row_per_key_in_mode_all
        CHECK (deny_cache IS NULL OR (shards OPERATOR(pg_catalog.=) 1 AND mode OPERATOR(pg_catalog.=) 'all')),
    CONSTRAINT limits_one_row_per_key_for_lock_timeout
        CHECK (shards OPERATOR(pg_catalog.=) 1 OR lock_timeout IS NULL),
    CONSTRAINT limits_buckets_are_for_rolling_window
        CHECK (kind OPERATOR(pg_catalog.=) 'rolling window' OR buckets IS NULL),
    CONSTRAINT limits_one_row_per_key_for_min_gap_and_modes
        CHECK (shards OPERATOR(pg_catalog.=) 1 OR (min_gap IS NULL AND mode OPERATOR(pg_catalog.=) 'all')),
    CONSTRAINT limits_start_is_for_windows
        CHECK (kind OPERATOR(pg_catalog.<>) 'token bucket' OR start IS NULL),
    CONSTRAINT limits_capacity_is_rate
        CHECK (kind OPERATOR(pg_catalog.=) ANY (ARRAY['token bucket', 'fixed window']) OR capacity IS NULL OR capacity OPERATOR(pg_catalog.=) rate),
    CONSTRAINT limits_reservations_are_for_token_bucket_and_fixed_window
        CHECK (kind OPERATOR(pg_catalog.=) ANY (ARRAY['token bucket', 'fixed window']) OR max_reserved IS NULL),
    CONSTRAINT limits_hot_is_one_row_in_mode_all
        CHECK (NOT hot OR (shards OPERATOR(pg_catalog.=) 1 AND mode OPERATOR(pg_catalog.=) 'all' AND min_gap IS NULL AND lock_timeout IS NULL)),
    CONSTRAINT limits_memory_is_one_row_in_mode_all
        CHECK (durable OR (NOT hot AND shards OPERATOR(pg_catalog.=) 1 AND mode OPERATOR(pg_catalog.=) 'all' AND min_gap IS NULL AND lock_timeout IS NULL AND kind OPERATOR(pg_catalog.=) ANY (ARRAY['token bucket', 'fixed window', 'sliding window'])))
);

COMMENT ON TABLE rate_limiter.limits IS
    'Named rate limits, one row each. Manage with INSERT/UPDATE/DELETE or rate_limiter.define().';

COMMENT ON COLUMN rate_limiter.limits.name IS 'The limit''s name, as passed to rate_limit(name => ...).';

COMMENT ON COLUMN rate_limiter.limits.kind IS '''token bucket'' (continuous refill), ''fixed window'' (rate tokens at each window start), ''sliding window'' (the previous window weighs as it slides out), ''rolling window'' (at most rate in any period, counted in cells) or ''concurrency'' (at most rate slots held at once, by transactions or leases; period is how long a denied call is told to wait).';

COMMENT ON COLUMN rate_limiter.limits.rate IS 'Tokens added per period.';

COMMENT ON COLUMN rate_limiter.limits.period IS 'The period over which rate tokens are added.';

COMMENT ON COLUMN rate_limiter.limits.capacity IS 'Most tokens that can accumulate (burst); NULL means rate.';

COMMENT ON COLUMN rate_limiter.limits.max_reserved IS 'Most tokens that reservations may owe; NULL means unbounded.';

COMMENT ON COLUMN rate_limiter.limits.shards IS 'Rows the limit is split across, so that concurrent transactions do not queue on one row lock.';

COMMENT ON COLUMN rate_limiter.limits.min_gap IS 'Least time between two granted calls of one (name, key); NULL for none.';

COMMENT ON COLUMN rate_limiter.limits.mode IS '''all'' (all of count or nothing), ''partial'' (as much of count as there is) or ''penalize'' (denied calls count too, down to -capacity).';

COMMENT ON COLUMN rate_limiter.limits.lock_timeout IS 'Most time a consuming call waits for a row another transaction holds; NULL waits as UPDATE does.';

COMMENT ON COLUMN rate_limiter.limits.on_lock_timeout IS 'When lock_timeout passes: ''deny'' (ok = false) or ''allow'' (ok, granted = 0, unmetered); reason is ''lock_timeout'' either way.';

COMMENT ON COLUMN rate_limiter.limits.deny_cache IS 'Most time a denial may be answered again from shared memory without reading the state (needs shared_preload_libraries); NULL never.';

COMMENT ON COLUMN rate_limiter.limits.start IS 'Window kinds: windows (a rolling window''s cells) are aligned to this instant; NULL picks a phase per (name, key).';

COMMENT ON COLUMN rate_limiter.limits.hot IS 'Concurrent transactions consume it without queueing on its row: admitted against shared memory, each call logged in rate_limiter.debits (needs shared_preload_libraries; see docs/hot-limits.md).';

COMMENT ON COLUMN rate_limiter.limits.buckets IS 'Rolling window: the cells a period is cut into, 1 to 64; NULL means 10.';

COMMENT ON COLUMN rate_limiter.limits.enforce IS 'false puts the limit in shadow mode: a call it would deny is answered ok with reason ''shadow'', taking nothing, and counted in rate_limiter.stats.shadow_denied (a block still denies).';

COMMENT ON COLUMN rate_limiter.limits.durable IS 'false makes it a memory limit: counted in shared memory alone, with no row and no WAL, rolled back with the transaction as a durable one is (needs shared_preload_libraries; see docs/memory-limits.md).';

COMMENT ON COLUMN rate_limiter.limits.tz IS 'Fixed window of whole months, ''1 day'' or ''1 week'': the time zone its calendar windows start in (a name PostgreSQL knows, such as ''Europe/Berlin''); NULL is UTC.';

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

-- A key's own numbers under a named limit (rate_limiter.override()): a call on that key is
-- decided under them, its count kept in the same rows, until until. Looked up by (name, key),
-- and read whole by name for the keys a limit overrides.
CREATE TABLE rate_limiter.overrides (
    name text COLLATE "C" NOT NULL
        CONSTRAINT overrides_name_check CHECK (name OPERATOR(pg_catalog.<>) '' AND pg_catalog.octet_length(name) OPERATOR(pg_catalog.<=) 128),
    key text COLLATE "C"
        CONSTRAINT overrides_key_check CHECK (pg_catalog.octet_length(key) OPERATOR(pg_catalog.<=) 1024),
    tier text COLLATE "C",
    rate double precision
        CONSTRAINT overrides_rate_check CHECK (rate OPERATOR(pg_catalog.>) 0::pg_catalog.float8 AND rate OPERATOR(pg_catalog.<) 'Infinity'::pg_catalog.float8),
    period interval
        CONSTRAINT overrides_period_check CHECK (period OPERATOR(pg_catalog.>) '0'::pg_catalog.interval),
    capacity double precision
        CONSTRAINT overrides_capacity_check CHECK (capacity OPERATOR(pg_catalog.>=) 0::pg_catalog.float8 AND capacity OPERATOR(pg_catalog.<) 'Infinity'::pg_catalog.float8),
    max_reserved double precision
        CONSTRAINT overrides_max_reserved_check CHECK (max_reserved OPERATOR(pg_catalog.>=) 0::pg_catalog.float8 AND max_reserved OPERATOR(pg_catalog.<) 'Infinity'::pg_catalog.float8),
    min_gap interval
        CONSTRAINT overrides_min_gap_check CHECK (min_gap OPERATOR(pg_catalog.>=) '0'::pg_catalog.interval),
    exempt boolean NOT NULL DEFAULT false,
    until timestamptz NOT NULL DEFAULT 'infinity',
    note text,
    created timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT overrides_name_key_key UNIQUE NULLS NOT DISTINCT (name, key),
    CONSTRAINT overrides_tier_or_numbers CHECK (tier IS NULL OR (rate IS NULL AND period IS NULL AND capacity IS NULL
                                                                 AND max_reserved IS NULL AND min_gap IS NULL AND NOT exempt))
);

COMMENT ON TABLE rate_limiter.overrides IS
    'A key''s own numbers under a named limit, or the tier it is in: a call on (name, key) is decided under the limit with these numbers (or the tier''s) in place of its own (NULL: the limit''s), counted in the same rows, until until. Manage with rate_limiter.override() and remove_override(); deleting the limit deletes its overrides.';

COMMENT ON COLUMN rate_limiter.overrides.name IS 'The named limit (rate_limiter.limits) whose key has its own numbers.';

COMMENT ON COLUMN rate_limiter.overrides.key IS 'The key; NULL is the limit''s shared NULL key.';

COMMENT ON COLUMN rate_limiter.overrides.tier IS 'The tier (rate_limiter.tiers) whose numbers the key has; NULL: the numbers of this row.';

COMMENT ON COLUMN rate_limiter.overrides.rate IS 'Tokens per period for this key; NULL: the limit''s.';

COMMENT ON COLUMN rate_limiter.overrides.period IS 'The period for this key; NULL: the limit''s.';

COMMENT ON COLUMN rate_limiter.overrides.capacity IS 'Most tokens this key may hold; NULL: rate when rate is given, else the limit''s capacity.';

COMMENT ON COLUMN rate_limiter.overrides.max_reserved IS 'Most tokens this key may owe by reservations; NULL: the limit''s.';

COMMENT ON COLUMN rate_limiter.overrides.min_gap IS 'Least time between two granted calls of this key; NULL: the limit''s.';

COMMENT ON COLUMN rate_limiter.overrides.exempt IS 'true: the key is not limited (ok with reason ''allowed'', its state neither read nor written), as an allow of the pair.';

COMMENT ON COLUMN rate_limiter.overrides.until IS 'The override holds until this instant (a temporary boost); ''infinity'' until removed. rate_limiter.prune() deletes overrides that have ended.';

COMMENT ON COLUMN rate_limiter.overrides.note IS 'Why, for the operator (a plan, a ticket).';

COMMENT ON COLUMN rate_limiter.overrides.created IS 'When the override was made or last changed.';

-- A limit's tiers (rate_limiter.define_tier()): numbers defined once that an override names,
-- so that a customer's plan is one row and a tier's change reaches every key in it.
CREATE TABLE rate_limiter.tiers (
    name text COLLATE "C" NOT NULL
        CONSTRAINT tiers_name_check CHECK (name OPERATOR(pg_catalog.<>) '' AND pg_catalog.octet_length(name) OPERATOR(pg_catalog.<=) 128),
    tier text COLLATE "C" NOT NULL
        CONSTRAINT tiers_tier_check CHECK (tier OPERATOR(pg_catalog.<>) '' AND pg_catalog.octet_length(tier) OPERATOR(pg_catalog.<=) 128),
    rate double precision
        CONSTRAINT tiers_rate_check CHECK (rate OPERATOR(pg_catalog.>) 0::pg_catalog.float8 AND rate OPERATOR(pg_catalog.<) 'Infinity'::pg_catalog.float8),
    period interval
        CONSTRAINT tiers_period_check CHECK (period OPERATOR(pg_catalog.>) '0'::pg_catalog.interval),
    capacity double precision
        CONSTRAINT tiers_capacity_check CHECK (capacity OPERATOR(pg_catalog.>=) 0::pg_catalog.float8 AND capacity OPERATOR(pg_catalog.<) 'Infinity'::pg_catalog.float8),
    max_reserved double precision
        CONSTRAINT tiers_max_reserved_check CHECK (max_reserved OPERATOR(pg_catalog.>=) 0::pg_catalog.float8 AND max_reserved OPERATOR(pg_catalog.<) 'Infinity'::pg_catalog.float8),
    min_gap interval
        CONSTRAINT tiers_min_gap_check CHECK (min_gap OPERATOR(pg_catalog.>=) '0'::pg_catalog.interval),
    exempt boolean NOT NULL DEFAULT false,
    note text,
    created timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT tiers_pkey PRIMARY KEY (name, tier)
);

COMMENT ON TABLE rate_limiter.tiers IS
    'A named limit''s tiers (plans): numbers defined once, which each override naming the tier gives its key; a change of a tier reaches every key in it, each judged under the new numbers with its count kept. Manage with rate_limiter.define_tier() and remove_tier(); deleting the limit deletes its tiers.';

COMMENT ON COLUMN rate_limiter.tiers.name IS 'The named limit (rate_limiter.limits) the tier is of.';

COMMENT ON COLUMN rate_limiter.tiers.tier IS 'The tier''s name, as overrides name it (''free'', ''pro'').';

COMMENT ON COLUMN rate_limiter.tiers.rate IS 'Tokens per period for the tier''s keys; NULL: the limit''s.';

COMMENT ON COLUMN rate_limiter.tiers.period IS 'The period for the tier''s keys; NULL: the limit''s.';

COMMENT ON COLUMN rate_limiter.tiers.capacity IS 'Most tokens a key of the tier may hold; NULL: rate when rate is given, else the limit''s capacity.';

COMMENT ON COLUMN rate_limiter.tiers.max_reserved IS 'Most tokens a key of the tier may owe by reservations; NULL: the limit''s.';

COMMENT ON COLUMN rate_limiter.tiers.min_gap IS 'Least time between two granted calls of a key of the tier; NULL: the limit''s.';

COMMENT ON COLUMN rate_limiter.tiers.exempt IS 'true: the tier''s keys are not limited (ok with reason ''allowed'').';

COMMENT ON COLUMN rate_limiter.tiers.note IS 'What the tier is, for the operator.';

COMMENT ON COLUMN rate_limiter.tiers.created IS 'When the tier was defined or last changed.';

-- One small row per (name, key, shard). fillfactor leaves room on each page so updates
-- stay HOT (no indexed column ever changes). COLLATE "C": equality is byte equality under
-- any deterministic collation anyway, and the index compares bytes instead of calling strcoll.
-- shard is smallint so that a row with short texts fits 64 bytes and an index entry 24.
-- The unique index leads with key, which tells rows apart at the first comparison.
-- expires is not indexed: an index on it would make every update non-HOT; prune() scans.
CREATE TABLE rate_limiter.state (
    name text COLLATE "C" NOT NULL,
    key text COLLATE "C",
    shard smallint NOT NULL,
    value double precision NOT NULL,
    ts timestamptz NOT NULL,
    expires timestamptz NOT NULL,
    counts double precision[],
    granted_at timestamptz,
    CONSTRAINT state_key_name_shard_key UNIQUE NULLS NOT DISTINCT (key, name, shard)
) WITH (fillfactor = 90);

-- The unique index has a nullable column, so it cannot identify rows to a logical
-- replication subscriber; the whole old row (about 60 bytes) can.
ALTER TABLE rate_limiter.state REPLICA IDENTITY FULL;

COMMENT ON TABLE rate_limiter.state IS
    'Current state of each (name, key, shard). Written only by the rate_limiter functions; a missing row means full.';

COMMENT ON COLUMN rate_limiter.state.name IS
    'The limit''s name; for an inline config, the name, ''#'' and 32 hex digits of the config''s fingerprint: each inline config keeps a state of its own.';

COMMENT ON COLUMN rate_limiter.state.key IS 'The key within the limit; NULL is the one shared value.';

COMMENT ON COLUMN rate_limiter.state.shard IS
    'Shard number: 0 to shards - 1 for named limits, -1 - shard for inline configs.';

COMMENT ON COLUMN rate_limiter.state.value IS 'Tokens held as of ts (negative while reservations are owed).';

COMMENT ON COLUMN rate_limiter.state.ts IS 'Token bucket: last update. Fixed and sliding window: start of the window value belongs to. Rolling window: start of the newest cell.';

COMMENT ON COLUMN rate_limiter.state.counts IS
    'Sliding window: {tokens taken in the window before ts, tokens taken in the window from ts} (a row 0.4.0 wrote holds the first only). Rolling window: tokens taken per counting cell, oldest first, the last starting at ts. Token bucket and fixed window: {-capacity}, the capacity value is what is left of, negated, so that a key whose numbers change keeps what it used (NULL in a row written before 0.8.0).';

COMMENT ON COLUMN rate_limiter.state.granted_at IS 'The last granted call, while the limit''s min_gap after it has not passed; else NULL.';

COMMENT ON COLUMN rate_limiter.state.expires IS 'From this instant the row holds what a fresh state would, and rate_limiter.prune() may delete it.';

-- Concurrency limits' leases (docs/semantics.md, "Concurrency limits"): a slot held past the
-- transaction that took it, until it expires or is released. Slots held by transactions are
-- locks, not rows. The unique index has a nullable column: the whole old row identifies it.
CREATE TABLE rate_limiter.leases (
    name text COLLATE "C" NOT NULL,
    key text COLLATE "C",
    slot integer NOT NULL,
    lease_id uuid NOT NULL,
    expires_at timestamptz NOT NULL,
    CONSTRAINT leases_name_key_slot_key UNIQUE NULLS NOT DISTINCT (name, key, slot)
);

ALTER TABLE rate_limiter.leases REPLICA IDENTITY FULL;

CREATE INDEX leases_lease_id ON rate_limiter.leases (lease_id);

COMMENT ON TABLE rate_limiter.leases IS
    'Slots of concurrency limits held by leases (acquire(..., lease => ...)), one row per slot until expires_at or release(). Written only by the rate_limiter functions.';

COMMENT ON COLUMN rate_limiter.leases.name IS 'The limit''s name; for an inline config, the name, ''#'' and 32 hex digits of its fingerprint.';

COMMENT ON COLUMN rate_limiter.leases.key IS 'The key; NULL for the NULL key.';

COMMENT ON COLUMN rate_limiter.leases.slot IS 'The slot held, 0 to rate - 1.';

COMMENT ON COLUMN rate_limiter.leases.lease_id IS 'The lease''s id, a random UUID that only the holder is told: release() and renew() take it.';

COMMENT ON COLUMN rate_limiter.leases.expires_at IS 'From this instant the slot is free again, and rate_limiter.prune() may delete the row.';

COMMENT ON INDEX rate_limiter.leases_lease_id IS 'A lease''s rows by its id: what release() and renew() find.';

CREATE TYPE rate_limiter.decision AS (
    ok boolean,
    retry_after double precision,
    remaining double precision,
    reset_after double precision,
    granted double precision,
    reason text,
    limited_by text
);

COMMENT ON TYPE rate_limiter.decision IS 'The answer of rate_limit() and check_rate_limit(); times in milliseconds.';

COMMENT ON COLUMN rate_limiter.decision.ok IS 'The tokens were taken (or, with reserve, reserved).';

COMMENT ON COLUMN rate_limiter.decision.retry_after IS 'Milliseconds until a retry could succeed, or with a reservation until the reserved work may run; NULL when there is nothing to wait for.';

COMMENT ON COLUMN rate_limiter.decision.remaining IS 'Tokens left after this call, as of now (negative while reservations are owed).';

COMMENT ON COLUMN rate_limiter.decision.reset_after IS 'Milliseconds until the limit is full again.';

COMMENT ON COLUMN rate_limiter.decision.granted IS 'Tokens this call took (0 when denied).';

COMMENT ON COLUMN rate_limiter.decision.reason IS 'Why the call was denied: ''exhausted'' (no tokens for it), ''min_gap'' (too soon after the last granted call), ''blocked'' (see rate_limiter.blocks), ''timeout'' (wait_rate_limit waited and its timeout came first) or ''lock_timeout'' (the row stayed locked past the limit''s lock_timeout; also with ok when on_lock_timeout is ''allow''); ''allowed'' with ok when the key is in rate_limiter.allows; otherwise NULL.';

COMMENT ON COLUMN rate_limiter.decision.limited_by IS 'The name of the limit that denied the call; NULL when ok.';

-- The clock's conversions (src/clock.rs): timestamptz and ms since the Unix epoch.

-- A timestamptz as ms since the Unix epoch, as clock::pg_us_to_ms: the integer microseconds as
-- a double (exact below 2^53, rounded above, as i128 to f64), then divided by 1000.
-- (PL/pgSQL: as an SQL function it would not be inlined, its casts being STABLE, and would
-- cost several times more per call.)
CREATE FUNCTION rate_limiter._ms(t timestamptz) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN CASE WHEN t = 'infinity' THEN 'Infinity'::float8 WHEN t = '-infinity' THEN '-Infinity'::float8
                ELSE (extract(epoch FROM t) * 1000000)::float8 / 1000::float8 END;
END $$;

-- ms as a timestamptz, as clock::ms_to_pg_us: microseconds rounded half away from zero.
CREATE FUNCTION rate_limiter._ts(ms double precision) RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN CASE WHEN ms = 'Infinity' THEN 'infinity'::timestamptz
                ELSE 'epoch'::timestamptz + interval '1 microsecond' * (sign(ms * 1000) * floor(abs(ms * 1000) + 0.5)) END;
END $$;

-- The bucket arithmetic of src/bucket/, file by file, operation for operation (the same float8
-- rounding): times in ms since the Unix epoch, durations in ms. No table; IMMUTABLE but where a
-- calendar window reads its time zone's rules (STABLE, and never in a parallel worker: the zone
-- is looked up as SET TimeZone does).
--
-- What it is about (bucket/types.rs).

-- One shard's state, as bucket::State: counts are the sliding window's {previous, current},
-- the rolling window's cells, or a token bucket's and fixed window's {-capacity}, the capacity
-- its value is what is left of, negated (NULL in a row written before 0.8.0).
CREATE TYPE rate_limiter._state AS (value double precision, ts double precision, granted_at double precision,
                                    counts double precision[]);

-- The config the arithmetic reads, as bucket::Config (per shard; split: one shard's share of a
-- limit of several, whose state keeps no capacity mark).
CREATE TYPE rate_limiter._config AS (
    kind text, rate double precision, period double precision, capacity double precision,
    max_reserved double precision, start double precision, min_gap double precision, buckets integer,
    mode text, cal_unit text, cal_n integer, cal_zone text, cal_anchor double precision, shards integer,
    split boolean);

-- bucket::Check: what taking `count` from a state at `now` gives.
CREATE TYPE rate_limiter._check AS (
    ok boolean, value double precision, ts double precision, available double precision,
    retry_after double precision, granted_at double precision, reason text, counts double precision[]);

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

-- The sliding window (bucket/sliding_window.rs): windows aligned as the fixed window's; at a
-- fraction f into the window, the previous window's tokens weigh 1 - f, and a call of count
-- is allowed iff previous * (1 - f) + current + count <= rate.

-- The tokens taken in the window starting at s.ts (a row of another kind: rate - value).
CREATE FUNCTION rate_limiter._sliding_current(s rate_limiter._state, c rate_limiter._config) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN array_length(s.counts, 1) = 2 THEN s.counts[2] ELSE greatest(c.rate - s.value, 0::float8) END;

-- The window at falls in (start), and the tokens taken in it and in the one before.
CREATE FUNCTION rate_limiter._sliding_windows(s rate_limiter._state, c rate_limiter._config, at double precision,
                                              OUT start double precision, OUT current double precision, OUT previous double precision)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    elapsed float8 := floor(greatest(at - s.ts, 0::float8) / c.period);
    taken float8 := rate_limiter._sliding_current(s, c);
BEGIN
    IF elapsed = 0 THEN
        previous := coalesce(s.counts[1], 0); current := taken;
    ELSIF elapsed = 1 THEN
        previous := taken; current := 0;
    ELSE
        previous := 0; current := 0;
    END IF;
    start := s.ts + elapsed * c.period;
END $$;

-- The tokens that count against the rate at `at`.
CREATE FUNCTION rate_limiter._sliding_weighted(start double precision, current double precision, previous double precision,
                                               c rate_limiter._config, at double precision) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN previous * (1::float8 - least(greatest((at - start) / c.period, 0::float8), 1::float8)) + current;

CREATE FUNCTION rate_limiter._sliding_ok(s rate_limiter._state, c rate_limiter._config, at double precision, count double precision)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    w record := rate_limiter._sliding_windows(s, c, at);
BEGIN
    RETURN rate_limiter._sliding_weighted(w.start, w.current, w.previous, c, at) + count <= c.rate;
END $$;

-- The earliest instant from now on at which count is allowed: closed form, then checked so
-- that rounding only makes it later.
CREATE FUNCTION rate_limiter._sliding_retry_at(s rate_limiter._state, c rate_limiter._config, now double precision, count double precision)
RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    w record := rate_limiter._sliding_windows(s, c, now);
    room float8 := c.rate - w.current - count;
    at float8;
    step float8;
BEGIN
    IF room >= 0 AND w.previous > 0 THEN
        at := w.start + (1::float8 - room / w.previous) * c.period;
    ELSIF w.current > c.rate - count THEN
        at := w.start + c.period + (1::float8 - (c.rate - count) / w.current) * c.period;
    ELSE
        at := w.start + c.period;
    END IF;
    step := abs(at) * 2.220446049250313e-16::float8;
    FOR i IN 1 .. 128 LOOP
        IF at >= now AND rate_limiter._sliding_ok(s, c, at, count) THEN
            RETURN at;
        END IF;
        at := greatest(at + step, now);
        step := step * 2;
    END LOOP;
    RETURN w.start + 2::float8 * c.period;
END $$;

CREATE FUNCTION rate_limiter._sliding_check(s rate_limiter._state, c rate_limiter._config, now double precision, count double precision)
RETURNS rate_limiter._check
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    w record := rate_limiter._sliding_windows(s, c, now);
    weighted float8 := rate_limiter._sliding_weighted(w.start, w.current, w.previous, c, now);
    r rate_limiter._check;
BEGIN
    r.ok := weighted + count <= c.rate;
    r.value := c.rate - (w.current + count);
    r.ts := w.start;
    r.counts := ARRAY[w.previous, w.current + count];
    r.available := c.rate - weighted - count;
    IF NOT r.ok THEN r.retry_after := rate_limiter._sliding_retry_at(s, c, now, count) - now; END IF;
    RETURN r;
END $$;

CREATE FUNCTION rate_limiter._sliding_reset_after(s rate_limiter._state, c rate_limiter._config, now double precision)
RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    w record := rate_limiter._sliding_windows(s, c, now);
BEGIN
    RETURN greatest(CASE WHEN w.current > 0 THEN w.start + 2::float8 * c.period
                         WHEN w.previous > 0 THEN w.start + c.period ELSE now END - now, 0::float8);
END $$;

-- The rolling window (bucket/rolling_window.rs): buckets cells of width g (whole
-- microseconds, period / buckets rounded up), aligned as windows are; the tokens of a cell
-- count until buckets cells after it ends, so no interval of period holds more than rate.
-- Stored: ts the start of the current cell, counts the counting cells' tokens, oldest first.

-- ms as whole microseconds, rounded half away from zero (rolling_window::us).
CREATE FUNCTION rate_limiter._us(ms double precision) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (sign(ms * 1000::float8) * floor(abs(ms * 1000::float8) + 0.5::float8))::bigint;

CREATE FUNCTION rate_limiter._cell_width(c rate_limiter._config) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (rate_limiter._us(c.period) + c.buckets - 1) / c.buckets;

-- The start of the cell now falls in, cells aligned to anchor.
CREATE FUNCTION rate_limiter._cell_start(c rate_limiter._config, anchor double precision, now double precision)
RETURNS double precision
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (rate_limiter._us(anchor) + floor((rate_limiter._us(now) - rate_limiter._us(anchor))::numeric
        / rate_limiter._cell_width(c))::bigint * rate_limiter._cell_width(c))::float8 / 1000::float8;

-- The counting cells as of at: the start of the cell at falls in, and their counts.
CREATE FUNCTION rate_limiter._cells(s rate_limiter._state, c rate_limiter._config, at double precision,
                                    OUT start double precision, OUT counts double precision[])
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ts bigint := rate_limiter._us(s.ts);
    g bigint := rate_limiter._cell_width(c);
    n int := c.buckets + 1;
    shift bigint := greatest(rate_limiter._us(at) - ts, 0) / g;  -- a clock that steps back stays
    stored int := coalesce(array_length(s.counts, 1), 0);
    skip int;
BEGIN
    counts := array_fill(0::float8, ARRAY[n]);
    IF shift < n THEN
        skip := greatest(stored + shift::int - n, 0);
        FOR i IN skip .. stored - 1 LOOP
            counts[i + n - stored - shift::int + 1] := s.counts[i + 1];
        END LOOP;
    END IF;
    start := (ts + shift * g)::float8 / 1000::float8;
END $$;

-- Their sum, left to right (as Rust's iter().sum()).
CREATE FUNCTION rate_limiter._sum(xs double precision[]) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    total float8 := 0;
    x float8;
BEGIN
    FOREACH x IN ARRAY xs LOOP total := total + x; END LOOP;
    RETURN total;
END $$;

CREATE FUNCTION rate_limiter._rolling_check(s rate_limiter._state, c rate_limiter._config, now double precision, count double precision)
RETURNS rate_limiter._check
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    cells record := rate_limiter._cells(s, c, now);
    counts float8[] := cells.counts;
    taken float8 := rate_limiter._sum(cells.counts);
    r rate_limiter._check;
    left_ float8;
    shift int;
BEGIN
    r.ok := taken + count <= c.rate;
    counts[c.buckets + 1] := counts[c.buckets + 1] + count;
    r.value := c.rate - taken - count;
    r.ts := cells.start;
    r.counts := counts;
    r.available := c.rate - taken - count;
    IF NOT r.ok THEN
        -- The start of the first later cell from which enough of the oldest no longer count.
        left_ := taken;
        shift := c.buckets + 1;
        FOR i IN 1 .. c.buckets + 1 LOOP
            left_ := left_ - cells.counts[i];
            IF left_ + count <= c.rate THEN shift := i; EXIT; END IF;
        END LOOP;
        r.retry_after := (rate_limiter._us(cells.start) + shift * rate_limiter._cell_width(c))::float8 / 1000::float8 - now;
    END IF;
    RETURN r;
END $$;

-- The last counting cell that holds tokens (1-based), or 0.
CREATE FUNCTION rate_limiter._last_nonzero(xs double precision[]) RETURNS integer
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    FOR i IN REVERSE coalesce(array_length(xs, 1), 0) .. 1 LOOP
        IF xs[i] <> 0 THEN RETURN i; END IF;
    END LOOP;
    RETURN 0;
END $$;

CREATE FUNCTION rate_limiter._rolling_reset_after(s rate_limiter._state, c rate_limiter._config, now double precision)
RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    cells record := rate_limiter._cells(s, c, now);
    last int := rate_limiter._last_nonzero(cells.counts);
BEGIN
    IF last = 0 THEN RETURN 0; END IF;
    RETURN greatest((rate_limiter._us(cells.start) + last * rate_limiter._cell_width(c))::float8 / 1000::float8 - now, 0::float8);
END $$;

-- The Convex component's token bucket and fixed window (bucket/convex.rs), and the check of
-- any kind (bucket/shard.rs's check, which dispatches to each kind's file).

-- bucket::END_OF_TIME_MS and storable_debt: what a key may owe without max_reserved.
CREATE FUNCTION rate_limiter._storable_debt(c rate_limiter._config, now double precision) RETURNS double precision
LANGUAGE sql STABLE STRICT PARALLEL UNSAFE
RETURN greatest(((9224318016000000::float8 - now)
                  -- A calendar window is as long as its longest: a month of 31 days, a day of 25 hours.
                  / CASE WHEN c.cal_unit = 'm' THEN greatest(c.cal_n::float8 * 31::float8 * 86400000::float8, c.period)
                         WHEN c.cal_unit = 'd' THEN greatest(c.cal_n::float8 * 86400000::float8 + 3600000::float8, c.period)
                         ELSE c.period END
                  - 2::float8) * c.rate - c.capacity, 0::float8);

-- bucket::carried: the state as c reads it. A token bucket's or fixed window's value is what
-- is left of the capacity it keeps as its one count, negated: under another capacity the key keeps
-- what it used (the bucket's deficit; the fixed window's tokens taken in its window, never
-- below 0 but for a debt of reservations, which is kept), marked with the new capacity. A
-- share of several shards reads the level as it stands. A window kind reads it as a row of
-- another kind: the tokens used, no counts.
CREATE FUNCTION rate_limiter._carried(s rate_limiter._state, c rate_limiter._config) RETURNS rate_limiter._state
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    used float8;
BEGIN
    -- The capacity, negated: no count of taken tokens is negative (a sliding window row of
    -- 0.4.0 keeps one count too, its previous window's).
    IF array_length(s.counts, 1) IS DISTINCT FROM 1 OR NOT s.counts[1] < 0 THEN
        RETURN s;
    END IF;
    used := -s.counts[1] - s.value;
    IF c.kind IN ('token bucket', 'fixed window') AND c.split THEN
        -- A share of several shards reads the level as it stands (as before 0.8.0).
        s.counts := NULL;
    ELSIF c.kind = 'token bucket' THEN
        s.value := c.capacity - used;
        s.counts := ARRAY[-c.capacity];
    ELSIF c.kind = 'fixed window' THEN
        s.value := greatest(c.capacity - used, least(s.value, 0::float8));
        s.counts := ARRAY[-c.capacity];
    ELSIF c.kind IN ('sliding window', 'rolling window') THEN
        s.value := c.rate - used;
        s.counts := NULL;
    END IF;
    RETURN s;
END $$;

-- bucket::convex_check and check: refill to now, take count, min_gap after the last grant.
CREATE FUNCTION rate_limiter._check(s rate_limiter._state, c rate_limiter._config, now double precision,
                                    count double precision, reserve boolean)
RETURNS rate_limiter._check
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    elapsed float8 := greatest(now - s.ts, 0::float8);
    r rate_limiter._check;
    per_ms float8;
    windows float8;
    gap_end float8;
BEGIN
    s := rate_limiter._carried(s, c);
    IF c.kind = 'sliding window' THEN
        r := rate_limiter._sliding_check(s, c, now, count);
    ELSIF c.kind = 'rolling window' THEN
        r := rate_limiter._rolling_check(s, c, now, count);
    ELSIF c.kind = 'token bucket' THEN
        per_ms := c.rate / c.period;
        r.value := least(s.value + elapsed * per_ms, c.capacity) - count;
        r.ts := greatest(now, s.ts);
        IF r.value < 0 THEN r.retry_after := -r.value / per_ms; END IF;
    ELSE
        windows := CASE WHEN c.cal_unit IS NULL THEN floor(elapsed / c.period)
                        ELSE greatest(rate_limiter._cal_index(c, s.ts + elapsed) - rate_limiter._cal_index(c, s.ts), 0)::float8 END;
        r.value := least(s.value + c.rate * windows, c.capacity) - count;
        r.ts := rate_limiter._window_after(c, s.ts, windows);
        IF r.value < 0 THEN
            r.retry_after := rate_limiter._window_after(c, r.ts, ceil(-r.value / c.rate)) - now;
        END IF;
    END IF;
    IF c.kind NOT IN ('sliding window', 'rolling window') THEN
        r.ok := r.value >= 0 OR (reserve AND NOT (-r.value > coalesce(c.max_reserved, rate_limiter._storable_debt(c, now))));
        r.available := r.value;
        -- What the value is left of: a later config of another capacity keeps what was used.
        r.counts := CASE WHEN c.split THEN NULL ELSE ARRAY[-c.capacity] END;
    END IF;
    r.reason := 'exhausted';
    -- A gap that has passed is forgotten, so the row can expire.
    IF s.granted_at IS NOT NULL AND c.min_gap IS NOT NULL AND now < s.granted_at + c.min_gap THEN
        gap_end := s.granted_at + c.min_gap;
        r.granted_at := s.granted_at;
        r.ok := false;
        r.reason := 'min_gap';
        r.retry_after := greatest(coalesce(r.retry_after, 0::float8), gap_end - now);
    END IF;
    IF r.ok AND count > 0 AND c.min_gap IS NOT NULL THEN
        r.granted_at := now;
    END IF;
    RETURN r;
END $$;

-- One shard (bucket/shard.rs): its phase, its fresh state, when it is full again, and when
-- its row may go.

-- bucket::phase_fraction: FNV-1a over the name's bytes, a marker and the key's, finished by
-- splitmix64, as a fraction in [0, 1). 64-bit unsigned arithmetic in numeric, XOR in bit(64).
CREATE FUNCTION rate_limiter._phase_fraction(name text, key text) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    two64 CONSTANT numeric := 18446744073709551616;
    h numeric := 14695981039346656037;
    bytes bytea := convert_to(name, 'UTF8') || CASE WHEN key IS NULL THEN '\x00'::bytea ELSE '\x01'::bytea || convert_to(key, 'UTF8') END;
    b int;
    low int;
    bits bit(64);
BEGIN
    FOR i IN 0 .. length(bytes) - 1 LOOP
        b := get_byte(bytes, i);
        low := (h % 256)::int;
        h := (h - low + (low # b)) * 1099511628211 % two64;
    END LOOP;
    -- splitmix64's finish: h ^= h >> 30; h *= C1; h ^= h >> 27; h *= C2; h ^= h >> 31.
    bits := rate_limiter._bits(h);
    h := rate_limiter._unsigned(bits # (bits >> 30)) * 13787848793156543929 % two64;
    bits := rate_limiter._bits(h);
    h := rate_limiter._unsigned(bits # (bits >> 27)) * 10723151780598845931 % two64;
    bits := rate_limiter._bits(h);
    h := rate_limiter._unsigned(bits # (bits >> 31));
    RETURN floor(h / 2048)::float8 / 9007199254740992::float8;
END $$;

-- An unsigned 64-bit number (numeric in [0, 2^64)) as its bits, and back.
CREATE FUNCTION rate_limiter._bits(u numeric) RETURNS bit(64)
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (CASE WHEN u >= 9223372036854775808 THEN u - 18446744073709551616 ELSE u END)::int8::bit(64);
CREATE FUNCTION rate_limiter._unsigned(b bit(64)) RETURNS numeric
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN CASE WHEN b::int8 < 0 THEN b::int8::numeric + 18446744073709551616 ELSE b::int8::numeric END;

-- bucket::fresh_state: full, and for a fixed window in the window containing now, aligned to
-- start or else to the (name, key)'s phase.
CREATE FUNCTION rate_limiter._fresh(c rate_limiter._config, now double precision, phase double precision)
RETURNS rate_limiter._state
LANGUAGE sql STABLE PARALLEL UNSAFE
RETURN ROW(c.capacity,
           CASE c.kind WHEN 'token bucket' THEN now
           WHEN 'rolling window' THEN rate_limiter._cell_start(c, coalesce(c.start, phase), now)
           WHEN 'fixed window' THEN
               CASE WHEN c.cal_unit IS NOT NULL THEN rate_limiter._cal_boundary(c, rate_limiter._cal_index(c, now))
                    ELSE coalesce(c.start, phase) + floor((now - coalesce(c.start, phase)) / c.period) * c.period END
           ELSE coalesce(c.start, phase) + floor((now - coalesce(c.start, phase)) / c.period) * c.period END,
           NULL, NULL)::rate_limiter._state;

-- bucket::reset_after: ms until a state is full again.
CREATE FUNCTION rate_limiter._reset_after(s rate_limiter._state, c rate_limiter._config, now double precision)
RETURNS double precision
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    s := rate_limiter._carried(s, c);
    RETURN CASE WHEN c.kind = 'sliding window' THEN rate_limiter._sliding_reset_after(s, c, now)
                WHEN c.kind = 'rolling window' THEN rate_limiter._rolling_reset_after(s, c, now)
                WHEN c.capacity - s.value <= 0 THEN 0::float8
                WHEN c.kind = 'token bucket' THEN (c.capacity - s.value) / (c.rate / c.period)
                ELSE greatest(rate_limiter._window_after(c, s.ts, ceil((c.capacity - s.value) / c.rate)) - now, 0::float8) END;
END $$;

-- bucket::expires: from when the state holds what a fresh one would, checked with _check
-- itself so that rounding only makes it later.
CREATE FUNCTION rate_limiter._expires(s rate_limiter._state, c rate_limiter._config) RETURNS double precision
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    at float8;
    step float8 := CASE c.kind WHEN 'token bucket' THEN 1::float8 WHEN 'rolling window' THEN c.period / c.buckets ELSE c.period END;
    refilled rate_limiter._check;
BEGIN
    s := rate_limiter._carried(s, c);
    IF c.kind = 'token bucket' THEN
        at := s.ts + greatest((c.capacity - s.value) / (c.rate / c.period), 0::float8);
    ELSIF c.kind = 'rolling window' THEN
        at := CASE WHEN rate_limiter._last_nonzero(s.counts) = 0 THEN s.ts
                   ELSE (rate_limiter._us(s.ts) + rate_limiter._last_nonzero(s.counts) * rate_limiter._cell_width(c))::float8 / 1000::float8 END;
    ELSIF c.kind = 'sliding window' THEN
        at := s.ts + (CASE WHEN rate_limiter._sliding_current(s, c) > 0 THEN 2 WHEN coalesce(s.counts[1], 0) > 0 THEN 1 ELSE 0 END)::float8 * c.period;
    ELSE
        at := rate_limiter._window_after(c, s.ts, greatest(ceil((c.capacity - s.value) / c.rate), 0::float8));
    END IF;
    at := ceil(greatest(at, coalesce(s.granted_at + c.min_gap, '-Infinity'::float8)));
    FOR i IN 1 .. 64 LOOP
        refilled := rate_limiter._check(s, c, at, 0, false);
        -- A token bucket's or fixed window's one count is its capacity, not tokens taken.
        IF refilled.value >= c.capacity AND at >= s.ts AND refilled.granted_at IS NULL
           AND ((array_length(refilled.counts, 1) = 1 AND refilled.counts[1] < 0) OR rate_limiter._last_nonzero(refilled.counts) = 0) THEN
            RETURN at;
        END IF;
        at := at + step;
        step := step * 2;
    END LOOP;
    RETURN 'Infinity'::float8;
END $$;

-- bucket/credit.rs for a token bucket and a fixed window: what the state holds after count
-- comes back at now, refilled as a call at now would, and how much came back.
CREATE FUNCTION rate_limiter._credited(s rate_limiter._state, c rate_limiter._config, now double precision, count double precision,
                                       OUT after rate_limiter._state, OUT given double precision, OUT available double precision)
LANGUAGE plpgsql STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    refilled rate_limiter._check := rate_limiter._check(s, c, now, 0, false);
    now_state rate_limiter._state := ROW(refilled.value, refilled.ts, refilled.granted_at, refilled.counts)::rate_limiter._state;
    back rate_limiter._check;
    current float8;
    previous float8;
    from_current float8;
    from_previous float8;
    cells float8[];
    left_ float8;
    back_ float8;
BEGIN
    IF c.kind = 'sliding window' THEN
        -- From the current window's tokens, then the previous one's while it still weighs.
        current := rate_limiter._sliding_current(now_state, c);
        previous := coalesce(now_state.counts[1], 0);
        from_current := least(count, current);
        from_previous := least(count - from_current, previous);
        now_state := ROW(c.rate - (current - from_current), now_state.ts, now_state.granted_at,
                         ARRAY[previous - from_previous, current - from_current])::rate_limiter._state;
        given := from_current + from_previous;
    ELSIF c.kind = 'rolling window' THEN
        -- From the newest cells that hold tokens, back to the oldest that still counts.
        cells := now_state.counts;
        left_ := count;
        FOR i IN REVERSE array_length(cells, 1) .. 1 LOOP
            back_ := least(left_, cells[i]);
            cells[i] := cells[i] - back_;
            left_ := left_ - back_;
        END LOOP;
        given := count - left_;
        now_state := ROW(c.rate - rate_limiter._sum(cells), now_state.ts, now_state.granted_at, cells)::rate_limiter._state;
    ELSE
        given := greatest(least(count, c.capacity - refilled.value), 0::float8);
        now_state.value := refilled.value + given;
    END IF;
    back := rate_limiter._check(now_state, c, now, 0, false);
    after := ROW(back.value, back.ts, back.granted_at, back.counts)::rate_limiter._state;
    available := back.available;
END $$;

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

-- The bytes of config::fingerprint (src/config/fingerprint.rs).

-- A double's bytes, little-endian, -0 as 0 (config::fingerprint's numbers).
CREATE FUNCTION rate_limiter._le(x double precision) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
BEGIN ATOMIC
    SELECT pg_catalog.string_agg(pg_catalog.substr(pg_catalog.float8send(x OPERATOR(pg_catalog.+) 0::float8), i, 1), ''::bytea ORDER BY i DESC)
    FROM pg_catalog.generate_series(1, 8) i;
END;

-- An optional double as config::fingerprint writes it: nine 0xff bytes when absent, else 0
-- and its bytes.
CREATE FUNCTION rate_limiter._le_optional(x double precision) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN x IS NULL THEN '\xffffffffffffffffff'::bytea ELSE '\x00'::bytea OPERATOR(pg_catalog.||) rate_limiter._le(x) END;

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

-- Limits on a table's writes (limit_writes, unlimit_writes, the view write_limits), as
-- src/api/writes.rs and src/storage/write_limits.rs: per event, a statement-level AFTER
-- trigger with a transition table, running _write_limited() with the declaration as its
-- arguments, which charges the statement's rows per key, a rate_limit(..., throws => true) each
-- in the keys' order; the first denial fails the statement, and with it what the others took.
--
-- The edition has no superuser's rights to make a trigger on another role's table: the
-- table's owner makes it, through limit_writes (SECURITY INVOKER), with EXECUTE on
-- _write_limited, which only the edition's owner has. So write limits are the edition's
-- owner's to declare, on its own tables and those of the roles it is a member of (docs/api.md).
-- Whoever made such a trigger, it charges with the authority of the table's owner only:
-- _write_limited refuses to charge for a table whose owner may not call rate_limit.

-- The trigger's name: the event and FNV-1a of the limit's name (its UTF-8 bytes), as the
-- extension names it.
CREATE FUNCTION rate_limiter._write_trigger_name(event text, limit_name text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    hash numeric := 14695981039346656037;
    b integer;
    bytes bytea := pg_catalog.convert_to(limit_name, 'UTF8');
BEGIN
    FOR i IN 0 .. pg_catalog.length(bytes) OPERATOR(pg_catalog.-) 1 LOOP
        b := pg_catalog.get_byte(bytes, i);
        -- XOR into the low byte, then times the FNV prime modulo 2^64.
        hash := hash OPERATOR(pg_catalog.-) pg_catalog.mod(hash, 256)
                OPERATOR(pg_catalog.+) ((pg_catalog.mod(hash, 256)::integer OPERATOR(pg_catalog.#) b));
        hash := pg_catalog.mod(hash OPERATOR(pg_catalog.*) 1099511628211, 18446744073709551616);
    END LOOP;
    IF hash OPERATOR(pg_catalog.>=) 9223372036854775808 THEN
        hash := hash OPERATOR(pg_catalog.-) 18446744073709551616;
    END IF;
    RETURN 'rate_limiter_' OPERATOR(pg_catalog.||) pg_catalog.lower(event) OPERATOR(pg_catalog.||) '_'
           OPERATOR(pg_catalog.||) pg_catalog.lpad(pg_catalog.to_hex(hash::bigint), 16, '0');
END $$;

-- The attribute number of a user column of the table, refusing one it does not have (42703),
-- and with `counted` one that is no number.
CREATE FUNCTION rate_limiter._write_column(tab regclass, col text, role text, counted boolean) RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    type_oid oid;
BEGIN
    SELECT a.atttypid INTO type_oid FROM pg_catalog.pg_attribute a
    WHERE a.attrelid OPERATOR(pg_catalog.=) tab AND a.attname OPERATOR(pg_catalog.=) col
      AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped;
    IF type_oid IS NULL THEN
        PERFORM rate_limiter._raise('write_column', pg_catalog.format('the %s column %s is not a column of %s', role,
                                    pg_catalog.to_json(col), tab));
    END IF;
    type_oid := rate_limiter._base_type(type_oid);
    IF counted AND type_oid OPERATOR(pg_catalog.<>) ALL
           (ARRAY['int2', 'int4', 'int8', 'float4', 'float8', 'numeric']::pg_catalog.regtype[]::oid[]) THEN
        PERFORM rate_limiter._raise('write_column', pg_catalog.format(
            'the count column %s of %s is not of an integer, numeric or floating-point type', pg_catalog.to_json(col), tab));
    END IF;
    -- A key's text no setting of the writer's changes (DateStyle, extra_float_digits, ...).
    IF NOT counted AND type_oid OPERATOR(pg_catalog.<>) ALL
           (ARRAY['text', 'varchar', 'bpchar', 'name', 'int2', 'int4', 'int8', 'numeric', 'uuid', 'bool', 'inet', 'cidr',
                  'macaddr', 'oid']::pg_catalog.regtype[]::oid[])
       AND (SELECT y.typtype FROM pg_catalog.pg_type y WHERE y.oid OPERATOR(pg_catalog.=) type_oid) OPERATOR(pg_catalog.<>) 'e' THEN
        PERFORM rate_limiter._raise('write_column', pg_catalog.format(
            'the key column %s of %s is of a type whose text depends on the writer''s settings: give a text, integer, numeric, uuid, boolean, network address or enum column',
            pg_catalog.to_json(col), tab));
    END IF;
END $$;

-- A domain's base type, else the type.
CREATE FUNCTION rate_limiter._base_type(t oid) RETURNS oid
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
    WITH RECURSIVE down(oid, base) AS (
        SELECT y.oid, y.typbasetype FROM pg_catalog.pg_type y WHERE y.oid OPERATOR(pg_catalog.=) t
        UNION ALL
        SELECT y.oid, y.typbasetype FROM down d JOIN pg_catalog.pg_type y ON y.oid OPERATOR(pg_catalog.=) d.base
    )
    SELECT d.oid FROM down d WHERE d.base OPERATOR(pg_catalog.=) 0
$$;

-- The caller owns the table (or is a member of its owner's role) and may call rate_limit;
-- the table is one of the user's; locked as CREATE TRIGGER locks it, once owned.
CREATE FUNCTION rate_limiter._write_limitable(tab regclass, declaring boolean DEFAULT true) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    kind "char";
    schema oid;
BEGIN
    IF tab IS NULL THEN
        PERFORM rate_limiter._raise('argument', 'table must not be NULL');
    END IF;
    FOR i IN 1 .. 2 LOOP
        IF NOT pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) tab),
                                      'USAGE') THEN
            PERFORM rate_limiter._raise('write_denied', pg_catalog.format('%s: this role does not own it', tab));
        END IF;
        EXIT WHEN i OPERATOR(pg_catalog.=) 2;
        EXECUTE pg_catalog.format('LOCK TABLE %s IN SHARE ROW EXCLUSIVE MODE', tab);
    END LOOP;
    SELECT c.relkind, c.relnamespace INTO kind, schema FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) tab;
    IF kind OPERATOR(pg_catalog.<>) ALL (ARRAY['r', 'p']::"char"[]) THEN
        PERFORM rate_limiter._raise('unsupported', pg_catalog.format('limiting the writes of %s, which is not a table', tab));
    END IF;
    IF schema OPERATOR(pg_catalog.=) ANY (ARRAY['rate_limiter'::regnamespace, 'pg_catalog'::regnamespace,
                                                 'information_schema'::regnamespace]::oid[]) THEN
        PERFORM rate_limiter._raise('unsupported', pg_catalog.format('limiting the writes of %s, a table of the system or of rate_limiter', tab));
    END IF;
    IF NOT declaring THEN
        RETURN;  -- dropping a write limit takes the table's owner alone
    END IF;
    IF NOT pg_catalog.has_function_privilege(
           'rate_limiter.rate_limit(pg_catalog.text, pg_catalog.text, pg_catalog.float8, pg_catalog.bool, pg_catalog.bool, pg_catalog.jsonb)',
           'EXECUTE') THEN
        PERFORM rate_limiter._raise('write_denied', pg_catalog.format('%s: this role may not execute rate_limiter.rate_limit', tab));
    END IF;
    -- A role that holds TRIGGER could replace the limit's trigger (CREATE OR REPLACE TRIGGER).
    IF EXISTS (SELECT FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
               WHERE c.oid OPERATOR(pg_catalog.=) ANY (SELECT rate_limiter._with_partitions(tab))
                 AND a.privilege_type OPERATOR(pg_catalog.=) 'TRIGGER' AND a.grantee OPERATOR(pg_catalog.<>) c.relowner) THEN
        PERFORM rate_limiter._raise('write_denied', pg_catalog.format(
            '%s: a role other than its owner holds TRIGGER on it, and could replace the limit''s trigger (REVOKE TRIGGER first)', tab));
    END IF;
END $$;

-- The write limits' triggers, their arguments decoded (tgargs holds each NUL-terminated).
CREATE FUNCTION rate_limiter._write_limited() RETURNS trigger
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    key_column text;
    count_column text;
    config jsonb;
    query text;
    charge record;
    keys text[] := '{}';
    counts pg_catalog.float8[] := '{}';
BEGIN
    -- Only as a write limit's trigger, whose statement's rows are the transition table
    -- rate_limiter_rows: without one, that name would be looked up in the writer's pg_temp.
    IF TG_LEVEL OPERATOR(pg_catalog.<>) 'STATEMENT' OR TG_WHEN OPERATOR(pg_catalog.<>) 'AFTER'
       OR TG_NARGS OPERATOR(pg_catalog.<>) 5 OR TG_ARGV[0] OPERATOR(pg_catalog.<>) '1'
       OR NOT EXISTS (SELECT FROM pg_catalog.pg_trigger g
                      WHERE g.tgrelid OPERATOR(pg_catalog.=) TG_RELID AND g.tgname OPERATOR(pg_catalog.=) TG_NAME
                        AND CASE WHEN TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN g.tgoldtable ELSE g.tgnewtable END
                            OPERATOR(pg_catalog.=) 'rate_limiter_rows')
       OR pg_catalog.to_regclass('pg_temp.rate_limiter_rows') IS NOT NULL THEN
        PERFORM rate_limiter._raise('unsupported', 'rate_limiter._write_limited() fired other than as a write limit''s trigger: only limit_writes() makes its triggers');
    END IF;
    -- A write limit charges with its table's owner's authority, whoever made its trigger.
    IF NOT pg_catalog.has_function_privilege((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) TG_RELID),
           'rate_limiter.rate_limit(pg_catalog.text, pg_catalog.text, pg_catalog.float8, pg_catalog.bool, pg_catalog.bool, pg_catalog.jsonb)',
           'EXECUTE') THEN
        PERFORM rate_limiter._raise('write_denied', pg_catalog.format('%s: its owner may no longer execute rate_limiter.rate_limit',
                                    TG_RELID::regclass));
    END IF;
    key_column := NULLIF(TG_ARGV[2], '');
    count_column := NULLIF(TG_ARGV[3], '');
    config := NULLIF(TG_ARGV[4], '')::jsonb;
    IF key_column IS NOT NULL THEN
        PERFORM rate_limiter._write_column(TG_RELID::regclass, key_column, 'key', false);
    END IF;
    IF count_column IS NOT NULL THEN
        PERFORM rate_limiter._write_column(TG_RELID::regclass, count_column, 'count', true);
    END IF;
    -- The key through its type's output function (format's %s), never a cast of the user's,
    -- compared bytewise ("C": a nondeterministic collation would merge keys). The sums per
    -- key are read whole, and checked, before any is charged; then each key in the keys'
    -- order, the NULL key first (as the extension sorts them). The counts go to rate_limit as
    -- float8 values, never through text (whose digits a writer's extra_float_digits sets).
    query := pg_catalog.format(
        'SELECT r.k, pg_catalog.sum(r.c) AS c, '
        '       pg_catalog.bool_or(r.c IS NULL OR NOT (r.c OPERATOR(pg_catalog.>=) 0 AND r.c OPERATOR(pg_catalog.<) ''Infinity'')) AS bad '
        'FROM (SELECT %s AS k, %s AS c FROM rate_limiter_rows t) r '
        'GROUP BY r.k ORDER BY r.k IS NOT NULL, r.k',
        CASE WHEN key_column IS NULL THEN 'NULL::pg_catalog.text'
             ELSE pg_catalog.format('CASE WHEN t.%1$I IS NULL THEN NULL ELSE pg_catalog.format(''%%s'', t.%1$I) COLLATE "C" END', key_column) END,
        CASE WHEN count_column IS NULL THEN '1::pg_catalog.float8'
             ELSE pg_catalog.format('t.%I::pg_catalog.float8', count_column) END);
    FOR charge IN EXECUTE query LOOP
        IF charge.bad THEN
            PERFORM rate_limiter._raise('argument', pg_catalog.format('the count column %s of a row written to %s is NULL, negative or not finite',
                                        pg_catalog.to_json(count_column), TG_RELID::regclass));
        END IF;
        IF pg_catalog.cardinality(counts) OPERATOR(pg_catalog.=) 1000 THEN
            PERFORM rate_limiter._raise('argument', pg_catalog.format('a statement writing %s charges more than 1000 keys of %s at once: split it',
                                        TG_RELID::regclass, pg_catalog.to_json(TG_ARGV[1])));
        END IF;
        keys := keys OPERATOR(pg_catalog.||) charge.k;
        counts := counts OPERATOR(pg_catalog.||) charge.c;
    END LOOP;
    FOR i IN 1 .. pg_catalog.cardinality(counts) LOOP
        PERFORM rate_limiter.rate_limit(TG_ARGV[1], keys[i], counts[i], throws => true, config => config);
    END LOOP;
    RETURN NULL;
END $$;
COMMENT ON FUNCTION rate_limiter._write_limited() IS
    'The trigger of a write limit (limit_writes): charges a statement''s rows per key, all or nothing.';

CREATE VIEW rate_limiter.write_limits AS
SELECT t.tgrelid::pg_catalog.regclass AS "table",
       a.arguments[2] AS limit_name,
       NULLIF(a.arguments[3], '') AS key_column,
       NULLIF(a.arguments[4], '') AS count_column,
       CASE WHEN (t.tgtype::integer OPERATOR(pg_catalog.&) 4) OPERATOR(pg_catalog.<>) 0 THEN 'INSERT'
            WHEN (t.tgtype::integer OPERATOR(pg_catalog.&) 16) OPERATOR(pg_catalog.<>) 0 THEN 'UPDATE'
            ELSE 'DELETE' END AS event,
       NULLIF(a.arguments[5], '')::pg_catalog.jsonb AS config,
       t.tgname AS trigger_name,
       t.tgenabled OPERATOR(pg_catalog.=) ANY (ARRAY['O', 'A']::"char"[]) AS enabled
FROM pg_catalog.pg_trigger t
CROSS JOIN LATERAL (
    -- Split at each NUL byte, the bytes between as text of the database's encoding.
    WITH RECURSIVE split(n, argument, rest) AS (
        SELECT 0, NULL::pg_catalog.bytea, t.tgargs
        UNION ALL
        SELECT s.n OPERATOR(pg_catalog.+) 1,
               pg_catalog.substring(s.rest, 1, pg_catalog.position(s.rest, '\x00'::pg_catalog.bytea) OPERATOR(pg_catalog.-) 1),
               pg_catalog.substring(s.rest, pg_catalog.position(s.rest, '\x00'::pg_catalog.bytea) OPERATOR(pg_catalog.+) 1)
        FROM split s WHERE pg_catalog.position(s.rest, '\x00'::pg_catalog.bytea) OPERATOR(pg_catalog.>) 0
    )
    SELECT pg_catalog.array_agg(pg_catalog.convert_from(s.argument, pg_catalog.getdatabaseencoding()) ORDER BY s.n)
    FROM split s WHERE s.n OPERATOR(pg_catalog.>) 0
) AS a(arguments)
WHERE t.tgfoid OPERATOR(pg_catalog.=) 'rate_limiter._write_limited()'::pg_catalog.regprocedure;
COMMENT ON VIEW rate_limiter.write_limits IS
    'Every write limit (rate_limiter.limit_writes): one row per table, limit and event.';

-- The table and every partition under it, as limit_writes makes its triggers.
CREATE FUNCTION rate_limiter._with_partitions(tab regclass) RETURNS SETOF regclass
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
    SELECT tab
    UNION ALL
    SELECT t.relid FROM pg_catalog.pg_partition_tree(tab) t WHERE t.relid OPERATOR(pg_catalog.<>) tab
$$;

CREATE FUNCTION rate_limiter._drop_write_triggers(tab regclass, limit_name text) RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    found record;
    dropped integer := 0;
BEGIN
    FOR found IN SELECT w.trigger_name, w."table" FROM rate_limiter.write_limits w
                 WHERE w."table" OPERATOR(pg_catalog.=) ANY (SELECT rate_limiter._with_partitions(tab))
                   AND (_drop_write_triggers.limit_name IS NULL
                        OR w.limit_name OPERATOR(pg_catalog.=) _drop_write_triggers.limit_name)
                 ORDER BY 2, 1 LOOP
        EXECUTE pg_catalog.format('DROP TRIGGER %I ON %s', found.trigger_name, found."table");
        dropped := dropped OPERATOR(pg_catalog.+) 1;
    END LOOP;
    RETURN dropped;
END $$;

CREATE FUNCTION rate_limiter.limit_writes(
    "table" regclass,
    limit_name text,
    key text DEFAULT NULL,
    events text[] DEFAULT '{INSERT}',
    count text DEFAULT NULL,
    config jsonb DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    event text;
    wanted text[] := '{}';
    tab regclass;
BEGIN
    PERFORM rate_limiter._valid_name(limit_name);
    FOREACH event IN ARRAY coalesce(events, '{}') LOOP
        IF event IS NULL OR pg_catalog.upper(event) OPERATOR(pg_catalog.<>) ALL (ARRAY['INSERT', 'UPDATE', 'DELETE']) THEN
            PERFORM rate_limiter._raise('argument', pg_catalog.format('events: %s is not INSERT, UPDATE or DELETE',
                                        pg_catalog.to_json(coalesce(event, 'NULL'))));
        END IF;
        IF pg_catalog.upper(event) OPERATOR(pg_catalog.<>) ALL (wanted) THEN
            wanted := wanted OPERATOR(pg_catalog.||) pg_catalog.upper(event);
        END IF;
    END LOOP;
    IF pg_catalog.cardinality(wanted) OPERATOR(pg_catalog.=) 0 THEN
        PERFORM rate_limiter._raise('argument', 'events must name INSERT, UPDATE or DELETE');
    END IF;
    PERFORM rate_limiter._write_limitable("table");
    IF key IS NOT NULL THEN
        PERFORM rate_limiter._write_column("table", key, 'key', false);
    END IF;
    IF count IS NOT NULL THEN
        PERFORM rate_limiter._write_column("table", count, 'count', true);
    END IF;
    -- The limit as the trigger will call it: named and defined, or inline, and one
    -- rate_limit_all takes.
    PERFORM rate_limiter.check_rate_limit_all(pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object(
        'name', limit_name, 'key', NULL, 'count', 0, 'config', config)));
    PERFORM rate_limiter._drop_write_triggers("table", limit_name);
    FOR tab IN SELECT rate_limiter._with_partitions("table") LOOP
        FOREACH event IN ARRAY wanted LOOP
            EXECUTE pg_catalog.format(
                'CREATE TRIGGER %I AFTER %s ON %s REFERENCING %s TABLE AS rate_limiter_rows FOR EACH STATEMENT '
                'EXECUTE FUNCTION rate_limiter._write_limited(%L, %L, %L, %L, %L)',
                rate_limiter._write_trigger_name(event, limit_name), event, tab,
                CASE event WHEN 'DELETE' THEN 'OLD' ELSE 'NEW' END,
                '1', limit_name, coalesce(key, ''), coalesce(count, ''), coalesce(config::text, ''));
        END LOOP;
    END LOOP;
END $$;
COMMENT ON FUNCTION rate_limiter.limit_writes(regclass, text, text, text[], text, jsonb) IS
    'Holds every write of the table (events) to the limit, per key column value, each row counting 1 or its count column: a statement over the limit fails whole with RL429.';

CREATE FUNCTION rate_limiter.unlimit_writes("table" regclass, limit_name text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM rate_limiter._write_limitable("table", declaring => false);
    RETURN rate_limiter._drop_write_triggers("table", limit_name);
END $$;
COMMENT ON FUNCTION rate_limiter.unlimit_writes(regclass, text) IS
    'Drops the table''s write limits (the named limit''s alone, when given); how many triggers it dropped.';

-- ip_key, as the extension's (sql/finalize.sql).
-- A stable key for a client address. An IPv6 address that carries a client's IPv4 address
-- (decided by its bits, however it was written) is that IPv4 address: IPv4-mapped
-- (::ffff:0:0/96), NAT64's well-known prefix (64:ff9b::/96, RFC 6052), 6to4 (2002::/16,
-- RFC 3056: the site's address) and Teredo (2001::/32, RFC 4380: the client's public address,
-- its bits inverted). The address, its own mask dropped, is masked to v4_prefix or v6_prefix,
-- and the key is that network as cidr text. In SQL so that the text is PostgreSQL's own cidr
-- output; the embedded address is read from inet_send's bytes (4 of header, then the address).
CREATE FUNCTION rate_limiter.ip_key(addr inet, v4_prefix integer DEFAULT 32, v6_prefix integer DEFAULT 56)
RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path TO pg_catalog, pg_temp
AS $function$
DECLARE
    address inet := pg_catalog.set_masklen(addr, CASE pg_catalog.family(addr) WHEN 4 THEN 32 ELSE 128 END);
    v4_at integer;
    v4 bit(32);
BEGIN
    IF v4_prefix OPERATOR(pg_catalog.<) 0 OR v4_prefix OPERATOR(pg_catalog.>) 32 THEN
        RAISE EXCEPTION 'rate_limiter: v4_prefix must be between 0 and 32, not %', v4_prefix
            USING ERRCODE = 'invalid_parameter_value', HINT = '32 keys each IPv4 address on its own; 24 keys its /24.';
    END IF;
    IF v6_prefix OPERATOR(pg_catalog.<) 0 OR v6_prefix OPERATOR(pg_catalog.>) 128 THEN
        RAISE EXCEPTION 'rate_limiter: v6_prefix must be between 0 and 128, not %', v6_prefix
            USING ERRCODE = 'invalid_parameter_value', HINT = '56 (the default) keys a typical customer''s whole IPv6 allocation; 64 keys one subnet.';
    END IF;
    -- Where the IPv4 address starts among the IPv6 address's 16 bytes.
    v4_at := CASE
        WHEN address OPERATOR(pg_catalog.<<=) '::ffff:0.0.0.0/96'::inet THEN 12
        WHEN address OPERATOR(pg_catalog.<<=) '64:ff9b::/96'::inet THEN 12
        WHEN address OPERATOR(pg_catalog.<<=) '2002::/16'::inet THEN 2
        WHEN address OPERATOR(pg_catalog.<<=) '2001::/32'::inet THEN 12
    END;
    IF v4_at IS NOT NULL THEN
        v4 := CAST('x' OPERATOR(pg_catalog.||) pg_catalog.encode(
            pg_catalog.substring(pg_catalog.inet_send(address), 5 OPERATOR(pg_catalog.+) v4_at, 4), 'hex') AS bit(32));
        IF address OPERATOR(pg_catalog.<<=) '2001::/32'::inet THEN
            v4 := OPERATOR(pg_catalog.~) v4;
        END IF;
        address := '0.0.0.0'::inet OPERATOR(pg_catalog.+) CAST(v4 AS bigint);
    END IF;
    RETURN pg_catalog.network(pg_catalog.set_masklen(address,
        CASE pg_catalog.family(address) WHEN 4 THEN v4_prefix ELSE v6_prefix END))::text;
END
$function$;

COMMENT ON FUNCTION rate_limiter.ip_key(inet, integer, integer) IS
    'A rate-limit key for a client address: an IPv6 address carrying an IPv4 one (mapped, NAT64 64:ff9b::/96, 6to4, Teredo) as that IPv4 address, IPv4 masked to v4_prefix, IPv6 to v6_prefix, as cidr text.';

-- The edition's version, as extversion is the extension's.
CREATE FUNCTION rate_limiter.edition() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN 'sql-only 0.8.0';
COMMENT ON FUNCTION rate_limiter.edition() IS 'The SQL-only edition''s version.';

-- As the extension: nothing for PUBLIC, and none of what the installing role's default
-- privileges (ALTER DEFAULT PRIVILEGES) gave other roles on what this script created: the
-- owner grants the application what it calls (docs/api.md, Privileges).
REVOKE ALL ON ALL TABLES IN SCHEMA rate_limiter FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA rate_limiter FROM PUBLIC;
REVOKE ALL ON SCHEMA rate_limiter FROM PUBLIC;
DO $$
DECLARE
    schema_oid oid := 'rate_limiter'::regnamespace;
    grant_row record;
BEGIN
    FOR grant_row IN
        SELECT 'SCHEMA rate_limiter' AS object, a.grantee FROM pg_catalog.pg_namespace n, pg_catalog.aclexplode(n.nspacl) a
        WHERE n.oid OPERATOR(pg_catalog.=) schema_oid AND a.grantee OPERATOR(pg_catalog.<>) n.nspowner
        UNION SELECT 'TABLE ' || c.oid::regclass::text, a.grantee FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
        WHERE c.relnamespace OPERATOR(pg_catalog.=) schema_oid AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
        UNION SELECT 'FUNCTION ' || p.oid::regprocedure::text, a.grantee FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
        WHERE p.pronamespace OPERATOR(pg_catalog.=) schema_oid AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
        UNION SELECT 'TYPE ' || t.oid::regtype::text, a.grantee FROM pg_catalog.pg_type t, pg_catalog.aclexplode(t.typacl) a
        WHERE t.typnamespace OPERATOR(pg_catalog.=) schema_oid AND a.grantee OPERATOR(pg_catalog.<>) t.typowner
          AND a.grantee OPERATOR(pg_catalog.<>) 0  -- PUBLIC's USAGE on a type is PostgreSQL's own default
          AND t.typcategory OPERATOR(pg_catalog.<>) 'A'  -- an array type follows its element's
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON %s FROM %s', grant_row.object,
            CASE WHEN grant_row.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC' ELSE grant_row.grantee::regrole::text END);
    END LOOP;
END $$;
$_pgtle_$);
CREATE EXTENSION rate_limiter_sql;
