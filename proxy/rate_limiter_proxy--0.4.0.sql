-- rate_limiter_proxy 0.4.0: rate_limiter's calls from a PL/Proxy router database, each run
-- on the partition database that holds its state.
--
-- The partitions are a PL/Proxy cluster named rate_limiter: a plproxy foreign server whose
-- options p0 .. pN-1 (N a power of two) are the partitions' connection strings, each a
-- database with the rate_limiter extension. A call for a key goes where PL/Proxy sends
-- hashtext(key) (the name's hash when the key is NULL), as the application's own PL/Proxy
-- functions route by that key. A limit with shards > 1 is spread: every partition holds
-- shards/N of its shards with their share of rate and capacity, and a call goes to a random
-- partition. Config changes run on every partition.
--
-- Security.
-- * The functions are SECURITY INVOKER: PL/Proxy connects to the partitions as the user
--   mapping of the caller says, and the router checks the caller's own privileges. So a
--   caller needs EXECUTE on the helpers (names starting with _) that a function it calls
--   uses, as well as on that function.
-- * Nothing is granted to PUBLIC, and this script grants nothing to anyone: the
--   administrator grants EXECUTE (GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA
--   rate_limiter_proxy TO ...). EXECUTE is not what allows changing the partitions. The
--   functions that run on every partition need a privilege on the router's table
--   rate_limiter_proxy.limits (see _gate). The public function checks it before any
--   partition is touched, and so does its hop (_define_everywhere, ...) when called directly.
--   So holding EXECUTE on a helper allows nothing more.
-- * Every function pins search_path = pg_catalog, pg_temp, and its body names every table,
--   type, function and operator with its schema. An object that a database owner plants in
--   public, or a search_path set for the database or role, never runs inside a call, even
--   when a superuser makes it.
-- * A partition's error is raised again from the fixed prefix PL/Proxy puts before it
--   (matched at the start only) and its SQLSTATE. The partition's own text, which may quote
--   a name or key, is never searched for markers.

\echo Use "CREATE EXTENSION rate_limiter_proxy" to load this file. \quit

-- A schema that exists already and belongs to another role (one created before
-- CREATE EXTENSION) is that role's: it could drop or replace the router's functions, which
-- superusers call.
DO $$
DECLARE
    schema_owner pg_catalog.oid := (SELECT n.nspowner FROM pg_catalog.pg_namespace n
                                    WHERE n.nspname OPERATOR(pg_catalog.=) 'rate_limiter_proxy');
    extension_owner pg_catalog.oid := (SELECT e.extowner FROM pg_catalog.pg_extension e
                                       WHERE e.extname OPERATOR(pg_catalog.=) 'rate_limiter_proxy');
BEGIN
    IF schema_owner OPERATOR(pg_catalog.<>) extension_owner
       AND NOT (SELECT r.rolsuper FROM pg_catalog.pg_authid r WHERE r.oid OPERATOR(pg_catalog.=) schema_owner) THEN
        RAISE EXCEPTION 'schema rate_limiter_proxy is owned by role %, which is not installing the extension',
            schema_owner::pg_catalog.regrole
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Drop the schema or make the installing role its owner (ALTER SCHEMA rate_limiter_proxy OWNER TO ...), then CREATE EXTENSION rate_limiter_proxy again.';
    END IF;
END
$$;

CREATE TYPE rate_limiter_proxy.decision AS (
    ok boolean,
    retry_after double precision,
    remaining double precision,
    reset_after double precision,
    granted double precision,
    reason text,
    limited_by text
);
COMMENT ON TYPE rate_limiter_proxy.decision IS
    'The answer of a partition''s rate_limiter, column for column as rate_limiter.decision.';

-- The router's record of the named limits it defined: their fleet-wide definition, which
-- routing reads (a spread limit goes to a random partition) and redefine_all() pushes again.
CREATE TABLE rate_limiter_proxy.limits (
    name text PRIMARY KEY,
    kind text NOT NULL,
    rate double precision NOT NULL,
    period interval NOT NULL,
    capacity double precision,
    max_reserved double precision,
    shards integer NOT NULL DEFAULT 1 CHECK (shards OPERATOR(pg_catalog.>=) 1),
    start timestamptz,
    min_gap interval,
    mode text NOT NULL DEFAULT 'all',
    buckets integer,
    lock_timeout interval,
    on_lock_timeout text NOT NULL DEFAULT 'deny',
    deny_cache interval,
    partitions integer NOT NULL CHECK (partitions OPERATOR(pg_catalog.>=) 1),
    defined_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
SELECT pg_catalog.pg_extension_config_dump('rate_limiter_proxy.limits', '');
COMMENT ON TABLE rate_limiter_proxy.limits IS
    'Named limits as defined through the router: the whole limit, before it is shared out. Written by rate_limiter_proxy.define(); each partition''s rate_limiter.limits holds its share.';
COMMENT ON COLUMN rate_limiter_proxy.limits.name IS 'Limit name, as in rate_limiter.limits.';
COMMENT ON COLUMN rate_limiter_proxy.limits.kind IS 'token bucket, fixed window, sliding window or rolling window.';
COMMENT ON COLUMN rate_limiter_proxy.limits.rate IS 'Tokens per period over the whole fleet.';
COMMENT ON COLUMN rate_limiter_proxy.limits.period IS 'The period of rate.';
COMMENT ON COLUMN rate_limiter_proxy.limits.capacity IS 'Bucket size over the whole fleet; NULL means rate.';
COMMENT ON COLUMN rate_limiter_proxy.limits.max_reserved IS 'Most tokens reservations may owe over the whole fleet; NULL means none.';
COMMENT ON COLUMN rate_limiter_proxy.limits.shards IS 'Shards over the whole fleet; above 1 the limit is spread, shards/partitions on each partition.';
COMMENT ON COLUMN rate_limiter_proxy.limits.start IS 'Window phase, as in rate_limiter.limits.';
COMMENT ON COLUMN rate_limiter_proxy.limits.min_gap IS 'Minimum time between allowed calls of one key, as in rate_limiter.limits.';
COMMENT ON COLUMN rate_limiter_proxy.limits.mode IS 'all, partial or penalize, as in rate_limiter.limits.';
COMMENT ON COLUMN rate_limiter_proxy.limits.buckets IS 'Buckets of a rolling window, as in rate_limiter.limits.';
COMMENT ON COLUMN rate_limiter_proxy.limits.lock_timeout IS 'Longest wait for the row lock, as in rate_limiter.limits.';
COMMENT ON COLUMN rate_limiter_proxy.limits.on_lock_timeout IS 'deny or allow when lock_timeout passes, as in rate_limiter.limits.';
COMMENT ON COLUMN rate_limiter_proxy.limits.deny_cache IS 'How long a denial may be answered from shared memory, as in rate_limiter.limits.';
COMMENT ON COLUMN rate_limiter_proxy.limits.partitions IS 'How many partitions the cluster had when the limit was defined; after a change run redefine_all().';
COMMENT ON COLUMN rate_limiter_proxy.limits.defined_at IS 'When define() last reached every partition.';

-- Where a call goes: hash is given to PL/Proxy's RUN ON, share is the inline config to send,
-- spread the number of partitions a spread limit is shared over (1 for other limits).
CREATE TYPE rate_limiter_proxy.route_target AS (hash integer, share jsonb, spread integer);
COMMENT ON TYPE rate_limiter_proxy.route_target IS
    'Where the router sends a call: the hash for PL/Proxy''s RUN ON, the inline config to send, and over how many partitions the limit is spread.';

-- The functions. rate_limiter_proxy--0.3.0--0.4.0.sql has this part too, word for word but
-- with CREATE OR REPLACE for the functions 0.3.0 had.

-- The privileges on the router that allow the functions that run on every partition. The
-- caller's own (the functions are SECURITY INVOKER), on the router's table:
--   define                             INSERT and UPDATE on rate_limiter_proxy.limits, which it writes
--   redefine_all                       SELECT, INSERT and UPDATE on rate_limiter_proxy.limits
--   block, unblock, allow, disallow,
--   reset_rate_limit                   UPDATE on rate_limiter_proxy.limits: they change how
--                                      the recorded limits apply, for every caller
-- Every other function changes nothing but what a call takes on a partition (routing a named
-- limit reads rate_limiter_proxy.limits, so it needs SELECT there). Each function above
-- checks first, and its hop checks again as PL/Proxy's CLUSTER function. Both checks come
-- before any connection to a partition, so a direct call of the hop is refused too. Returns
-- the cluster's name, or raises 42501 with the GRANT that is missing.
CREATE FUNCTION rate_limiter_proxy._gate(action text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    needed pg_catalog.text[];
    missing pg_catalog.text[] := '{}';
    privilege pg_catalog.text;
BEGIN
    IF action OPERATOR(pg_catalog.=) 'define' THEN
        needed := ARRAY['INSERT', 'UPDATE'];
    ELSIF action OPERATOR(pg_catalog.=) 'redefine_all' THEN
        needed := ARRAY['SELECT', 'INSERT', 'UPDATE'];
    ELSIF action OPERATOR(pg_catalog.=) ANY (ARRAY['block', 'unblock', 'allow', 'disallow', 'reset_rate_limit']) THEN
        needed := ARRAY['UPDATE'];
    ELSE
        RAISE EXCEPTION 'rate_limiter_proxy has no action "%"', action USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOREACH privilege IN ARRAY needed LOOP
        -- One at a time: given a list, has_table_privilege says whether any one is held.
        IF NOT pg_catalog.has_table_privilege('rate_limiter_proxy.limits'::pg_catalog.regclass, privilege) THEN
            missing := pg_catalog.array_append(missing, privilege);
        END IF;
    END LOOP;
    IF pg_catalog.cardinality(missing) OPERATOR(pg_catalog.>) 0 THEN
        RAISE EXCEPTION 'permission denied for rate_limiter_proxy.%', action
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = pg_catalog.format('rate_limiter_proxy.%s runs on every partition: the router allows it to roles with %s on rate_limiter_proxy.limits. Nothing was sent to a partition.',
                      action, pg_catalog.array_to_string(needed, ', ')),
                  HINT = pg_catalog.format('GRANT %s ON rate_limiter_proxy.limits TO %I;',
                      pg_catalog.array_to_string(missing, ', '), current_user);
    END IF;
    RETURN 'rate_limiter';
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._gate(text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy._gate(text) IS
    'Whether the caller may run a function that changes every partition (define, redefine_all, block, unblock, allow, disallow, reset_rate_limit): the PL/Proxy cluster''s name, or 42501 naming the GRANT on rate_limiter_proxy.limits that is missing.';

-- How many partitions the cluster rate_limiter has.
CREATE FUNCTION rate_limiter_proxy.partitions() RETURNS integer
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
BEGIN
    SELECT pg_catalog.count(*) INTO n
      FROM pg_catalog.pg_foreign_server s
      JOIN pg_catalog.pg_foreign_data_wrapper w ON w.oid OPERATOR(pg_catalog.=) s.srvfdw,
           pg_catalog.unnest(s.srvoptions) AS option
     WHERE s.srvname OPERATOR(pg_catalog.=) 'rate_limiter'
       AND w.fdwname OPERATOR(pg_catalog.=) 'plproxy'
       AND option OPERATOR(pg_catalog.~) '^p[0-9]+=';
    IF n OPERATOR(pg_catalog.=) 0 THEN
        RAISE EXCEPTION 'there is no PL/Proxy cluster "rate_limiter"'
            USING ERRCODE = 'undefined_object',
                  DETAIL = 'rate_limiter_proxy sends each call to a partition of the foreign server rate_limiter.',
                  HINT = 'CREATE SERVER rate_limiter FOREIGN DATA WRAPPER plproxy OPTIONS (p0 ''host=... dbname=...'', p1 ''...''); CREATE USER MAPPING FOR PUBLIC SERVER rate_limiter;';
    END IF;
    RETURN n;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.partitions() FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.partitions() IS
    'The number of partitions (options p0, p1, ...) of the PL/Proxy cluster rate_limiter.';

CREATE FUNCTION rate_limiter_proxy.partition_of(key text) RETURNS integer
LANGUAGE sql STABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_catalog.hashtext(key) OPERATOR(pg_catalog.&) (rate_limiter_proxy.partitions() OPERATOR(pg_catalog.-) 1)
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.partition_of(text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.partition_of(text) IS
    'The partition (0 for p0, ...) that holds the state of a key''s unsharded limits: where PL/Proxy sends hashtext(key).';

-- How many of a spread limit's shards each partition holds.
CREATE FUNCTION rate_limiter_proxy._shards_per_partition(shards integer, partitions integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF shards OPERATOR(pg_catalog.%) partitions OPERATOR(pg_catalog.<>) 0 THEN
        RAISE EXCEPTION 'a limit of % shards cannot be shared evenly over % partitions', shards, partitions
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'Through the router each partition holds shards/partitions of the shards, with that share of rate, capacity and max_reserved.',
                  HINT = pg_catalog.format('Use a multiple of %s shards, or 1 to keep the limit on the partition of its key.', partitions);
    END IF;
    RETURN shards OPERATOR(pg_catalog./) partitions;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._shards_per_partition(integer, integer) FROM PUBLIC;

-- A partition's effective config of a spread limit, as the whole limit.
CREATE FUNCTION rate_limiter_proxy._whole(config jsonb, partitions integer) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    whole pg_catalog.jsonb := config;
    field pg_catalog.text;
BEGIN
    FOREACH field IN ARRAY ARRAY['rate', 'capacity', 'maxReserved', 'shards'] LOOP
        IF pg_catalog.jsonb_typeof(config OPERATOR(pg_catalog.->) field) OPERATOR(pg_catalog.=) 'number' THEN
            whole := whole OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object(field,
                (config OPERATOR(pg_catalog.->>) field)::double precision OPERATOR(pg_catalog.*) partitions::double precision);
        END IF;
    END LOOP;
    RETURN whole OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object('shards',
        (config OPERATOR(pg_catalog.->>) 'shards')::integer OPERATOR(pg_catalog.*) partitions);
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._whole(jsonb, integer) FROM PUBLIC;

-- An inline config's share on each of the partitions a spread limit is shared over.
CREATE FUNCTION rate_limiter_proxy._share(config jsonb, shards integer, partitions integer) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    share pg_catalog.jsonb := config OPERATOR(pg_catalog.||)
        pg_catalog.jsonb_build_object('shards', rate_limiter_proxy._shards_per_partition(shards, partitions));
    field pg_catalog.text;
BEGIN
    FOREACH field IN ARRAY ARRAY['rate', 'capacity', 'maxReserved', 'max_reserved'] LOOP
        IF pg_catalog.jsonb_typeof(config OPERATOR(pg_catalog.->) field) OPERATOR(pg_catalog.=) 'number' THEN
            -- partitions is a power of two: the division is exact.
            share := share OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object(field,
                (config OPERATOR(pg_catalog.->>) field)::double precision OPERATOR(pg_catalog./) partitions::double precision);
        END IF;
    END LOOP;
    RETURN share;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._share(jsonb, integer, integer) FROM PUBLIC;

CREATE FUNCTION rate_limiter_proxy._route(name text, key text, config jsonb)
RETURNS rate_limiter_proxy.route_target LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    shards integer := 1;
    target rate_limiter_proxy.route_target;
BEGIN
    target.share := config;
    IF config IS NULL THEN
        SELECT l.shards, l.partitions INTO shards, target.spread
          FROM rate_limiter_proxy.limits l WHERE l.name OPERATOR(pg_catalog.=) _route.name;
        IF shards OPERATOR(pg_catalog.>) 1 AND target.spread OPERATOR(pg_catalog.<>) rate_limiter_proxy.partitions() THEN
            -- The partitions hold shares of 1/spread: routed over another count they would
            -- not add up to the limit (copies of a partition would admit twice).
            RAISE EXCEPTION 'spread limit "%" is shared over % partitions, and the PL/Proxy cluster "rate_limiter" has %',
                    name, target.spread, rate_limiter_proxy.partitions()
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'Each partition holds its share of the limit as define() gave it out over the partitions of that time.',
                      HINT = 'After changing the partitions of SERVER rate_limiter, run SELECT rate_limiter_proxy.redefine_all(); to share every limit out again.';
        END IF;
    ELSIF (config OPERATOR(pg_catalog.->>) 'shards') OPERATOR(pg_catalog.~) '^[0-9]{1,4}$' THEN
        -- Anything else is left for the partition to refuse in its own words.
        shards := (config OPERATOR(pg_catalog.->>) 'shards')::integer;
    END IF;
    IF coalesce(shards, 1) OPERATOR(pg_catalog.<=) 1 THEN
        target.hash := pg_catalog.hashtext(coalesce(key, name));
        target.spread := 1;
        RETURN target;
    END IF;
    target.hash := (pg_catalog.random() OPERATOR(pg_catalog.*) 2147483647::double precision)::integer;
    IF config IS NOT NULL THEN
        target.spread := rate_limiter_proxy.partitions();
        target.share := rate_limiter_proxy._share(config, shards, target.spread);
    END IF;
    RETURN target;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._route(text, text, jsonb) FROM PUBLIC;

-- rate_limit_all's requests and their one partition: limits of one key (or spread limits,
-- which every partition holds a share of) can be taken all or nothing; limits whose state
-- is on different partitions cannot, since each partition commits on its own.
CREATE FUNCTION rate_limiter_proxy._route_all(requests jsonb)
RETURNS rate_limiter_proxy.route_target LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    request pg_catalog.jsonb;
    r rate_limiter_proxy.route_target;
    partitions integer;
    owner pg_catalog.text;
    hash integer;
    share pg_catalog.jsonb;
BEGIN
    IF coalesce(pg_catalog.jsonb_typeof(requests) OPERATOR(pg_catalog.<>) 'array', true) THEN
        -- Malformed: the partition says how.
        RETURN ROW(0, requests, 1);
    END IF;
    partitions := rate_limiter_proxy.partitions();
    share := '[]';
    FOR request IN SELECT e.value FROM pg_catalog.jsonb_array_elements(requests) AS e LOOP
        IF pg_catalog.jsonb_typeof(request) OPERATOR(pg_catalog.=) 'object' THEN
            r := rate_limiter_proxy._route(request OPERATOR(pg_catalog.->>) 'name', request OPERATOR(pg_catalog.->>) 'key',
                CASE WHEN (request OPERATOR(pg_catalog.->) 'config') OPERATOR(pg_catalog.=) 'null'::pg_catalog.jsonb THEN NULL
                     ELSE request OPERATOR(pg_catalog.->) 'config' END);
            IF r.spread OPERATOR(pg_catalog.>) 1 AND request OPERATOR(pg_catalog.?) 'config' THEN
                request := request OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object('config', r.share);
            ELSIF r.spread OPERATOR(pg_catalog.=) 1 THEN
                IF hash IS NOT NULL AND (hash OPERATOR(pg_catalog.&) (partitions OPERATOR(pg_catalog.-) 1))
                        OPERATOR(pg_catalog.<>) (r.hash OPERATOR(pg_catalog.&) (partitions OPERATOR(pg_catalog.-) 1)) THEN
                    RAISE EXCEPTION 'rate_limit_all through the router takes limits whose state is on one partition'
                        USING ERRCODE = 'feature_not_supported',
                              DETAIL = pg_catalog.format('%s is on partition %s, %s on partition %s; each partition commits on its own, so they cannot be taken all or nothing.',
                                  owner, hash OPERATOR(pg_catalog.&) (partitions OPERATOR(pg_catalog.-) 1),
                                  pg_catalog.format('(%s, %s)', request OPERATOR(pg_catalog.->>) 'name',
                                      coalesce(request OPERATOR(pg_catalog.->>) 'key', 'NULL')),
                                  r.hash OPERATOR(pg_catalog.&) (partitions OPERATOR(pg_catalog.-) 1)),
                              HINT = 'Give the limits one key (such as the tenant), use spread limits (shards > 1), or call rate_limiter.rate_limit_all on the partition from an application function routed there by its key.';
                END IF;
                hash := r.hash;
                owner := pg_catalog.format('(%s, %s)', request OPERATOR(pg_catalog.->>) 'name',
                    coalesce(request OPERATOR(pg_catalog.->>) 'key', 'NULL'));
            END IF;
        END IF;
        share := share OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_array(request);
    END LOOP;
    -- Only spread limits: any partition holds all of them.
    RETURN ROW(coalesce(hash, (pg_catalog.random() OPERATOR(pg_catalog.*) 2147483647::double precision)::integer), share, 1);
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._route_all(jsonb) FROM PUBLIC;

-- Raises again an error of a call through PL/Proxy, or returns if it is not one.
-- A partition's error keeps its SQLSTATE, message, detail and hint as the partition raised
-- them, without PL/Proxy's prefixes, so that RL429 reads as without the router. PL/Proxy's
-- failure to reach a partition becomes 08001, and losing it during the call 08006.
--
-- Only PL/Proxy's fixed prefixes are matched, and only at the start of the message: what
-- follows them is the partition's text (or libpq's), which may quote a limit's name or key
-- and is never searched. A partition's error reads
--   <hop>(<argument count>): [<partition's dbname>] REMOTE <severity>: <the partition's message>
-- with the partition's SQLSTATE, DETAIL "Remote detail: ..." and HINT "Remote hint: ...";
-- PL/Proxy's own failures read "PL/Proxy function <hop>(<argument count>): <what failed>".
CREATE FUNCTION rate_limiter_proxy._raise_again(code text, msg text, det text, hnt text, hash integer)
RETURNS void LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    remote constant pg_catalog.text := '^rate_limiter_proxy\._[a-z_]+\([0-9]+\): \[[^]]*\] REMOTE ([^:]*): ';
    own constant pg_catalog.text := '^PL/Proxy function rate_limiter_proxy\._[a-z_]+\([0-9]+\): ';
    -- The partition's severity, from the prefix; NULL when the error is not a partition's.
    severity constant pg_catalog.text := (pg_catalog.regexp_match(msg, remote))[1];
    which pg_catalog.text := 'a partition';
BEGIN
    IF hash IS NOT NULL THEN
        which := pg_catalog.format('partition %s', hash OPERATOR(pg_catalog.&) (rate_limiter_proxy.partitions() OPERATOR(pg_catalog.-) 1));
    END IF;
    IF severity IS NOT NULL THEN
        IF severity OPERATOR(pg_catalog.=) ANY (ARRAY['FATAL', 'PANIC'])
           OR pg_catalog.left(code, 4) OPERATOR(pg_catalog.=) '57P0'
           OR (code OPERATOR(pg_catalog.=) 'XX000' AND severity OPERATOR(pg_catalog.=) '(null)') THEN
            -- The partition's backend went away under the call: a FATAL (such as 57P01 when
            -- it shuts down; the SQLSTATE says so when the severity is in another language),
            -- or a result libpq made up for a broken connection, without SQLSTATE or severity.
            RAISE EXCEPTION 'lost % of PL/Proxy cluster "rate_limiter" during the call', which
                USING ERRCODE = 'connection_failure', DETAIL = msg,
                      HINT = 'The partition may or may not have counted the call: treat it as denied and try again later.';
        END IF;
        msg := pg_catalog.regexp_replace(msg, remote, '');
        det := CASE WHEN det OPERATOR(pg_catalog.=) '' THEN NULL ELSE pg_catalog.regexp_replace(det, '^Remote detail: ', '') END;
        hnt := CASE WHEN hnt OPERATOR(pg_catalog.=) '' THEN NULL ELSE pg_catalog.regexp_replace(hnt, '^Remote hint: ', '') END;
        -- RAISE refuses NULL options.
        IF det IS NULL AND hnt IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = code, MESSAGE = msg;
        ELSIF hnt IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = code, MESSAGE = msg, DETAIL = det;
        ELSIF det IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = code, MESSAGE = msg, HINT = hnt;
        END IF;
        RAISE EXCEPTION USING ERRCODE = code, MESSAGE = msg, DETAIL = det, HINT = hnt;
    ELSIF msg OPERATOR(pg_catalog.~) (own OPERATOR(pg_catalog.||) '(\[[^]]*\] PQconnect(Start|Poll): |connect timeout to: )') THEN
        RAISE EXCEPTION '% of PL/Proxy cluster "rate_limiter" is unreachable', which
            USING ERRCODE = 'sqlclient_unable_to_establish_sqlconnection', DETAIL = msg,
                  HINT = 'Nothing was counted there. Calls for keys on other partitions go on; start the partition or fix its connection string in SERVER rate_limiter.';
    ELSIF msg OPERATOR(pg_catalog.~) (own OPERATOR(pg_catalog.||) '(\[[^]]*\] PQ[A-Za-z]+: |query timeout$)') THEN
        RAISE EXCEPTION 'lost % of PL/Proxy cluster "rate_limiter" during the call', which
            USING ERRCODE = 'connection_failure', DETAIL = msg,
                  HINT = 'The partition may or may not have counted the call: treat it as denied and try again later.';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._raise_again(text, text, text, text, integer) FROM PUBLIC;

-- The hops: each runs one statement on one partition (or all), in a transaction of its own
-- there. PL/Proxy sends the statement as it is written here; on the partition it names
-- rate_limiter's functions with their schema. Those that run on every partition name
-- _gate as their CLUSTER.

CREATE FUNCTION rate_limiter_proxy._rate_limit(hash integer, name text, key text, count double precision, reserve boolean, throws boolean, config jsonb)
RETURNS rate_limiter_proxy.decision LANGUAGE plproxy SET search_path = pg_catalog, pg_temp AS $$
    CLUSTER 'rate_limiter';
    RUN ON hash;
    SELECT * FROM rate_limiter.rate_limit(name, key, count, reserve, throws, config);
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._rate_limit(integer, text, text, double precision, boolean, boolean, jsonb) FROM PUBLIC;

CREATE FUNCTION rate_limiter_proxy._check_rate_limit(hash integer, name text, key text, count double precision, reserve boolean, throws boolean, config jsonb)
RETURNS rate_limiter_proxy.decision LANGUAGE plproxy SET search_path = pg_catalog, pg_temp AS $$
    CLUSTER 'rate_limiter';
    RUN ON hash;
    SELECT * FROM rate_limiter.check_rate_limit(name, key, count, reserve, throws, config);
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._check_rate_limit(integer, text, text, double precision, boolean, boolean, jsonb) FROM PUBLIC;

CREATE FUNCTION rate_limiter_proxy._wait_rate_limit(hash integer, name text, key text, count double precision, timeout interval, config jsonb)
RETURNS rate_limiter_proxy.decision LANGUAGE plproxy SET search_path = pg_catalog, pg_temp AS $$
    CLUSTER 'rate_limiter';
    RUN ON hash;
    SELECT * FROM rate_limiter.wait_rate_limit(name, key, count, timeout, config);
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._wait_rate_limit(integer, text, text, double precision, interval, jsonb) FROM PUBLIC;

CREATE FUNCTION rate_limiter_proxy._rate_limit_all(hash integer, requests jsonb, reserve boolean, throws boolean)
RETURNS rate_limiter_proxy.decision LANGUAGE plproxy SET search_path = pg_catalog, pg_temp AS $$
    CLUSTER 'rate_limiter';
    RUN ON hash;
    SELECT * FROM rate_limiter.rate_limit_all(requests, reserve, throws);
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._rate_limit_all(integer, jsonb, boolean, boolean) FROM PUBLIC;

CREATE FUNCTION rate_limiter_proxy._check_rate_limit_all(hash integer, requests jsonb, reserve boolean, throws boolean)
RETURNS rate_limiter_proxy.decision LANGUAGE plproxy SET search_path = pg_catalog, pg_temp AS $$
    CLUSTER 'rate_limiter';
    RUN ON hash;
    SELECT * FROM rate_limiter.check_rate_limit_all(requests, reserve, throws);
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._check_rate_limit_all(integer, jsonb, boolean, boolean) FROM PUBLIC;

CREATE FUNCTION rate_limiter_proxy._rate_limit_value(hash integer, name text, key text, config jsonb, sample_shards integer,
    OUT value double precision, OUT ts timestamptz, OUT shard integer, OUT effective_config jsonb)
RETURNS SETOF record LANGUAGE plproxy SET search_path = pg_catalog, pg_temp AS $$
    CLUSTER 'rate_limiter';
    RUN ON hash;
    SELECT * FROM rate_limiter.rate_limit_value(name, key, config, sample_shards);
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._rate_limit_value(integer, text, text, jsonb, integer) FROM PUBLIC;

CREATE FUNCTION rate_limiter_proxy._reset_everywhere(name text, key text)
RETURNS SETOF integer LANGUAGE plproxy SET search_path = pg_catalog, pg_temp AS $$
    CLUSTER rate_limiter_proxy._gate('reset_rate_limit');
    RUN ON ALL;
    SELECT 1 FROM rate_limiter.reset_rate_limit(name, key);
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._reset_everywhere(text, text) FROM PUBLIC;

CREATE FUNCTION rate_limiter_proxy._define_everywhere(name text, kind text, rate double precision, period interval,
    capacity double precision, max_reserved double precision, shards integer, start timestamptz, min_gap interval,
    mode text, buckets integer, lock_timeout interval, on_lock_timeout text, deny_cache interval)
RETURNS SETOF integer LANGUAGE plproxy SET search_path = pg_catalog, pg_temp AS $$
    CLUSTER rate_limiter_proxy._gate('define');
    RUN ON ALL;
    SELECT 1 FROM rate_limiter.define(name, kind, rate, period, capacity, max_reserved, shards, start, min_gap,
                                      mode, buckets, lock_timeout, on_lock_timeout, deny_cache);
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._define_everywhere(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval) FROM PUBLIC;

CREATE FUNCTION rate_limiter_proxy._block_everywhere(name text, key text, until timestamptz, note text)
RETURNS SETOF integer LANGUAGE plproxy SET search_path = pg_catalog, pg_temp AS $$
    CLUSTER rate_limiter_proxy._gate('block');
    RUN ON ALL;
    SELECT 1 FROM rate_limiter.block(name, key, until, note);
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._block_everywhere(text, text, timestamptz, text) FROM PUBLIC;

CREATE FUNCTION rate_limiter_proxy._unblock_everywhere(name text, key text)
RETURNS SETOF boolean LANGUAGE plproxy SET search_path = pg_catalog, pg_temp AS $$
    CLUSTER rate_limiter_proxy._gate('unblock');
    RUN ON ALL;
    SELECT rate_limiter.unblock(name, key);
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._unblock_everywhere(text, text) FROM PUBLIC;

-- The SQL surface: rate_limiter's functions with its signatures and results. Each routes
-- the call, makes the hop, and raises a partition's error again as the partition raised it.

CREATE FUNCTION rate_limiter_proxy.rate_limit(
    name text,
    key text DEFAULT NULL,
    count double precision DEFAULT 1,
    reserve boolean DEFAULT false,
    throws boolean DEFAULT false,
    config jsonb DEFAULT NULL
) RETURNS rate_limiter_proxy.decision
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    target rate_limiter_proxy.route_target;
    d rate_limiter_proxy.decision;
    code pg_catalog.text; msg pg_catalog.text; det pg_catalog.text; hnt pg_catalog.text;
BEGIN
    target := rate_limiter_proxy._route(name, key, config);
    d := rate_limiter_proxy._rate_limit(target.hash, name, key, count, reserve, throws, target.share);
    -- A partition estimates remaining over its own shards.
    d.remaining := d.remaining OPERATOR(pg_catalog.*) target.spread::double precision;
    RETURN d;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    PERFORM rate_limiter_proxy._raise_again(code, msg, det, hnt, target.hash);
    RAISE;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.rate_limit(text, text, double precision, boolean, boolean, jsonb) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.rate_limit(text, text, double precision, boolean, boolean, jsonb) IS
    'rate_limiter.rate_limit on the partition of the key (a random one for a spread limit), in a transaction of its own there.';

CREATE FUNCTION rate_limiter_proxy.check_rate_limit(
    name text,
    key text DEFAULT NULL,
    count double precision DEFAULT 1,
    reserve boolean DEFAULT false,
    throws boolean DEFAULT false,
    config jsonb DEFAULT NULL
) RETURNS rate_limiter_proxy.decision
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    target rate_limiter_proxy.route_target;
    d rate_limiter_proxy.decision;
    code pg_catalog.text; msg pg_catalog.text; det pg_catalog.text; hnt pg_catalog.text;
BEGIN
    target := rate_limiter_proxy._route(name, key, config);
    d := rate_limiter_proxy._check_rate_limit(target.hash, name, key, count, reserve, throws, target.share);
    d.remaining := d.remaining OPERATOR(pg_catalog.*) target.spread::double precision;
    RETURN d;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    PERFORM rate_limiter_proxy._raise_again(code, msg, det, hnt, target.hash);
    RAISE;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.check_rate_limit(text, text, double precision, boolean, boolean, jsonb) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.check_rate_limit(text, text, double precision, boolean, boolean, jsonb) IS
    'rate_limiter.check_rate_limit on the partition rate_limit would use.';

CREATE FUNCTION rate_limiter_proxy.wait_rate_limit(
    name text,
    key text DEFAULT NULL,
    count double precision DEFAULT 1,
    timeout interval DEFAULT '30 seconds',
    config jsonb DEFAULT NULL
) RETURNS rate_limiter_proxy.decision
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    target rate_limiter_proxy.route_target;
    d rate_limiter_proxy.decision;
    code pg_catalog.text; msg pg_catalog.text; det pg_catalog.text; hnt pg_catalog.text;
BEGIN
    target := rate_limiter_proxy._route(name, key, config);
    d := rate_limiter_proxy._wait_rate_limit(target.hash, name, key, count, timeout, target.share);
    d.remaining := d.remaining OPERATOR(pg_catalog.*) target.spread::double precision;
    RETURN d;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    PERFORM rate_limiter_proxy._raise_again(code, msg, det, hnt, target.hash);
    RAISE;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.wait_rate_limit(text, text, double precision, interval, jsonb) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.wait_rate_limit(text, text, double precision, interval, jsonb) IS
    'rate_limiter.wait_rate_limit on the partition rate_limit would use; it holds a connection to that partition while it waits.';

CREATE FUNCTION rate_limiter_proxy.rate_limit_all(
    requests jsonb,
    reserve boolean DEFAULT false,
    throws boolean DEFAULT false
) RETURNS rate_limiter_proxy.decision
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    target rate_limiter_proxy.route_target;
    code pg_catalog.text; msg pg_catalog.text; det pg_catalog.text; hnt pg_catalog.text;
BEGIN
    target := rate_limiter_proxy._route_all(requests);
    RETURN rate_limiter_proxy._rate_limit_all(target.hash, target.share, reserve, throws);
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    PERFORM rate_limiter_proxy._raise_again(code, msg, det, hnt, target.hash);
    RAISE;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.rate_limit_all(jsonb, boolean, boolean) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.rate_limit_all(jsonb, boolean, boolean) IS
    'rate_limiter.rate_limit_all on the one partition that holds every limit named (their keys'' partition; any for spread limits); 0A000 if they are on different partitions.';

CREATE FUNCTION rate_limiter_proxy.check_rate_limit_all(
    requests jsonb,
    reserve boolean DEFAULT false,
    throws boolean DEFAULT false
) RETURNS rate_limiter_proxy.decision
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    target rate_limiter_proxy.route_target;
    code pg_catalog.text; msg pg_catalog.text; det pg_catalog.text; hnt pg_catalog.text;
BEGIN
    target := rate_limiter_proxy._route_all(requests);
    RETURN rate_limiter_proxy._check_rate_limit_all(target.hash, target.share, reserve, throws);
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    PERFORM rate_limiter_proxy._raise_again(code, msg, det, hnt, target.hash);
    RAISE;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.check_rate_limit_all(jsonb, boolean, boolean) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.check_rate_limit_all(jsonb, boolean, boolean) IS
    'rate_limiter.check_rate_limit_all on the partition rate_limit_all would use.';

CREATE FUNCTION rate_limiter_proxy.rate_limit_value(
    name text,
    key text DEFAULT NULL,
    config jsonb DEFAULT NULL,
    sample_shards integer DEFAULT 1
) RETURNS TABLE (value double precision, ts timestamptz, shard integer, effective_config jsonb)
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    target rate_limiter_proxy.route_target;
    code pg_catalog.text; msg pg_catalog.text; det pg_catalog.text; hnt pg_catalog.text;
BEGIN
    target := rate_limiter_proxy._route(name, key, config);
    FOR value, ts, shard, effective_config IN
        SELECT v.value, v.ts, v.shard, v.effective_config
          FROM rate_limiter_proxy._rate_limit_value(target.hash, name, key, target.share, sample_shards) AS v
    LOOP
        IF target.spread OPERATOR(pg_catalog.>) 1 THEN
            -- Shards numbered over the whole limit, and the whole limit's config.
            shard := (target.hash OPERATOR(pg_catalog.&) (target.spread OPERATOR(pg_catalog.-) 1))
                OPERATOR(pg_catalog.*) (effective_config OPERATOR(pg_catalog.->>) 'shards')::integer
                OPERATOR(pg_catalog.+) shard;
            effective_config := rate_limiter_proxy._whole(effective_config, target.spread);
        END IF;
        RETURN NEXT;
    END LOOP;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    PERFORM rate_limiter_proxy._raise_again(code, msg, det, hnt, target.hash);
    RAISE;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.rate_limit_value(text, text, jsonb, integer) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.rate_limit_value(text, text, jsonb, integer) IS
    'rate_limiter.rate_limit_value on the partition rate_limit would use; for a spread limit, shard and effective_config are over the whole limit.';

CREATE FUNCTION rate_limiter_proxy.reset_rate_limit(name text, key text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    code pg_catalog.text; msg pg_catalog.text; det pg_catalog.text; hnt pg_catalog.text;
BEGIN
    -- UPDATE on rate_limiter_proxy.limits (see _gate), before any partition is touched.
    PERFORM rate_limiter_proxy._gate('reset_rate_limit');
    -- On every partition: a spread limit's rows are on all of them.
    PERFORM rate_limiter_proxy._reset_everywhere(name, key);
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    PERFORM rate_limiter_proxy._raise_again(code, msg, det, hnt, NULL);
    RAISE;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.reset_rate_limit(text, text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.reset_rate_limit(text, text) IS
    'rate_limiter.reset_rate_limit on every partition. Needs UPDATE on rate_limiter_proxy.limits.';

CREATE FUNCTION rate_limiter_proxy.define(
    name text,
    kind text,
    rate double precision,
    period interval,
    capacity double precision DEFAULT NULL,
    max_reserved double precision DEFAULT NULL,
    shards integer DEFAULT 1,
    start timestamptz DEFAULT NULL,
    min_gap interval DEFAULT NULL,
    mode text DEFAULT 'all',
    buckets integer DEFAULT NULL,
    lock_timeout interval DEFAULT NULL,
    on_lock_timeout text DEFAULT 'deny',
    deny_cache interval DEFAULT NULL,
    hot boolean DEFAULT false
) RETURNS void
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    partitions integer;
    spread integer := 1;
    code pg_catalog.text; msg pg_catalog.text; det pg_catalog.text; hnt pg_catalog.text;
BEGIN
    -- INSERT and UPDATE on rate_limiter_proxy.limits (see _gate), before any partition is
    -- touched: the router's own write below comes after the partitions'.
    PERFORM rate_limiter_proxy._gate('define');
    -- A hot limit's escrow is one database's: through the router, define it on the
    -- partitions themselves.
    IF hot THEN
        RAISE EXCEPTION 'not supported: a hot limit through the router'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Define it with rate_limiter.define(..., hot => true) on each partition, or shard it.';
    END IF;
    partitions := rate_limiter_proxy.partitions();
    IF coalesce(shards, 1) OPERATOR(pg_catalog.>) 1 THEN
        spread := partitions;
    END IF;
    -- Every partition at once, each in a transaction of its own: after an error some may
    -- have the new definition; define again.
    PERFORM rate_limiter_proxy._define_everywhere(name, kind,
        rate OPERATOR(pg_catalog./) spread::double precision, period,
        capacity OPERATOR(pg_catalog./) spread::double precision,
        max_reserved OPERATOR(pg_catalog./) spread::double precision,
        rate_limiter_proxy._shards_per_partition(shards, spread), start, min_gap, mode,
        buckets, lock_timeout, on_lock_timeout, deny_cache);
    INSERT INTO rate_limiter_proxy.limits AS l (name, kind, rate, period, capacity, max_reserved, shards, start, min_gap,
            mode, buckets, lock_timeout, on_lock_timeout, deny_cache, partitions)
        VALUES (name, kind, rate, period, capacity, max_reserved, coalesce(shards, 1), start, min_gap,
            coalesce(mode, 'all'), buckets, lock_timeout, coalesce(on_lock_timeout, 'deny'), deny_cache, partitions)
        ON CONFLICT ON CONSTRAINT limits_pkey DO UPDATE SET
            kind = EXCLUDED.kind, rate = EXCLUDED.rate, period = EXCLUDED.period, capacity = EXCLUDED.capacity,
            max_reserved = EXCLUDED.max_reserved, shards = EXCLUDED.shards, start = EXCLUDED.start,
            min_gap = EXCLUDED.min_gap, mode = EXCLUDED.mode, buckets = EXCLUDED.buckets,
            lock_timeout = EXCLUDED.lock_timeout, on_lock_timeout = EXCLUDED.on_lock_timeout,
            deny_cache = EXCLUDED.deny_cache, partitions = EXCLUDED.partitions, defined_at = pg_catalog.now();
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    PERFORM rate_limiter_proxy._raise_again(code, msg, det, hnt, NULL);
    RAISE;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean) IS
    'rate_limiter.define on every partition (a spread limit, shards > 1, with each partition''s share), recorded in rate_limiter_proxy.limits. Needs INSERT and UPDATE on rate_limiter_proxy.limits.';

CREATE FUNCTION rate_limiter_proxy.redefine_all() RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    l rate_limiter_proxy.limits;
    n integer := 0;
BEGIN
    -- SELECT, INSERT and UPDATE on rate_limiter_proxy.limits (see _gate), before any
    -- partition is touched.
    PERFORM rate_limiter_proxy._gate('redefine_all');
    FOR l IN SELECT * FROM rate_limiter_proxy.limits ORDER BY name LOOP
        PERFORM rate_limiter_proxy.define(l.name, l.kind, l.rate, l.period, l.capacity, l.max_reserved, l.shards,
            l.start, l.min_gap, l.mode, l.buckets, l.lock_timeout, l.on_lock_timeout, l.deny_cache);
        n := n OPERATOR(pg_catalog.+) 1;
    END LOOP;
    RETURN n;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.redefine_all() FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.redefine_all() IS
    'define() again every limit of rate_limiter_proxy.limits on every partition: after a partition is rebuilt or the partition count changes. Returns how many. Needs SELECT, INSERT and UPDATE on rate_limiter_proxy.limits.';

CREATE FUNCTION rate_limiter_proxy.block(name text, key text, until timestamptz DEFAULT 'infinity', note text DEFAULT NULL)
RETURNS void LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    code pg_catalog.text; msg pg_catalog.text; det pg_catalog.text; hnt pg_catalog.text;
BEGIN
    -- UPDATE on rate_limiter_proxy.limits (see _gate), before any partition is touched.
    PERFORM rate_limiter_proxy._gate('block');
    PERFORM rate_limiter_proxy._block_everywhere(name, key, until, note);
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    PERFORM rate_limiter_proxy._raise_again(code, msg, det, hnt, NULL);
    RAISE;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.block(text, text, timestamptz, text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.block(text, text, timestamptz, text) IS
    'rate_limiter.block on every partition. Needs UPDATE on rate_limiter_proxy.limits.';

CREATE FUNCTION rate_limiter_proxy.unblock(name text, key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    code pg_catalog.text; msg pg_catalog.text; det pg_catalog.text; hnt pg_catalog.text;
BEGIN
    -- UPDATE on rate_limiter_proxy.limits (see _gate), before any partition is touched.
    PERFORM rate_limiter_proxy._gate('unblock');
    RETURN (SELECT pg_catalog.bool_or(removed) FROM rate_limiter_proxy._unblock_everywhere(name, key) AS removed);
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    PERFORM rate_limiter_proxy._raise_again(code, msg, det, hnt, NULL);
    RAISE;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.unblock(text, text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.unblock(text, text) IS
    'rate_limiter.unblock on every partition; true if any partition had the block. Needs UPDATE on rate_limiter_proxy.limits.';

-- 0.4.0's additions to rate_limiter: credit goes where rate_limit went for the key; allow and
-- disallow, as block and unblock, to every partition.

CREATE FUNCTION rate_limiter_proxy._credit(hash integer, name text, key text, count double precision, config jsonb)
RETURNS rate_limiter_proxy.decision LANGUAGE plproxy SET search_path = pg_catalog, pg_temp AS $$
    CLUSTER 'rate_limiter';
    RUN ON hash;
    SELECT * FROM rate_limiter.credit(name, key, count, config);
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._credit(integer, text, text, double precision, jsonb) FROM PUBLIC;

CREATE FUNCTION rate_limiter_proxy._allow_everywhere(name text, key text, until timestamptz, note text)
RETURNS SETOF integer LANGUAGE plproxy SET search_path = pg_catalog, pg_temp AS $$
    CLUSTER rate_limiter_proxy._gate('allow');
    RUN ON ALL;
    SELECT 1 FROM rate_limiter.allow(name, key, until, note);
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._allow_everywhere(text, text, timestamptz, text) FROM PUBLIC;

CREATE FUNCTION rate_limiter_proxy._disallow_everywhere(name text, key text)
RETURNS SETOF boolean LANGUAGE plproxy SET search_path = pg_catalog, pg_temp AS $$
    CLUSTER rate_limiter_proxy._gate('disallow');
    RUN ON ALL;
    SELECT rate_limiter.disallow(name, key);
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._disallow_everywhere(text, text) FROM PUBLIC;

CREATE FUNCTION rate_limiter_proxy.credit(
    name text,
    key text DEFAULT NULL,
    count double precision DEFAULT 1,
    config jsonb DEFAULT NULL
) RETURNS rate_limiter_proxy.decision
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    target rate_limiter_proxy.route_target;
    d rate_limiter_proxy.decision;
    code pg_catalog.text; msg pg_catalog.text; det pg_catalog.text; hnt pg_catalog.text;
BEGIN
    target := rate_limiter_proxy._route(name, key, config);
    d := rate_limiter_proxy._credit(target.hash, name, key, count, target.share);
    -- A partition estimates remaining over its own shards.
    d.remaining := d.remaining OPERATOR(pg_catalog.*) target.spread::double precision;
    RETURN d;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    PERFORM rate_limiter_proxy._raise_again(code, msg, det, hnt, target.hash);
    RAISE;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.credit(text, text, double precision, jsonb) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.credit(text, text, double precision, jsonb) IS
    'rate_limiter.credit on the partition of the key (a random one for a spread limit), in a transaction of its own there.';

CREATE FUNCTION rate_limiter_proxy.allow(name text, key text, until timestamptz DEFAULT 'infinity', note text DEFAULT NULL)
RETURNS void LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    code pg_catalog.text; msg pg_catalog.text; det pg_catalog.text; hnt pg_catalog.text;
BEGIN
    -- UPDATE on rate_limiter_proxy.limits (see _gate), before any partition is touched.
    PERFORM rate_limiter_proxy._gate('allow');
    PERFORM rate_limiter_proxy._allow_everywhere(name, key, until, note);
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    PERFORM rate_limiter_proxy._raise_again(code, msg, det, hnt, NULL);
    RAISE;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.allow(text, text, timestamptz, text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.allow(text, text, timestamptz, text) IS
    'rate_limiter.allow on every partition. Needs UPDATE on rate_limiter_proxy.limits.';

CREATE FUNCTION rate_limiter_proxy.disallow(name text, key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    code pg_catalog.text; msg pg_catalog.text; det pg_catalog.text; hnt pg_catalog.text;
BEGIN
    -- UPDATE on rate_limiter_proxy.limits (see _gate), before any partition is touched.
    PERFORM rate_limiter_proxy._gate('disallow');
    RETURN (SELECT pg_catalog.bool_or(removed) FROM rate_limiter_proxy._disallow_everywhere(name, key) AS removed);
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    PERFORM rate_limiter_proxy._raise_again(code, msg, det, hnt, NULL);
    RAISE;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.disallow(text, text) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.disallow(text, text) IS
    'rate_limiter.disallow on every partition; true if any partition had the allow. Needs UPDATE on rate_limiter_proxy.limits.';

-- Every function of the extension: executable by no one but its owner until granted, with
-- its search_path pinned.
DO $$
DECLARE
    unsafe pg_catalog.text;
BEGIN
    SELECT pg_catalog.string_agg(p.oid::pg_catalog.regprocedure::pg_catalog.text, ', ') INTO unsafe
      FROM pg_catalog.pg_depend d
      JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) d.objid
     WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
       AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
       AND d.refobjid OPERATOR(pg_catalog.=) (SELECT e.oid FROM pg_catalog.pg_extension e
                                             WHERE e.extname OPERATOR(pg_catalog.=) 'rate_limiter_proxy')
       AND d.deptype OPERATOR(pg_catalog.=) 'e'
       AND (pg_catalog.has_function_privilege('public', p.oid, 'EXECUTE')
            OR NOT coalesce(p.proconfig OPERATOR(pg_catalog.@>) ARRAY['search_path=pg_catalog, pg_temp'], false));
    IF unsafe IS NOT NULL THEN
        RAISE EXCEPTION 'rate_limiter_proxy functions executable by PUBLIC or without a pinned search_path: %', unsafe;
    END IF;
END
$$;
