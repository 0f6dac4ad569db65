-- Tables and the decision type, created before the Rust functions that use them.
-- CREATE EXTENSION creates the schema rate_limiter (see rate_limiter.control), or uses one
-- that exists already.
--
-- This script runs as a superuser with search_path = rate_limiter: every operator and
-- function it uses, CHECK constraints included, is qualified with pg_catalog, so that none
-- resolves to a look-alike planted in the schema.

-- A schema that exists already and belongs to another role (one created before
-- CREATE EXTENSION) is that role's: it could drop or replace the extension's objects.
DO $$
DECLARE
    schema_owner pg_catalog.oid := (SELECT n.nspowner FROM pg_catalog.pg_namespace n
                                    WHERE n.oid OPERATOR(pg_catalog.=) '@extschema@'::pg_catalog.regnamespace);
    extension_owner pg_catalog.oid := (SELECT e.extowner FROM pg_catalog.pg_extension e
                                       WHERE e.extname OPERATOR(pg_catalog.=) 'rate_limiter');
BEGIN
    IF schema_owner OPERATOR(pg_catalog.<>) extension_owner
       AND NOT (SELECT r.rolsuper FROM pg_catalog.pg_authid r WHERE r.oid OPERATOR(pg_catalog.=) schema_owner) THEN
        RAISE EXCEPTION 'schema @extschema@ is owned by role %, which is not installing the extension',
            schema_owner::pg_catalog.regrole
            USING ERRCODE = '42501',
                  HINT = 'Drop the schema or make the installing role its owner (ALTER SCHEMA @extschema@ OWNER TO ...), then CREATE EXTENSION rate_limiter again.';
    END IF;
END $$;

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

-- Keep user configuration in pg_dump output.
SELECT pg_catalog.pg_extension_config_dump('rate_limiter.limits', '');

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
SELECT pg_catalog.pg_extension_config_dump('rate_limiter.overrides', '');

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
SELECT pg_catalog.pg_extension_config_dump('rate_limiter.tiers', '');

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
-- Loading a key's escrow and folding a limit read only their own rows, in seq order.
CREATE INDEX debits_key ON rate_limiter.debits (name, key, seq);
COMMENT ON INDEX rate_limiter.debits_key IS
    'A hot (name, key)''s debits in seq order: what loading its escrow and folding read.';

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

-- Memory limits' counts as the background worker last wrote them (docs/memory-limits.md,
-- "Restarts and crashes"): what a server loads after a crash, or a standby at promotion.
CREATE TABLE rate_limiter.memory_snapshot (
    origin bigint NOT NULL,
    seq bigint GENERATED ALWAYS AS IDENTITY,
    kind text NOT NULL CHECK (kind OPERATOR(pg_catalog.=) ANY (ARRAY['full', 'changed', 'forget', 'rows'])),
    keys integer NOT NULL,
    records bytea NOT NULL,
    expires timestamptz NOT NULL,
    saved_at timestamptz NOT NULL,
    PRIMARY KEY (origin, seq)
);
CREATE UNIQUE INDEX memory_snapshot_rows ON rate_limiter.memory_snapshot (origin) WHERE kind OPERATOR(pg_catalog.=) 'rows';
COMMENT ON TABLE rate_limiter.memory_snapshot IS
    'The counts of memory limits (durable => false) as the background worker last wrote them, every rate_limiter.memory_snapshot: a log, loaded in the order of seq after a crash and at a promotion. Written only by the rate_limiter library.';
COMMENT ON COLUMN rate_limiter.memory_snapshot.origin IS 'Whose log the row is of: a tag of the cluster''s memory limits secret, which its physical standbys share. Rows of another origin (a logical publisher''s) are neither loaded nor deleted by this cluster.';
COMMENT ON COLUMN rate_limiter.memory_snapshot.seq IS 'The order in which the rows were written: a later record of a key replaces an earlier one.';
COMMENT ON COLUMN rate_limiter.memory_snapshot.kind IS 'full: every key counted in memory as of one round, which replaces every row before it; changed: the keys a round found changed; forget: a reset''s or a dropped limit''s keys go; rows: keys were counted in rate_limiter.state for want of room in shared memory.';
COMMENT ON COLUMN rate_limiter.memory_snapshot.keys IS 'How many keys the row holds.';
COMMENT ON COLUMN rate_limiter.memory_snapshot.records IS 'The keys (a 128-bit keyed hash under the cluster''s secret) and their counts, calls in flight at the time included, packed in the library''s own encoding; for forget, which keys go.';
COMMENT ON COLUMN rate_limiter.memory_snapshot.expires IS 'From this instant every count of the row equals an absent key''s: rate_limiter.prune() deletes the row.';
COMMENT ON COLUMN rate_limiter.memory_snapshot.saved_at IS 'When the row was written.';
COMMENT ON INDEX rate_limiter.memory_snapshot_pkey IS 'Each origin''s log, in its order.';
COMMENT ON INDEX rate_limiter.memory_snapshot_rows IS 'One mark of rows per origin.';

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
