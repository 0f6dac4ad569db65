-- rate_limiter 0.4.0 -> 0.5.0: a hot (name, key)'s debits found by their own index, so that
-- loading its escrow or folding its log reads only its rows, however long the log is; ip_key
-- keys an IPv6 address that carries a client's IPv4 address (NAT64, 6to4, Teredo) as that
-- IPv4 address, as it already did IPv4-mapped ones; the state of each inline config is kept
-- in a row of its own, and the sliding window keeps the tokens both its windows took.
-- Run ALTER EXTENSION rate_limiter UPDATE after installing the library: until then, hot
-- calls in this database get SQLSTATE 55000 with that hint.
--
-- Runs as a superuser with search_path = rate_limiter; ip_key pins its own search_path and
-- qualifies every operator and function it names.

CREATE INDEX debits_key ON rate_limiter.debits (name, key, seq);
COMMENT ON INDEX rate_limiter.debits_key IS
    'A hot (name, key)''s debits in seq order: what loading its escrow and folding read.';

-- The rows 0.4.0 wrote stay as they are: the library reads an inline config's old row as the
-- state its own row starts from, and a sliding window's one count as the previous window's.
COMMENT ON COLUMN rate_limiter.state.name IS
    'The limit''s name; for an inline config, the name, ''#'' and 32 hex digits of the config''s fingerprint: each inline config keeps a state of its own.';
COMMENT ON COLUMN rate_limiter.state.counts IS
    'Sliding window: {tokens taken in the window before ts, tokens taken in the window from ts} (a row 0.4.0 wrote holds the first only). Rolling window: tokens taken per counting cell, oldest first, the last starting at ts. NULL for the other kinds.';

CREATE OR REPLACE FUNCTION rate_limiter.ip_key(addr inet, v4_prefix integer DEFAULT 32, v6_prefix integer DEFAULT 56)
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

-- The statistics count calls answered in shadow mode (shadow_denied). A function's result
-- cannot change in place: the view and the two functions are created again, new symbols
-- behind them (0.4.0's say to run this update), and the privileges granted on them given back.
DO $$
DECLARE
    grants text[];
    one text;
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
        "shadow_denied" bigint
    )
    STRICT VOLATILE PARALLEL RESTRICTED
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'stats_since_0_5_0_wrapper';
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
        "shadow_denied" bigint
    )
    STRICT VOLATILE PARALLEL RESTRICTED
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'stats_every_database_since_0_5_0_wrapper';
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
    COMMENT ON FUNCTION rate_limiter._stats() IS 'Internal: the rows of rate_limiter.stats.';
    COMMENT ON FUNCTION rate_limiter.stats_every_database() IS
        'The rows of rate_limiter.stats of every database, with its name (superusers and pg_monitor members only).';
    FOREACH one IN ARRAY coalesce(grants, '{}') LOOP
        EXECUTE one;
    END LOOP;
END $$;

-- A named limit can be put in shadow mode (define(..., enforce => false)), and a fixed window
-- of months, a day or a week keeps calendar windows in a time zone (tz).
ALTER TABLE rate_limiter.limits ADD COLUMN enforce boolean NOT NULL DEFAULT true;
ALTER TABLE rate_limiter.limits ADD COLUMN tz text;
COMMENT ON COLUMN rate_limiter.limits.enforce IS 'false puts the limit in shadow mode: a call it would deny is answered ok with reason ''shadow'', taking nothing, and counted in rate_limiter.stats.shadow_denied (a block still denies).';
COMMENT ON COLUMN rate_limiter.limits.tz IS 'Fixed window of whole months, ''1 day'' or ''1 week'': the time zone its calendar windows start in (a name PostgreSQL knows, such as ''Europe/Berlin''); NULL is UTC.';
-- 0.4.0 read a month as 30 days (a year as 365.25) and every day as 24 hours. From 0.5.0 a
-- fixed window of whole months, '1 day' or '1 week' has calendar windows, and other kinds
-- refuse months. The limits defined before keep exactly what they had: a period with months,
-- and a fixed window's with days, is written out as the fixed length 0.4.0 gave it (define
-- one again to have calendar windows), so the update moves no window and admits nothing more.
UPDATE rate_limiter.limits
   SET period = pg_catalog.make_interval(secs => pg_catalog.date_part('epoch', period))
 WHERE pg_catalog.date_part('month', period) OPERATOR(pg_catalog.<>) 0
    OR pg_catalog.date_part('year', period) OPERATOR(pg_catalog.<>) 0
    OR (kind OPERATOR(pg_catalog.=) 'fixed window' AND pg_catalog.date_part('day', period) OPERATOR(pg_catalog.<>) 0);

-- define() takes enforce and tz. A function's arguments cannot change in place: create it
-- again, and give back the EXECUTE grants it had (with their grant option; PUBLIC's too).
DO $$
DECLARE
    grants text[];
    one text;
BEGIN
    SELECT pg_catalog.array_agg(pg_catalog.format('GRANT EXECUTE ON FUNCTION rate_limiter.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, boolean, text) TO %s%s',
               CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
                    ELSE a.grantee::pg_catalog.regrole::pg_catalog.text END,
               CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END))
    INTO grants
    FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
    WHERE p.oid OPERATOR(pg_catalog.=) 'rate_limiter.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean)'::pg_catalog.regprocedure
      AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
      AND a.grantee OPERATOR(pg_catalog.<>) p.proowner;
    DROP FUNCTION rate_limiter.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean);
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
        "hot" bool DEFAULT false,
        "enforce" bool DEFAULT true,
        "tz" TEXT DEFAULT NULL
    ) RETURNS void
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE
    SET search_path TO pg_catalog, pg_temp
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'define_since_0_5_0_wrapper';
    REVOKE ALL ON FUNCTION rate_limiter.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, boolean, text) FROM PUBLIC;
    COMMENT ON FUNCTION rate_limiter.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, boolean, text) IS
        'Create or replace a named limit in rate_limiter.limits.';
    FOREACH one IN ARRAY coalesce(grants, '{}') LOOP
        EXECUTE one;
    END LOOP;
END $$;

-- Concurrency limits (kind 'concurrency'): slots held by transactions are locks; those held
-- past a transaction are leases, in a table of their own.
ALTER TABLE rate_limiter.limits DROP CONSTRAINT limits_kind_check;
ALTER TABLE rate_limiter.limits ADD CONSTRAINT limits_kind_check
    CHECK (kind OPERATOR(pg_catalog.=) ANY (ARRAY['token bucket', 'fixed window', 'sliding window', 'rolling window', 'concurrency']));
COMMENT ON COLUMN rate_limiter.limits.kind IS '''token bucket'' (continuous refill), ''fixed window'' (rate tokens at each window start), ''sliding window'' (the previous window weighs as it slides out), ''rolling window'' (at most rate in any period, counted in cells) or ''concurrency'' (at most rate slots held at once, by transactions or leases; period is how long a denied call is told to wait).';

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

CREATE FUNCTION rate_limiter.acquire(
    name text,
    key text DEFAULT NULL,
    count double precision DEFAULT 1,
    lease interval DEFAULT NULL,
    throws boolean DEFAULT false,
    config jsonb DEFAULT NULL,
    OUT ok boolean,
    OUT retry_after double precision,
    OUT remaining double precision,
    OUT reset_after double precision,
    OUT granted double precision,
    OUT reason text,
    OUT limited_by text,
    OUT lease_id uuid
) RETURNS record
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'acquire_fmgr';

CREATE FUNCTION rate_limiter."release"(
    "name" TEXT,
    "key" TEXT,
    "lease_id" uuid
) RETURNS bool
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'release_wrapper';

CREATE FUNCTION rate_limiter."renew"(
    "name" TEXT,
    "key" TEXT,
    "lease_id" uuid,
    "lease" interval
) RETURNS bool
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'renew_wrapper';

REVOKE ALL ON TABLE rate_limiter.leases FROM PUBLIC;
REVOKE ALL ON FUNCTION rate_limiter.acquire(text, text, double precision, interval, boolean, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION rate_limiter.release(text, text, uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION rate_limiter.renew(text, text, uuid, interval) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter.reset_rate_limit(text, text) IS
    'Forget the state of (name, key), every shard, and a concurrency limit''s leases: it is full again (slots that transactions hold stay theirs).';
COMMENT ON FUNCTION rate_limiter.acquire(text, text, double precision, interval, boolean, jsonb) IS
    'Take count slots of the concurrency limit (name, key): held until the caller''s transaction ends, or with lease until it expires or release(); returns a decision and the lease''s id, or raises RL429 with throws.';
COMMENT ON FUNCTION rate_limiter.release(text, text, uuid) IS
    'End a lease of a concurrency limit in the caller''s transaction; returns whether it still held its slots.';
COMMENT ON FUNCTION rate_limiter.renew(text, text, uuid, interval) IS
    'Move the end of a lease to lease from now in the caller''s transaction; returns false when it had already ended.';
COMMENT ON FUNCTION rate_limiter.prune(integer) IS
    'Delete up to max_rows rows of rate_limiter.state that hold what a fresh state would, or belong to named limits that no longer exist, and blocks, allows and leases that have ended; returns how many. Skips rows in use.';
