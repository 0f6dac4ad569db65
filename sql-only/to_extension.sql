-- Moving a database from the SQL-only edition to the rate_limiter extension (self-hosting, or a
-- service that offers it), keeping every limit, key state, block, allow, override and tier. Run by a superuser
-- once the extension's package is installed on the server:
--     psql -v ON_ERROR_STOP=1 -d app -f sql-only/to_extension.sql
-- One transaction: the edition's tables are locked against writers, its schema steps aside,
-- CREATE EXTENSION makes the same tables, the rows move over column by column, and the
-- edition is dropped; a failure leaves the edition as it was. Nothing of the edition's is
-- called (its owner could have replaced any of it): what is moved is read as plain columns
-- of the tables the catalog shows. A view, policy or function of yours that uses the
-- edition's objects stops the move (they would be dropped with it): drop it first, and make
-- it again on the extension. Write limits (limit_writes) move: their triggers are made again
-- on the extension's function, as they were. Grants are the extension's (nothing for PUBLIC): grant the
-- application its calls again. Then ALTER EXTENSION rate_limiter UPDATE to the newest release.
\set ON_ERROR_STOP on
BEGIN;
SET LOCAL search_path = pg_catalog, pg_temp;
DO $$
DECLARE
    edition oid := (SELECT oid FROM pg_namespace WHERE nspname = 'rate_limiter');
    shapes text;
    dependents text;
BEGIN
    IF edition IS NULL OR obj_description(edition, 'pg_namespace') IS DISTINCT FROM 'rate_limiter 0.8.0, SQL-only edition (sql-only/README.md).' THEN
        RAISE EXCEPTION 'schema rate_limiter is not the SQL-only edition 0.8.0' USING ERRCODE = '55000',
            HINT = 'An edition of another release moves with that release''s sql-only/to_extension.sql.';
    END IF;
    -- The seven tables as the edition made them: plain tables of the extension's column types.
    SELECT string_agg(format('%s.%s', c.relname, a.attname), ', ') INTO shapes
    FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    WHERE c.relnamespace = edition AND c.relname IN ('limits', 'state', 'blocks', 'allows', 'overrides', 'tiers', 'leases')
      AND (c.relkind <> 'r' OR a.atttypid::regtype::text NOT IN
           ('text', 'double precision', 'interval', 'integer', 'smallint', 'timestamp with time zone', 'boolean', 'double precision[]', 'uuid'));
    IF shapes IS NOT NULL OR (SELECT count(*) FROM pg_class WHERE relnamespace = edition AND relkind = 'r'
                              AND relname IN ('limits', 'state', 'blocks', 'allows', 'overrides', 'tiers', 'leases')) <> 7 THEN
        RAISE EXCEPTION 'the edition''s tables are not as it made them: %', coalesce(shapes, 'a table is missing') USING ERRCODE = '55000';
    END IF;
    -- Objects outside the schema that use the edition's (they would be dropped with it).
    SELECT string_agg(DISTINCT pg_describe_object(d.classid, d.objid, d.objsubid), '; ') INTO dependents
    FROM pg_depend d
    WHERE d.deptype = 'n'
      AND ((d.refclassid = 'pg_proc'::regclass AND d.refobjid IN (SELECT oid FROM pg_proc WHERE pronamespace = edition))
        OR (d.refclassid = 'pg_class'::regclass AND d.refobjid IN (SELECT oid FROM pg_class WHERE relnamespace = edition))
        OR (d.refclassid = 'pg_type'::regclass AND d.refobjid IN (SELECT oid FROM pg_type WHERE typnamespace = edition)))
      AND NOT (d.classid = 'pg_proc'::regclass AND d.objid IN (SELECT oid FROM pg_proc WHERE pronamespace = edition))
      AND NOT (d.classid = 'pg_class'::regclass AND d.objid IN (SELECT oid FROM pg_class WHERE relnamespace = edition))
      AND NOT (d.classid = 'pg_type'::regclass AND d.objid IN (SELECT oid FROM pg_type WHERE typnamespace = edition))
      AND NOT (d.classid = 'pg_constraint'::regclass AND d.objid IN
               (SELECT oid FROM pg_constraint WHERE connamespace = edition))
      AND NOT (d.classid = 'pg_attrdef'::regclass AND d.objid IN
               (SELECT ad.oid FROM pg_attrdef ad JOIN pg_class c ON c.oid = ad.adrelid WHERE c.relnamespace = edition))
      AND NOT (d.classid = 'pg_trigger'::regclass AND d.objid IN
               (SELECT t.oid FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid WHERE c.relnamespace = edition))
      -- The view of the write limits, and the write limits' triggers, which move below.
      AND NOT (d.classid = 'pg_rewrite'::regclass AND d.objid IN
               (SELECT r.oid FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class WHERE c.relnamespace = edition))
      AND NOT (d.classid = 'pg_trigger'::regclass AND d.objid IN
               (SELECT t.oid FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
                WHERE p.pronamespace = edition AND p.proname = '_write_limited'));
    IF dependents IS NOT NULL THEN
        RAISE EXCEPTION 'objects outside the edition use it: %', dependents USING ERRCODE = '2BP01',
            HINT = 'Drop them, move, and make them again on the extension''s objects.';
    END IF;
END $$;
LOCK TABLE rate_limiter.leases, rate_limiter.limits, rate_limiter.state, rate_limiter.blocks, rate_limiter.allows,
           rate_limiter.overrides, rate_limiter.tiers IN EXCLUSIVE MODE;
ALTER SCHEMA rate_limiter RENAME TO rate_limiter_sql_only;
CREATE EXTENSION rate_limiter VERSION '0.8.0';
INSERT INTO rate_limiter.limits (name, kind, rate, period, capacity, max_reserved, shards, start, min_gap, mode, buckets,
                                 lock_timeout, on_lock_timeout, deny_cache, hot, enforce, tz, durable)
SELECT name, kind, rate, period, capacity, max_reserved, shards, start, min_gap, mode, buckets,
       lock_timeout, on_lock_timeout, deny_cache, hot, enforce, tz, durable FROM rate_limiter_sql_only.limits;
INSERT INTO rate_limiter.state (name, key, shard, value, ts, expires, counts, granted_at)
SELECT name, key, shard, value, ts, expires, counts, granted_at FROM rate_limiter_sql_only.state;
INSERT INTO rate_limiter.blocks (name, key, until, note, created)
SELECT name, key, until, note, created FROM rate_limiter_sql_only.blocks;
INSERT INTO rate_limiter.allows (name, key, until, note, created)
SELECT name, key, until, note, created FROM rate_limiter_sql_only.allows;
INSERT INTO rate_limiter.tiers (name, tier, rate, period, capacity, max_reserved, min_gap, exempt, note, created)
SELECT name, tier, rate, period, capacity, max_reserved, min_gap, exempt, note, created FROM rate_limiter_sql_only.tiers;
INSERT INTO rate_limiter.overrides (name, key, tier, rate, period, capacity, max_reserved, min_gap, exempt, until, note, created)
SELECT name, key, tier, rate, period, capacity, max_reserved, min_gap, exempt, until, note, created FROM rate_limiter_sql_only.overrides;
INSERT INTO rate_limiter.leases (name, key, slot, lease_id, expires_at)
SELECT name, key, slot, lease_id, expires_at FROM rate_limiter_sql_only.leases;
-- Each write limit's trigger made again on the extension's function, with its arguments, and
-- disabled or enabled as it was.
DO $$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT g.oid, g.tgname, g.tgrelid::regclass AS tab, g.tgenabled, pg_get_triggerdef(g.oid) AS def
             FROM pg_trigger g JOIN pg_proc p ON p.oid = g.tgfoid
             WHERE p.pronamespace = 'rate_limiter_sql_only'::regnamespace AND p.proname = '_write_limited'
             ORDER BY g.tgrelid, g.tgname LOOP
        -- The function's name once, at the end: nothing else of the definition is touched.
        IF (length(t.def) - length(replace(t.def, 'EXECUTE FUNCTION rate_limiter_sql_only._write_limited(', ''))) /
               length('EXECUTE FUNCTION rate_limiter_sql_only._write_limited(') <> 1 THEN
            RAISE EXCEPTION 'the write limit trigger % on % cannot be moved as it is', t.tgname, t.tab USING ERRCODE = '55000',
                HINT = 'Drop it (unlimit_writes), move, and declare it again with rate_limiter.limit_writes.';
        END IF;
        EXECUTE format('DROP TRIGGER %I ON %s', t.tgname, t.tab);
        EXECUTE replace(t.def, 'EXECUTE FUNCTION rate_limiter_sql_only._write_limited(', 'EXECUTE FUNCTION rate_limiter._write_limited(');
        IF t.tgenabled <> 'O' THEN
            EXECUTE format('ALTER TABLE %s %s TRIGGER %I', t.tab,
                           CASE t.tgenabled WHEN 'D' THEN 'DISABLE' WHEN 'R' THEN 'ENABLE REPLICA' ELSE 'ENABLE ALWAYS' END, t.tgname);
        END IF;
    END LOOP;
END $$;
DROP SCHEMA rate_limiter_sql_only CASCADE;
COMMIT;
