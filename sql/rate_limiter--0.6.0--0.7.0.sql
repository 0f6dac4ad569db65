-- rate_limiter 0.6.0 -> 0.7.0: memory limits at the scale of a real API's keys (issue 53,
-- docs/memory-limits.md): a key that finds no room in shared memory is counted in its row
-- of rate_limiter.state, which the statistics count (memory_in_rows), and the snapshot's
-- entries are named by a keyed hash under the cluster's secret, written as a log of packed
-- rows. Overrides (issue 55): a key of a named limit decided under numbers of its own.
--
-- Runs as a superuser with search_path = rate_limiter: every object and operator is qualified.

\echo Use "ALTER EXTENSION rate_limiter UPDATE TO '0.7.0'" to load this file. \quit

-- The description a fresh install takes from rate_limiter.control.
COMMENT ON EXTENSION rate_limiter IS 'Transactional rate limits in your own transactions: token buckets, fixed, sliding and rolling windows, calendar quotas, concurrency, hot and memory limits';

-- The snapshot becomes a log of packed rows (a changed key costs at most 64 bytes of WAL a
-- round, not a row of its own): 0.6.0's rows, named by SHA-256, match no key of 0.7.0 and
-- go with the table (docs/operations.md, "0.6.0 to 0.7.0").
DROP TABLE rate_limiter.memory_snapshot;
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
-- As a fresh install leaves it (sql/finalize.sql): an explicit ACL of its owner's alone.
REVOKE ALL ON rate_limiter.memory_snapshot FROM PUBLIC;

-- The statistics count calls of memory limits counted in rows (memory_in_rows). A function's
-- result cannot change in place: the view and the two functions are created again, new
-- symbols behind them (0.6.0's say to run this update), and the privileges granted on them
-- given back.
DO $$
DECLARE
    grants text[];
BEGIN
    SELECT pg_catalog.array_agg(pg_catalog.format('GRANT %s ON %s TO %s%s', a.privilege_type, o.what,
               CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
                    ELSE a.grantee::pg_catalog.regrole::pg_catalog.text END,
               CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END))
    INTO grants
    FROM (SELECT 'TABLE rate_limiter.stats' AS what, c.relacl AS acl, c.relowner AS owner
            FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) 'rate_limiter.stats'::pg_catalog.regclass
          UNION ALL
          SELECT 'FUNCTION ' OPERATOR(pg_catalog.||) p.oid::pg_catalog.regprocedure::pg_catalog.text, p.proacl, p.proowner
            FROM pg_catalog.pg_proc p
           WHERE p.oid OPERATOR(pg_catalog.=) ANY (ARRAY['rate_limiter._stats()'::pg_catalog.regprocedure,
                                                        'rate_limiter.stats_every_database()'::pg_catalog.regprocedure])) o,
         pg_catalog.aclexplode(o.acl) a
    WHERE a.grantee OPERATOR(pg_catalog.<>) o.owner;
    DROP VIEW rate_limiter.stats;
    DROP FUNCTION rate_limiter._stats();
    DROP FUNCTION rate_limiter.stats_every_database();
    CREATE FUNCTION rate_limiter."_stats"() RETURNS TABLE (
        "name" TEXT,
        "calls" bigint,
        "allowed" bigint,
        "denied" bigint,
        "tokens_granted" double precision,
        "tokens_reserved" double precision,
        "last_allowed_at" timestamp with time zone,
        "last_denied_at" timestamp with time zone,
        "stats_reset" timestamp with time zone,
        "shadow_denied" bigint,
        "memory_in_rows" bigint
    )
    STRICT VOLATILE PARALLEL RESTRICTED
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'stats_since_0_7_0_wrapper';
    CREATE FUNCTION rate_limiter."stats_every_database"() RETURNS TABLE (
        "database" TEXT,
        "name" TEXT,
        "calls" bigint,
        "allowed" bigint,
        "denied" bigint,
        "tokens_granted" double precision,
        "tokens_reserved" double precision,
        "last_allowed_at" timestamp with time zone,
        "last_denied_at" timestamp with time zone,
        "stats_reset" timestamp with time zone,
        "shadow_denied" bigint,
        "memory_in_rows" bigint
    )
    STRICT VOLATILE PARALLEL RESTRICTED
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'stats_every_database_since_0_7_0_wrapper';
    REVOKE ALL ON FUNCTION rate_limiter._stats() FROM PUBLIC;
    REVOKE ALL ON FUNCTION rate_limiter.stats_every_database() FROM PUBLIC;
    CREATE VIEW rate_limiter.stats AS SELECT * FROM rate_limiter._stats();
    REVOKE ALL ON rate_limiter.stats FROM PUBLIC;
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
    COMMENT ON COLUMN rate_limiter.stats.shadow_denied IS 'Allowed calls that would have been denied, answered ok in shadow mode (reason ''shadow''): counted in allowed too.';
    COMMENT ON COLUMN rate_limiter.stats.memory_in_rows IS 'Calls of a memory limit counted in their key''s row of rate_limiter.state, as a durable limit''s, because shared memory had no room for the key (rate_limiter.memory_keys).';
    COMMENT ON FUNCTION rate_limiter._stats() IS 'Internal: the rows of rate_limiter.stats.';
    COMMENT ON FUNCTION rate_limiter.stats_every_database() IS
        'The rows of rate_limiter.stats of every database, with its name (superusers and pg_monitor members only).';
    -- Given back at the end of the script, after the pin of default privileges, which would
    -- take back a grant the owner's default privileges happen to repeat.
    PERFORM pg_catalog.set_config('rate_limiter_update.grants',
        (coalesce(NULLIF(pg_catalog.current_setting('rate_limiter_update.grants', true), ''), '[]')::pg_catalog.jsonb
         OPERATOR(pg_catalog.||) coalesce(pg_catalog.to_jsonb(grants), '[]'::pg_catalog.jsonb))::pg_catalog.text, true);
END $$;

-- Overrides (issue 55, docs/api.md): a key of a named limit decided under numbers of its own.
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
-- As a fresh install leaves it (sql/finalize.sql): an explicit ACL of its owner's alone.
REVOKE ALL ON rate_limiter.overrides FROM PUBLIC;
CREATE TRIGGER overrides_changed
    AFTER INSERT OR UPDATE OR DELETE ON rate_limiter.overrides
    FOR EACH ROW EXECUTE FUNCTION rate_limiter._limits_changed();
CREATE TRIGGER overrides_truncated
    AFTER TRUNCATE ON rate_limiter.overrides
    FOR EACH STATEMENT EXECUTE FUNCTION rate_limiter._limits_changed();
ALTER TABLE rate_limiter.overrides ENABLE ALWAYS TRIGGER overrides_changed;
ALTER TABLE rate_limiter.overrides ENABLE ALWAYS TRIGGER overrides_truncated;
REVOKE ALL ON rate_limiter.tiers FROM PUBLIC;
CREATE TRIGGER tiers_changed
    AFTER INSERT OR UPDATE OR DELETE ON rate_limiter.tiers
    FOR EACH ROW EXECUTE FUNCTION rate_limiter._limits_changed();
CREATE TRIGGER tiers_truncated
    AFTER TRUNCATE ON rate_limiter.tiers
    FOR EACH STATEMENT EXECUTE FUNCTION rate_limiter._limits_changed();
ALTER TABLE rate_limiter.tiers ENABLE ALWAYS TRIGGER tiers_changed;
ALTER TABLE rate_limiter.tiers ENABLE ALWAYS TRIGGER tiers_truncated;
CREATE FUNCTION rate_limiter."override"(
    "name" TEXT,
    "key" TEXT,
    "rate" double precision DEFAULT NULL,
    "period" interval DEFAULT NULL,
    "capacity" double precision DEFAULT NULL,
    "max_reserved" double precision DEFAULT NULL,
    "min_gap" interval DEFAULT NULL,
    "exempt" bool DEFAULT false,
    "tier" TEXT DEFAULT NULL,
    "until" timestamp with time zone DEFAULT 'infinity',
    "note" TEXT DEFAULT NULL
) RETURNS void
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'set_override_wrapper';
CREATE FUNCTION rate_limiter."remove_override"(
    "name" TEXT,
    "key" TEXT
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'remove_override_wrapper';
REVOKE ALL ON FUNCTION rate_limiter.override(text, text, double precision, interval, double precision, double precision, interval, boolean, text, timestamptz, text) FROM PUBLIC;
CREATE FUNCTION rate_limiter."define_tier"(
    "name" TEXT,
    "tier" TEXT,
    "rate" double precision DEFAULT NULL,
    "period" interval DEFAULT NULL,
    "capacity" double precision DEFAULT NULL,
    "max_reserved" double precision DEFAULT NULL,
    "min_gap" interval DEFAULT NULL,
    "exempt" bool DEFAULT false,
    "note" TEXT DEFAULT NULL
) RETURNS void
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'define_tier_wrapper';
CREATE FUNCTION rate_limiter."remove_tier"(
    "name" TEXT,
    "tier" TEXT
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'remove_tier_wrapper';
REVOKE ALL ON FUNCTION rate_limiter.remove_override(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION rate_limiter.define_tier(text, text, double precision, interval, double precision, double precision, interval, boolean, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION rate_limiter.remove_tier(text, text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter.override(text, text, double precision, interval, double precision, double precision, interval, boolean, text, timestamptz, text) IS
    'Give (name, key) numbers of its own under the named limit (NULL: the limit''s), or a tier''s, or exempt it, until until; its count is kept.';
COMMENT ON FUNCTION rate_limiter.remove_override(text, text) IS
    'Take back the override of (name, key); returns whether there was one. Its count is kept.';
COMMENT ON FUNCTION rate_limiter.define_tier(text, text, double precision, interval, double precision, double precision, interval, boolean, text) IS
    'Create or replace a tier of the named limit: numbers (NULL: the limit''s) that each override naming it gives its key.';
COMMENT ON FUNCTION rate_limiter.remove_tier(text, text) IS
    'Remove a tier of the named limit that no override names; returns whether there was one.';
COMMENT ON FUNCTION rate_limiter.prune(integer) IS
    'Delete up to max_rows rows of rate_limiter.state that hold what a fresh state would, or belong to named limits that no longer exist, and blocks, allows, overrides and leases that have ended; returns how many. Skips rows in use.';
COMMENT ON FUNCTION rate_limiter._limits_changed() IS
    'Internal: trigger that invalidates every backend''s cache of rate_limiter.limits, blocks, allows, overrides and tiers.';

-- The HTTP headers (issue 55, docs/api.md): http_headers takes the key, whose override's
-- numbers it reports, and both write draft 11's syntax (draft => 9: 0.6.0's), with the
-- partition key on request; http_problem is new. A function's arguments cannot change in
-- place: the two are created again, new symbols behind them (0.6.0's SQL names the old ones,
-- kept for a database not yet updated), and the EXECUTE grants they had given back.
DO $http$
DECLARE
    grants text[];
BEGIN
    SELECT pg_catalog.array_agg(pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s%s', o.now,
               CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
                    ELSE a.grantee::pg_catalog.regrole::pg_catalog.text END,
               CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END))
    INTO grants
    FROM (VALUES ('rate_limiter.http_headers(text, rate_limiter.decision, jsonb)',
                  'rate_limiter.http_headers(text, rate_limiter.decision, jsonb, text, integer, boolean)'),
                 ('rate_limiter.http_headers_all(jsonb, rate_limiter.decision)',
                  'rate_limiter.http_headers_all(jsonb, rate_limiter.decision, integer, boolean)')) f(was, now),
         LATERAL (SELECT f.now, p.proacl, p.proowner FROM pg_catalog.pg_proc p
                   WHERE p.oid OPERATOR(pg_catalog.=) f.was::pg_catalog.regprocedure) o,
         pg_catalog.aclexplode(o.proacl) a
    WHERE a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE' AND a.grantee OPERATOR(pg_catalog.<>) o.proowner;
    DROP FUNCTION rate_limiter.http_headers(text, rate_limiter.decision, jsonb);
    DROP FUNCTION rate_limiter.http_headers_all(jsonb, rate_limiter.decision);
    CREATE FUNCTION rate_limiter."http_headers"(
        "name" TEXT,
        "d" rate_limiter.decision,
        "config" jsonb DEFAULT NULL,
        "key" TEXT DEFAULT NULL,
        "draft" INT DEFAULT 11,
        "partition_key" bool DEFAULT false
    ) RETURNS jsonb
    STABLE PARALLEL RESTRICTED
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'http_headers_since_0_7_0_wrapper';
    CREATE FUNCTION rate_limiter."http_headers_all"(
        "requests" jsonb,
        "d" rate_limiter.decision,
        "draft" INT DEFAULT 11,
        "partition_key" bool DEFAULT false
    ) RETURNS jsonb
    STABLE PARALLEL RESTRICTED
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'http_headers_all_since_0_7_0_wrapper';
    CREATE FUNCTION rate_limiter."http_problem"(
        "d" rate_limiter.decision
    ) RETURNS jsonb
    IMMUTABLE PARALLEL SAFE
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'http_problem_wrapper';
    REVOKE ALL ON FUNCTION rate_limiter.http_headers(text, rate_limiter.decision, jsonb, text, integer, boolean) FROM PUBLIC;
    REVOKE ALL ON FUNCTION rate_limiter.http_headers_all(jsonb, rate_limiter.decision, integer, boolean) FROM PUBLIC;
    REVOKE ALL ON FUNCTION rate_limiter.http_problem(rate_limiter.decision) FROM PUBLIC;
    COMMENT ON FUNCTION rate_limiter.http_headers(text, rate_limiter.decision, jsonb, text, integer, boolean) IS
        'RateLimit-Policy, RateLimit and (when denied) Retry-After headers for a decision of the limit on key (its override''s numbers), as a jsonb object, in draft 11''s syntax (draft => 9: draft 09''s); partition_key adds the key as pk.';
    COMMENT ON FUNCTION rate_limiter.http_headers_all(jsonb, rate_limiter.decision, integer, boolean) IS
        'The HTTP headers for a decision of rate_limit_all(requests): one policy per limit.';
    COMMENT ON FUNCTION rate_limiter.http_problem(rate_limiter.decision) IS
        'The problem-details body (application/problem+json) of a denial, of type quota-exceeded naming the limit that denied it; NULL when the decision is ok.';
    -- Given back at the end of the script, after the pin of default privileges, which would
    -- take back a grant the owner's default privileges happen to repeat.
    PERFORM pg_catalog.set_config('rate_limiter_update.grants',
        (coalesce(NULLIF(pg_catalog.current_setting('rate_limiter_update.grants', true), ''), '[]')::pg_catalog.jsonb
         OPERATOR(pg_catalog.||) coalesce(pg_catalog.to_jsonb(grants), '[]'::pg_catalog.jsonb))::pg_catalog.text, true);
END
$http$;

-- Default privileges (ALTER DEFAULT PRIVILEGES) never reach an object this install or update
-- created: it keeps only the grants the scripts give, so that a role given EXECUTE on every
-- new function or SELECT on every new table gets neither define() nor a table (issue 41).
-- What PostgreSQL grants without any default privileges (PUBLIC's USAGE of a type) stays.
-- Created here means its membership of the extension (or, for the schema CREATE EXTENSION
-- makes, the schema) was recorded by this transaction (age 0, or below for a subtransaction);
-- an object replaced in place keeps its membership row, and with it every grant an
-- administrator made.
DO $pin$
DECLARE
    leaked record;
BEGIN
    FOR leaked IN
        WITH created AS (
            SELECT d.classid, d.objid
            FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_extension e ON e.oid OPERATOR(pg_catalog.=) d.refobjid
            WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
              AND d.deptype OPERATOR(pg_catalog.=) 'e' AND e.extname OPERATOR(pg_catalog.=) 'rate_limiter'
              AND pg_catalog.age(d.xmin) OPERATOR(pg_catalog.<=) 0),
        objects (what, owner, namespace, kind, acl) AS (
            SELECT 'ROUTINE ' OPERATOR(pg_catalog.||) p.oid::pg_catalog.regprocedure::pg_catalog.text,
                   p.proowner, p.pronamespace, 'f'::"char", p.proacl
            FROM created c JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) c.objid
            WHERE c.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
            UNION ALL
            SELECT CASE r.relkind WHEN 'S' THEN 'SEQUENCE ' ELSE 'TABLE ' END
                       OPERATOR(pg_catalog.||) r.oid::pg_catalog.regclass::pg_catalog.text,
                   r.relowner, r.relnamespace, CASE r.relkind WHEN 'S' THEN 'S' ELSE 'r' END::"char", r.relacl
            FROM created c JOIN pg_catalog.pg_class r ON r.oid OPERATOR(pg_catalog.=) c.objid
            WHERE c.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
            UNION ALL
            SELECT 'TYPE ' OPERATOR(pg_catalog.||) t.oid::pg_catalog.regtype::pg_catalog.text,
                   t.typowner, t.typnamespace, 'T'::"char", t.typacl
            FROM created c JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) c.objid
            WHERE c.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_type'::pg_catalog.regclass
            UNION ALL
            SELECT 'SCHEMA ' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(n.nspname), n.nspowner, 0::pg_catalog.oid,
                   'n'::"char", n.nspacl
            FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_extension e ON e.extnamespace OPERATOR(pg_catalog.=) n.oid
            WHERE e.extname OPERATOR(pg_catalog.=) 'rate_limiter' AND pg_catalog.age(n.xmin) OPERATOR(pg_catalog.<=) 0)
        SELECT o.what, a.privilege_type,
               CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                    ELSE a.grantee::pg_catalog.regrole::pg_catalog.text END AS grantee
        FROM objects o, pg_catalog.aclexplode(o.acl) a
        WHERE a.grantee OPERATOR(pg_catalog.<>) o.owner
          AND NOT EXISTS (SELECT FROM pg_catalog.aclexplode(pg_catalog.acldefault(
                              CASE o.kind WHEN 'S' THEN 's' ELSE o.kind END, o.owner)) b
                          WHERE b.grantee OPERATOR(pg_catalog.=) a.grantee
                            AND b.privilege_type OPERATOR(pg_catalog.=) a.privilege_type)
          AND EXISTS (SELECT FROM pg_catalog.pg_default_acl d, pg_catalog.aclexplode(d.defaclacl) g
                      WHERE d.defaclrole OPERATOR(pg_catalog.=) o.owner
                        AND d.defaclnamespace OPERATOR(pg_catalog.=) ANY (ARRAY[0::pg_catalog.oid, o.namespace])
                        AND d.defaclobjtype OPERATOR(pg_catalog.=) o.kind
                        AND g.grantee OPERATOR(pg_catalog.=) a.grantee
                        AND g.privilege_type OPERATOR(pg_catalog.=) a.privilege_type)
    LOOP
        EXECUTE pg_catalog.format('REVOKE %s ON %s FROM %s CASCADE', leaked.privilege_type, leaked.what, leaked.grantee);
    END LOOP;
END
$pin$;

-- The grants the objects created again above had (the statistics' view and functions,
-- http_headers and http_headers_all), given back after the pin: a grant is the
-- administrator's, whatever default privileges say.
DO $regrant$
DECLARE
    one text;
BEGIN
    FOR one IN SELECT pg_catalog.jsonb_array_elements_text(
                   coalesce(NULLIF(pg_catalog.current_setting('rate_limiter_update.grants', true), ''), '[]')::pg_catalog.jsonb) LOOP
        EXECUTE one;
    END LOOP;
END
$regrant$;
