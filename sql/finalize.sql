-- The public consuming functions, the cache trigger, privileges and comments, after the
-- Rust functions exist.
--
-- rate_limit, rate_limit_ok and check_rate_limit are C functions of the library written by hand here:
-- they are raw fmgr entry points (src/api.rs) so that throws => true can raise the custom
-- SQLSTATE RL429, which pgrx-generated functions cannot. They are not SECURITY DEFINER: they
-- reach the tables through the access methods, not SQL, so EXECUTE on them is the permission.

CREATE FUNCTION rate_limiter.rate_limit(
    name text,
    key text DEFAULT NULL,
    count double precision DEFAULT 1,
    reserve boolean DEFAULT false,
    throws boolean DEFAULT false,
    config jsonb DEFAULT NULL
) RETURNS rate_limiter.decision
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'rate_limit_fmgr';

-- rate_limit's ok alone, with no decision row to form: for a WHERE clause or a target list.
CREATE FUNCTION rate_limiter.rate_limit_ok(
    name text,
    key text DEFAULT NULL,
    count double precision DEFAULT 1,
    reserve boolean DEFAULT false,
    throws boolean DEFAULT false,
    config jsonb DEFAULT NULL
) RETURNS boolean
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'rate_limit_ok_fmgr';

CREATE FUNCTION rate_limiter.check_rate_limit(
    name text,
    key text DEFAULT NULL,
    count double precision DEFAULT 1,
    reserve boolean DEFAULT false,
    throws boolean DEFAULT false,
    config jsonb DEFAULT NULL
) RETURNS rate_limiter.decision
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'check_rate_limit_fmgr';

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

CREATE FUNCTION rate_limiter.wait_rate_limit(
    name text,
    key text DEFAULT NULL,
    count double precision DEFAULT 1,
    timeout interval DEFAULT '30 seconds',
    config jsonb DEFAULT NULL
) RETURNS rate_limiter.decision
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'wait_rate_limit_fmgr';

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

CREATE FUNCTION rate_limiter.credit(
    name text,
    key text DEFAULT NULL,
    count double precision DEFAULT 1,
    config jsonb DEFAULT NULL
) RETURNS rate_limiter.decision
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'credit_fmgr';

-- Every backend caches named configs (and whether any block, allow or override exists, and
-- the overrides and tiers of the keys it called); these tell them all to forget them at each change,
-- also when a logical replication apply worker or a restore (session_replication_role =
-- replica) makes it. Row-level, because an apply worker fires row triggers only.
CREATE TRIGGER limits_changed
    AFTER INSERT OR UPDATE OR DELETE ON rate_limiter.limits
    FOR EACH ROW EXECUTE FUNCTION rate_limiter._limits_changed();
CREATE TRIGGER limits_truncated
    AFTER TRUNCATE ON rate_limiter.limits
    FOR EACH STATEMENT EXECUTE FUNCTION rate_limiter._limits_changed();
ALTER TABLE rate_limiter.limits ENABLE ALWAYS TRIGGER limits_changed;
ALTER TABLE rate_limiter.limits ENABLE ALWAYS TRIGGER limits_truncated;
CREATE TRIGGER blocks_changed
    AFTER INSERT OR UPDATE OR DELETE ON rate_limiter.blocks
    FOR EACH ROW EXECUTE FUNCTION rate_limiter._limits_changed();
CREATE TRIGGER blocks_truncated
    AFTER TRUNCATE ON rate_limiter.blocks
    FOR EACH STATEMENT EXECUTE FUNCTION rate_limiter._limits_changed();
ALTER TABLE rate_limiter.blocks ENABLE ALWAYS TRIGGER blocks_changed;
ALTER TABLE rate_limiter.blocks ENABLE ALWAYS TRIGGER blocks_truncated;
CREATE TRIGGER allows_changed
    AFTER INSERT OR UPDATE OR DELETE ON rate_limiter.allows
    FOR EACH ROW EXECUTE FUNCTION rate_limiter._limits_changed();
CREATE TRIGGER allows_truncated
    AFTER TRUNCATE ON rate_limiter.allows
    FOR EACH STATEMENT EXECUTE FUNCTION rate_limiter._limits_changed();
ALTER TABLE rate_limiter.allows ENABLE ALWAYS TRIGGER allows_changed;
ALTER TABLE rate_limiter.allows ENABLE ALWAYS TRIGGER allows_truncated;
CREATE TRIGGER overrides_changed
    AFTER INSERT OR UPDATE OR DELETE ON rate_limiter.overrides
    FOR EACH ROW EXECUTE FUNCTION rate_limiter._limits_changed();
CREATE TRIGGER overrides_truncated
    AFTER TRUNCATE ON rate_limiter.overrides
    FOR EACH STATEMENT EXECUTE FUNCTION rate_limiter._limits_changed();
ALTER TABLE rate_limiter.overrides ENABLE ALWAYS TRIGGER overrides_changed;
ALTER TABLE rate_limiter.overrides ENABLE ALWAYS TRIGGER overrides_truncated;
CREATE TRIGGER tiers_changed
    AFTER INSERT OR UPDATE OR DELETE ON rate_limiter.tiers
    FOR EACH ROW EXECUTE FUNCTION rate_limiter._limits_changed();
CREATE TRIGGER tiers_truncated
    AFTER TRUNCATE ON rate_limiter.tiers
    FOR EACH STATEMENT EXECUTE FUNCTION rate_limiter._limits_changed();
ALTER TABLE rate_limiter.tiers ENABLE ALWAYS TRIGGER tiers_changed;
ALTER TABLE rate_limiter.tiers ENABLE ALWAYS TRIGGER tiers_truncated;
-- The trigger runs no SQL; its search_path is pinned anyway, as for every function that may
-- run with more rights than the role whose statement fires it.
ALTER FUNCTION rate_limiter._limits_changed() SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION rate_limiter.rate_limit(text, text, double precision, boolean, boolean, jsonb) IS
    'Take count tokens from (name, key) inside the caller''s transaction; returns a decision, or raises RL429 with throws.';
COMMENT ON FUNCTION rate_limiter.rate_limit_ok(text, text, double precision, boolean, boolean, jsonb) IS
    'rate_limit(...).ok, at less cost: takes as rate_limit does (and raises RL429 with throws), and returns only whether the call is ok.';
COMMENT ON FUNCTION rate_limiter.check_rate_limit(text, text, double precision, boolean, boolean, jsonb) IS
    'The answer rate_limit would give, without writing or locking anything.';
COMMENT ON FUNCTION rate_limiter.rate_limit_all(jsonb, boolean, boolean) IS
    'Take from several limits at once, all or none: requests is a JSON array of {"name", "key", "count", "config"}.';
COMMENT ON FUNCTION rate_limiter.check_rate_limit_all(jsonb, boolean, boolean) IS
    'The answer rate_limit_all would give, without writing or locking anything.';
COMMENT ON FUNCTION rate_limiter.http_headers(text, rate_limiter.decision, jsonb, text, integer, boolean) IS
    'RateLimit-Policy, RateLimit and (when denied) Retry-After headers for a decision of the limit on key (its override''s numbers), as a jsonb object, in draft 11''s syntax (draft => 9: draft 09''s); partition_key adds the key as pk.';
COMMENT ON FUNCTION rate_limiter.http_headers_all(jsonb, rate_limiter.decision, integer, boolean) IS
    'The HTTP headers for a decision of rate_limit_all(requests): one policy per limit.';
COMMENT ON FUNCTION rate_limiter.http_problem(rate_limiter.decision) IS
    'The problem-details body (application/problem+json) of a denial, of type quota-exceeded naming the limit that denied it; NULL when the decision is ok.';
COMMENT ON FUNCTION rate_limiter.block(text, text, timestamptz, text) IS
    'Deny (name, key) until until (NULL name: under every limit), with reason ''blocked''; replaces an earlier block of the pair.';
COMMENT ON FUNCTION rate_limiter.unblock(text, text) IS
    'Lift the block of (name, key); returns whether there was one.';
COMMENT ON FUNCTION rate_limiter.allow(text, text, timestamptz, text) IS
    'Never limit (name, key) until until (NULL name: under every limit): calls are ok with reason ''allowed'', state untouched; a block wins. Replaces an earlier allow of the pair.';
COMMENT ON FUNCTION rate_limiter.disallow(text, text) IS
    'Lift the allow of (name, key); returns whether there was one.';
COMMENT ON FUNCTION rate_limiter.wait_rate_limit(text, text, double precision, interval, jsonb) IS
    'rate_limit, sleeping until retry_after and trying again until granted or timeout would pass (then the denial, with reason ''timeout'' if it waited).';
COMMENT ON FUNCTION rate_limiter.credit(text, text, double precision, jsonb) IS
    'Give count tokens back to (name, key) inside the caller''s transaction, as much as the limit still counts (a token bucket up to capacity); returns the decision after it, granted minus what was given back.';
COMMENT ON FUNCTION rate_limiter.reset_rate_limit(text, text) IS
    'Forget the state of (name, key), every shard, and a concurrency limit''s leases: it is full again (slots that transactions hold stay theirs).';
COMMENT ON FUNCTION rate_limiter.acquire(text, text, double precision, interval, boolean, jsonb) IS
    'Take count slots of the concurrency limit (name, key): held until the caller''s transaction ends, or with lease until it expires or release(); returns a decision and the lease''s id, or raises RL429 with throws.';
COMMENT ON FUNCTION rate_limiter.release(text, text, uuid) IS
    'End a lease of a concurrency limit in the caller''s transaction; returns whether it still held its slots.';
COMMENT ON FUNCTION rate_limiter.renew(text, text, uuid, interval) IS
    'Move the end of a lease to lease from now in the caller''s transaction; returns false when it had already ended.';
COMMENT ON FUNCTION rate_limiter.rate_limit_value(text, text, jsonb, integer) IS
    'The stored value and ts of (name, key) (fullest of sample_shards shards) and the effective config.';
COMMENT ON FUNCTION rate_limiter.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, boolean, text, boolean) IS
    'Create or replace a named limit in rate_limiter.limits.';
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

-- Statistics (shared memory; see src/stats.rs).
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
COMMENT ON COLUMN rate_limiter.stats.shadow_denied IS 'Allowed calls that would have been denied, answered ok in shadow mode (reason ''shadow''): counted in allowed too.';
COMMENT ON COLUMN rate_limiter.stats.memory_in_rows IS 'Calls of a memory limit counted in their key''s row of rate_limiter.state, as a durable limit''s, because shared memory had no room for the key (rate_limiter.memory_keys).';
CREATE VIEW rate_limiter.top_denied AS SELECT * FROM rate_limiter._top_denied();
COMMENT ON VIEW rate_limiter.top_denied IS
    'The most denied keys per limit name, approximately: a space-saving sketch of 64 keys per name. Needs shared_preload_libraries = ''rate_limiter''.';
COMMENT ON COLUMN rate_limiter.top_denied.name IS 'Limit name, as in rate_limiter.stats.';
COMMENT ON COLUMN rate_limiter.top_denied.key IS 'The key (NULL for the global key); keys over 62 bytes are shown cut, ending in …';
COMMENT ON COLUMN rate_limiter.top_denied.denied IS 'Denials counted for the key: at least the true count, at most approximate_error more.';
COMMENT ON COLUMN rate_limiter.top_denied.approximate_error IS 'How many of denied may belong to keys this one replaced in the sketch; 0 means exact.';
COMMENT ON FUNCTION rate_limiter._stats() IS 'Internal: the rows of rate_limiter.stats.';
COMMENT ON FUNCTION rate_limiter._top_denied() IS 'Internal: the rows of rate_limiter.top_denied.';
COMMENT ON FUNCTION rate_limiter.stats_every_database() IS
    'The rows of rate_limiter.stats of every database, with its name (superusers and pg_monitor members only).';
COMMENT ON FUNCTION rate_limiter.top_denied_every_database() IS
    'The rows of rate_limiter.top_denied of every database, with its name (superusers and pg_monitor members only).';
COMMENT ON FUNCTION rate_limiter.stats_reset(text) IS
    'Zero the statistics and top denied keys of one limit name, or of all when NULL; returns how many rows of rate_limiter.stats were reset.';

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

-- Limits on a table's writes (issue 67): limit_writes makes, per event, a statement-level
-- AFTER trigger running _write_limited() with the declaration as its arguments, which charges
-- each statement's rows per key in one all-or-nothing decision (RL429 on a denial). Only the
-- extension's owner may execute _write_limited, so only limit_writes makes such triggers.
CREATE FUNCTION rate_limiter._write_limited() RETURNS trigger
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'write_limited_fmgr';
COMMENT ON FUNCTION rate_limiter._write_limited() IS
    'The trigger of a write limit (limit_writes): charges a statement''s rows per key, all or nothing.';

CREATE FUNCTION rate_limiter.limit_writes(
    "table" regclass,
    limit_name text,
    key text DEFAULT NULL,
    events text[] DEFAULT '{INSERT}',
    count text DEFAULT NULL,
    config jsonb DEFAULT NULL
) RETURNS void
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'limit_writes_fmgr';
COMMENT ON FUNCTION rate_limiter.limit_writes(regclass, text, text, text[], text, jsonb) IS
    'Holds every write of the table (events) to the limit, per key column value, each row counting 1 or its count column: a statement over the limit fails whole with RL429.';

CREATE FUNCTION rate_limiter.unlimit_writes("table" regclass, limit_name text DEFAULT NULL) RETURNS integer
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'unlimit_writes_fmgr';
COMMENT ON FUNCTION rate_limiter.unlimit_writes(regclass, text) IS
    'Drops the table''s write limits (the named limit''s alone, when given); how many triggers it dropped.';

-- The write limits' triggers, their arguments decoded (tgargs holds each NUL-terminated).
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
COMMENT ON COLUMN rate_limiter.write_limits."table" IS 'The table whose writes are limited.';
COMMENT ON COLUMN rate_limiter.write_limits.limit_name IS 'The limit each statement''s rows are charged to.';
COMMENT ON COLUMN rate_limiter.write_limits.key_column IS 'The column whose value (as text) is the key; NULL: one key for the whole table.';
COMMENT ON COLUMN rate_limiter.write_limits.count_column IS 'The column whose value a row counts; NULL: each row counts 1.';
COMMENT ON COLUMN rate_limiter.write_limits.event IS 'INSERT, UPDATE (the new rows charged) or DELETE (the old rows).';
COMMENT ON COLUMN rate_limiter.write_limits.config IS 'The inline config; NULL: the named limit.';
COMMENT ON COLUMN rate_limiter.write_limits.trigger_name IS 'The trigger that charges the rows.';
COMMENT ON COLUMN rate_limiter.write_limits.enabled IS 'Whether the trigger fires in ordinary sessions: false once the table''s owner disabled it, or enabled it for replicas only (ALTER TABLE ... DISABLE TRIGGER, ENABLE REPLICA TRIGGER).';

-- Nothing is open to PUBLIC: grant USAGE on the schema and EXECUTE on the functions a role
-- needs (see the README). The tables stay private; the functions are the only way in.
REVOKE ALL ON ALL TABLES IN SCHEMA rate_limiter FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA rate_limiter FROM PUBLIC;

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
