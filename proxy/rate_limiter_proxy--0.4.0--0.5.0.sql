-- rate_limiter_proxy 0.4.0 -> 0.5.0: define() takes enforce (shadow mode) and tz (calendar
-- windows), both of rate_limiter 0.5.0,
-- recorded in rate_limiter_proxy.limits and given to every partition, whose rate_limiter must
-- be 0.5.0. A session's rate_limiter.shadow is the partitions' sessions' own: through the
-- router, shadow mode is per limit. Runs as a superuser: every object and operator is
-- qualified. A fresh install is 0.4.0's script followed by this one.

\echo Use "ALTER EXTENSION rate_limiter_proxy UPDATE TO '0.5.0'" to load this file. \quit

ALTER TABLE rate_limiter_proxy.limits ADD COLUMN enforce boolean NOT NULL DEFAULT true;
ALTER TABLE rate_limiter_proxy.limits ADD COLUMN tz text;
COMMENT ON COLUMN rate_limiter_proxy.limits.enforce IS 'false: the limit is in shadow mode, as in rate_limiter.limits.';
COMMENT ON COLUMN rate_limiter_proxy.limits.tz IS 'The time zone of a calendar window, as in rate_limiter.limits.';
-- As rate_limiter 0.5.0's update does on each partition: the limits defined before keep the
-- fixed length 0.4.0 gave a period with months, or a fixed window's with days, written out.
UPDATE rate_limiter_proxy.limits
   SET period = pg_catalog.make_interval(secs => pg_catalog.date_part('epoch', period))
 WHERE pg_catalog.date_part('month', period) OPERATOR(pg_catalog.<>) 0
    OR pg_catalog.date_part('year', period) OPERATOR(pg_catalog.<>) 0
    OR (kind OPERATOR(pg_catalog.=) 'fixed window' AND pg_catalog.date_part('day', period) OPERATOR(pg_catalog.<>) 0);

-- define() and its hop take enforce and tz. A function's arguments cannot change in place: create
-- them again, and give back the EXECUTE grants they had.
DO $$
DECLARE
    grantee pg_catalog.regrole;
    define_grantees pg_catalog.regrole[] := (SELECT pg_catalog.array_agg(a.grantee::pg_catalog.regrole)
        FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
        WHERE p.oid OPERATOR(pg_catalog.=) 'rate_limiter_proxy.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean)'::pg_catalog.regprocedure
          AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
          AND a.grantee OPERATOR(pg_catalog.<>) p.proowner AND a.grantee OPERATOR(pg_catalog.<>) 0::pg_catalog.oid);
    hop_grantees pg_catalog.regrole[] := (SELECT pg_catalog.array_agg(a.grantee::pg_catalog.regrole)
        FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
        WHERE p.oid OPERATOR(pg_catalog.=) 'rate_limiter_proxy._define_everywhere(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval)'::pg_catalog.regprocedure
          AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
          AND a.grantee OPERATOR(pg_catalog.<>) p.proowner AND a.grantee OPERATOR(pg_catalog.<>) 0::pg_catalog.oid);
BEGIN
    DROP FUNCTION rate_limiter_proxy.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean);
    DROP FUNCTION rate_limiter_proxy._define_everywhere(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval);
    CREATE FUNCTION rate_limiter_proxy._define_everywhere(name text, kind text, rate double precision, period interval,
        capacity double precision, max_reserved double precision, shards integer, start timestamptz, min_gap interval,
        mode text, buckets integer, lock_timeout interval, on_lock_timeout text, deny_cache interval, enforce boolean,
        tz text)
    RETURNS SETOF integer LANGUAGE plproxy SET search_path = pg_catalog, pg_temp AS $body$
        CLUSTER rate_limiter_proxy._gate('define');
        RUN ON ALL;
        -- By position: PL/Proxy reads every argument's name in the query as the argument.
        -- A hot limit is never defined through the router: hot is false.
        SELECT 1 FROM rate_limiter.define(name, kind, rate, period, capacity, max_reserved, shards, start, min_gap,
                                          mode, buckets, lock_timeout, on_lock_timeout, deny_cache, false, enforce, tz);
    $body$;
    REVOKE ALL ON FUNCTION rate_limiter_proxy._define_everywhere(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, text) FROM PUBLIC;
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
        hot boolean DEFAULT false,
        enforce boolean DEFAULT true,
        tz text DEFAULT NULL
    ) RETURNS void
    LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $define$
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
            buckets, lock_timeout, on_lock_timeout, deny_cache, coalesce(enforce, true), tz);
        INSERT INTO rate_limiter_proxy.limits AS l (name, kind, rate, period, capacity, max_reserved, shards, start, min_gap,
                mode, buckets, lock_timeout, on_lock_timeout, deny_cache, partitions, enforce, tz)
            VALUES (name, kind, rate, period, capacity, max_reserved, coalesce(shards, 1), start, min_gap,
                coalesce(mode, 'all'), buckets, lock_timeout, coalesce(on_lock_timeout, 'deny'), deny_cache, partitions,
                coalesce(enforce, true), tz)
            ON CONFLICT ON CONSTRAINT limits_pkey DO UPDATE SET
                kind = EXCLUDED.kind, rate = EXCLUDED.rate, period = EXCLUDED.period, capacity = EXCLUDED.capacity,
                max_reserved = EXCLUDED.max_reserved, shards = EXCLUDED.shards, start = EXCLUDED.start,
                min_gap = EXCLUDED.min_gap, mode = EXCLUDED.mode, buckets = EXCLUDED.buckets,
                lock_timeout = EXCLUDED.lock_timeout, on_lock_timeout = EXCLUDED.on_lock_timeout,
                deny_cache = EXCLUDED.deny_cache, partitions = EXCLUDED.partitions, enforce = EXCLUDED.enforce, tz = EXCLUDED.tz,
                defined_at = pg_catalog.now();
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
        PERFORM rate_limiter_proxy._raise_again(code, msg, det, hnt, NULL);
        RAISE;
    END
    $define$;
    REVOKE ALL ON FUNCTION rate_limiter_proxy.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, boolean, text) FROM PUBLIC;
    COMMENT ON FUNCTION rate_limiter_proxy.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, boolean, text) IS
        'rate_limiter.define on every partition (a spread limit, shards > 1, with each partition''s share), recorded in rate_limiter_proxy.limits. Needs INSERT and UPDATE on rate_limiter_proxy.limits.';
    -- A regrole's text is the role's name quoted as an identifier already: %s, not %I.
    FOREACH grantee IN ARRAY coalesce(hop_grantees, '{}') LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION rate_limiter_proxy._define_everywhere(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, text) TO %s', grantee);
    END LOOP;
    FOREACH grantee IN ARRAY coalesce(define_grantees, '{}') LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION rate_limiter_proxy.define(text, text, double precision, interval, double precision, double precision, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, boolean, text) TO %s', grantee);
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION rate_limiter_proxy.redefine_all() RETURNS integer
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
            l.start, l.min_gap, l.mode, l.buckets, l.lock_timeout, l.on_lock_timeout, l.deny_cache,
            enforce => l.enforce, tz => l.tz);
        n := n OPERATOR(pg_catalog.+) 1;
    END LOOP;
    RETURN n;
END
$$;

-- Concurrency limits. A call through the router runs on its partition in a transaction of
-- its own there, which ends with the call: a slot held "until the transaction ends" would be
-- given back before the caller used it. Through the router a slot is a lease: acquire takes
-- lease, and rate_limit and wait_rate_limit refuse a concurrency limit. release and renew go
-- where acquire went for the key.
CREATE FUNCTION rate_limiter_proxy._refuse_slots_for_the_call(name text, config jsonb)
RETURNS void LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF coalesce(config OPERATOR(pg_catalog.->>) 'kind',
                (SELECT l.kind FROM rate_limiter_proxy.limits l WHERE l.name OPERATOR(pg_catalog.=) _refuse_slots_for_the_call.name))
       OPERATOR(pg_catalog.=) 'concurrency' THEN
        RAISE EXCEPTION 'not supported: a slot of the concurrency limit "%" through the router would end with the partition''s transaction, before the caller used it', name
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Take it with rate_limiter_proxy.acquire(..., lease => ...) and end it with rate_limiter_proxy.release().';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._refuse_slots_for_the_call(text, jsonb) FROM PUBLIC;

CREATE OR REPLACE FUNCTION rate_limiter_proxy.rate_limit(
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
    PERFORM rate_limiter_proxy._refuse_slots_for_the_call(name, config);
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

CREATE OR REPLACE FUNCTION rate_limiter_proxy.wait_rate_limit(
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
    PERFORM rate_limiter_proxy._refuse_slots_for_the_call(name, config);
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

CREATE FUNCTION rate_limiter_proxy._acquire(hash integer, name text, key text, count double precision, lease interval,
    throws boolean, config jsonb,
    OUT ok boolean, OUT retry_after double precision, OUT remaining double precision, OUT reset_after double precision,
    OUT granted double precision, OUT reason text, OUT limited_by text, OUT lease_id uuid)
RETURNS SETOF record LANGUAGE plproxy SET search_path = pg_catalog, pg_temp AS $$
    CLUSTER 'rate_limiter';
    RUN ON hash;
    SELECT * FROM rate_limiter.acquire(name, key, count, lease, throws, config);
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._acquire(integer, text, text, double precision, interval, boolean, jsonb) FROM PUBLIC;

CREATE FUNCTION rate_limiter_proxy._release(hash integer, name text, key text, lease_id uuid)
RETURNS boolean LANGUAGE plproxy SET search_path = pg_catalog, pg_temp AS $$
    CLUSTER 'rate_limiter';
    RUN ON hash;
    SELECT rate_limiter.release(name, key, lease_id);
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._release(integer, text, text, uuid) FROM PUBLIC;

CREATE FUNCTION rate_limiter_proxy._renew(hash integer, name text, key text, lease_id uuid, lease interval)
RETURNS boolean LANGUAGE plproxy SET search_path = pg_catalog, pg_temp AS $$
    CLUSTER 'rate_limiter';
    RUN ON hash;
    SELECT rate_limiter.renew(name, key, lease_id, lease);
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy._renew(integer, text, text, uuid, interval) FROM PUBLIC;

CREATE FUNCTION rate_limiter_proxy.acquire(
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
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    target rate_limiter_proxy.route_target;
    code pg_catalog.text; msg pg_catalog.text; det pg_catalog.text; hnt pg_catalog.text;
BEGIN
    IF lease IS NULL THEN
        RAISE EXCEPTION 'not supported: a slot of "%" without a lease through the router would end with the partition''s transaction, before the caller used it', name
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Pass lease => (how long the work may take), and release() the lease when it is done.';
    END IF;
    target := rate_limiter_proxy._route(name, key, config);
    SELECT a.* INTO ok, retry_after, remaining, reset_after, granted, reason, limited_by, lease_id
      FROM rate_limiter_proxy._acquire(target.hash, name, key, count, lease, throws, target.share) a;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    PERFORM rate_limiter_proxy._raise_again(code, msg, det, hnt, target.hash);
    RAISE;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.acquire(text, text, double precision, interval, boolean, jsonb) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.acquire(text, text, double precision, interval, boolean, jsonb) IS
    'rate_limiter.acquire with a lease on the partition of the key; without one it is refused, since the partition''s transaction ends with the call.';

CREATE FUNCTION rate_limiter_proxy.release("name" text, "key" text, "lease_id" uuid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    hash integer := pg_catalog.hashtext(coalesce(key, name));
    code pg_catalog.text; msg pg_catalog.text; det pg_catalog.text; hnt pg_catalog.text;
BEGIN
    RETURN rate_limiter_proxy._release(hash, name, key, lease_id);
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    PERFORM rate_limiter_proxy._raise_again(code, msg, det, hnt, hash);
    RAISE;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.release(text, text, uuid) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.release(text, text, uuid) IS
    'rate_limiter.release on the partition of the key, in a transaction of its own there.';

CREATE FUNCTION rate_limiter_proxy.renew("name" text, "key" text, "lease_id" uuid, "lease" interval)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    hash integer := pg_catalog.hashtext(coalesce(key, name));
    code pg_catalog.text; msg pg_catalog.text; det pg_catalog.text; hnt pg_catalog.text;
BEGIN
    RETURN rate_limiter_proxy._renew(hash, name, key, lease_id, lease);
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    PERFORM rate_limiter_proxy._raise_again(code, msg, det, hnt, hash);
    RAISE;
END
$$;
REVOKE ALL ON FUNCTION rate_limiter_proxy.renew(text, text, uuid, interval) FROM PUBLIC;
COMMENT ON FUNCTION rate_limiter_proxy.renew(text, text, uuid, interval) IS
    'rate_limiter.renew on the partition of the key, in a transaction of its own there.';
