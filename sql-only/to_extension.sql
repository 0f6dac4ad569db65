-- Moving a database from the SQL-only edition to the rate_limiter extension (self-hosting, or a
-- service that offers it), keeping every limit, key state, block and allow. Run by a superuser
-- once the extension's package is installed on the server:
--     psql -v ON_ERROR_STOP=1 -d app -f sql-only/to_extension.sql
-- One transaction: the edition's schema steps aside, CREATE EXTENSION makes the same tables,
-- the rows move over, and the edition is dropped; a failure leaves the edition as it was.
-- Grants are the extension's (nothing for PUBLIC): grant the application its calls again.
\set ON_ERROR_STOP on
BEGIN;
DO $$
BEGIN
    IF (SELECT rate_limiter.edition()) IS DISTINCT FROM 'sql-only 0.6.0' THEN
        RAISE EXCEPTION 'this script moves the SQL-only edition 0.6.0, not %', rate_limiter.edition();
    END IF;
END $$;
ALTER SCHEMA rate_limiter RENAME TO rate_limiter_sql_only;
CREATE EXTENSION rate_limiter VERSION '0.6.0';
INSERT INTO rate_limiter.limits SELECT * FROM rate_limiter_sql_only.limits;
INSERT INTO rate_limiter.state SELECT * FROM rate_limiter_sql_only.state;
INSERT INTO rate_limiter.blocks SELECT * FROM rate_limiter_sql_only.blocks;
INSERT INTO rate_limiter.allows SELECT * FROM rate_limiter_sql_only.allows;
DROP SCHEMA rate_limiter_sql_only CASCADE;
COMMIT;
