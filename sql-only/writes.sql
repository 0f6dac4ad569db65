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
