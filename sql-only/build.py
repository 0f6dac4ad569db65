"""Assembles sql-only/rate_limiter.sql, the edition's one install script: the extension's own
tables and decision type, taken from sql/bootstrap.sql so that the two never drift apart
(the same shapes, constraints and comments: a database can move to the extension with its
state), then the edition's arithmetic and functions; and sql-only/pg_tle.sql, the same
script as a pg_tle extension's. `python3 sql-only/build.py` writes them; `--check` fails when
a committed file is not what it would write (the test command runs that).
"""

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "rate_limiter.sql"
PG_TLE_OUT = HERE / "pg_tle.sql"
# pg_tle's name for the edition: not `rate_limiter`, the compiled extension's.
PG_TLE_NAME = "rate_limiter_sql"
PG_TLE_QUOTE = "$_pgtle_$"
VERSION = "0.8.0"
# The extension's objects the edition has: what it keeps no state in (debits, leases, the
# memory snapshot) is left out.
# The edition's parts in the order they are installed: the bucket laid out as src/bucket/ is,
# file by file (a type or SQL function before what names it), then the calls.
PARTS = ("clock.sql", "bucket/types.sql", "bucket/calendar.sql", "bucket/sliding_window.sql",
         "bucket/rolling_window.sql", "bucket/convex.sql", "bucket/shard.sql", "bucket/credit.sql", "bucket/plan.sql",
         "fingerprint.sql", "api.sql", "calls.sql", "overrides.sql", "shards.sql", "all.sql", "concurrency.sql", "writes.sql")
OBJECTS = {"limits", "blocks", "allows", "overrides", "tiers", "state", "decision", "leases", "leases_lease_id"}

HEADER = f"""-- rate_limiter {VERSION}, the SQL-only edition: plain SQL and PL/pgSQL for databases where no
-- compiled extension can be installed (RDS, Cloud SQL, Azure, Supabase, Neon). Written by
-- sql-only/build.py: edit its parts (sql-only/*.sql, sql/bootstrap.sql), not this file.
--
-- Install as the database's owner (no superuser needed), into a database without the
-- extension:   psql -v ON_ERROR_STOP=1 -d DB -f rate_limiter.sql
\\set ON_ERROR_STOP on
BEGIN;
DO $$
BEGIN
    IF pg_catalog.current_setting('server_version_num')::int OPERATOR(pg_catalog.<) 150000 THEN
        RAISE EXCEPTION 'rate_limiter needs PostgreSQL 15 or later, not %', pg_catalog.current_setting('server_version')
            USING ERRCODE = '0A000';
    END IF;
    -- psql only (CREATE EXTENSION decides who owns an extension's objects):
    IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) current_user) THEN
        RAISE EXCEPTION 'the SQL-only edition is installed by the database''s owner, not by a superuser' USING ERRCODE = '42501',
            HINT = 'Its functions run with their owner''s rights: SET ROLE to the database''s owner (or a role without superuser) first.';
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
COMMENT ON SCHEMA rate_limiter IS 'rate_limiter {VERSION}, SQL-only edition (sql-only/README.md).';
"""

FOOTER = f"""
-- The edition's version, as extversion is the extension's.
CREATE FUNCTION rate_limiter.edition() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN 'sql-only {VERSION}';
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
COMMIT;
"""


def statements(sql):
    """The statements of a script, with the comments just above each; dollar-quoted bodies
    ($$, $function$, ...) kept whole."""
    out, buf, tag = [], "", None
    for line in sql.splitlines(keepends=True):
        buf += line
        for quote in re.findall(r"\$[A-Za-z_]*\$", line):
            if tag is None:
                tag = quote
            elif quote == tag:
                tag = None
        if tag is None and line.rstrip().endswith(";"):
            out.append(buf)
            buf = ""
    return out


def tables():
    kept = []
    for st in statements((ROOT / "sql" / "bootstrap.sql").read_text()):
        code = "\n".join(line for line in st.splitlines() if not line.strip().startswith("--"))
        subject = re.search(r"rate_limiter\.(\w+)", code)  # the object a statement is about
        if subject and subject.group(1) in OBJECTS and "pg_extension_config_dump" not in code:
            kept.append(st.strip("\n") + "\n")
    return "\n".join(kept)


def ip_key():
    """The extension's ip_key, PL/pgSQL already (sql/finalize.sql), and its comment."""
    kept = [st.strip("\n") + "\n" for st in statements((ROOT / "sql" / "finalize.sql").read_text())
            if re.search(r"(CREATE FUNCTION|COMMENT ON FUNCTION) rate_limiter\.ip_key\b", st)]
    assert len(kept) == 2, "ip_key and its comment in sql/finalize.sql"
    return "\n-- ip_key, as the extension's (sql/finalize.sql).\n" + "\n".join(kept)


def check(text):
    """What an install must hold, whatever the parts' parsing did."""
    for created in ("TABLE rate_limiter.limits", "TABLE rate_limiter.blocks", "TABLE rate_limiter.allows",
                    "TABLE rate_limiter.state", "TYPE rate_limiter.decision", "FUNCTION rate_limiter.ip_key"):
        assert f"CREATE {created}" in text, created
    assert "@extschema@" not in text and "pg_extension_config_dump" not in text
    return text


def build():
    parts = [HEADER, "\n-- The extension's tables and decision type (sql/bootstrap.sql).\n\n", tables()]
    for name in PARTS:
        parts += ["\n", (HERE / name).read_text()]
    parts.append(ip_key())
    parts.append(FOOTER)
    return check("".join(parts))


def extension_script(script):
    """The install script as an extension's: without psql's setting and the transaction
    (CREATE EXTENSION runs in its own), and without the refusal of a superuser, which is the
    psql install's (an extension's objects are owned as CREATE EXTENSION decides)."""
    lines = script.splitlines(keepends=True)
    assert lines.count("\\set ON_ERROR_STOP on\n") == lines.count("BEGIN;\n") == lines.count("COMMIT;\n") == 1
    body = "".join(l for l in lines if l not in ("\\set ON_ERROR_STOP on\n", "BEGIN;\n", "COMMIT;\n"))
    start = body.index("    -- psql only")
    end = body.index("    END IF;\n", start) + len("    END IF;\n")
    body = body[:start] + body[end:]
    assert PG_TLE_QUOTE not in body and "superuser' USING" not in body
    return body


def pg_tle(script):
    """sql-only/pg_tle.sql: the edition registered with pg_tle (RDS, Supabase), then created."""
    return f"""-- rate_limiter {VERSION}, the SQL-only edition, as a pg_tle extension named {PG_TLE_NAME}: the
-- install script of sql-only/rate_limiter.sql as an extension's (written by sql-only/build.py).
-- Untested against pg_tle itself, which is not packaged for Debian; the test command installs
-- the same script as a trusted extension of PostgreSQL's own (tests/test_sql_only.py).
--
-- As a role that may use pg_tle (pgtle_admin), into a database without the extension:
--   psql -v ON_ERROR_STOP=1 -d DB -f pg_tle.sql
SELECT pgtle.install_extension('{PG_TLE_NAME}', '{VERSION}',
    'Rate limits inside your transactions: the SQL-only edition of rate_limiter', {PG_TLE_QUOTE}
{extension_script(script)}{PG_TLE_QUOTE});
CREATE EXTENSION {PG_TLE_NAME};
"""


if __name__ == "__main__":
    text = build()
    outputs = {OUT: text, PG_TLE_OUT: pg_tle(text)}
    for path, content in outputs.items():
        if "--check" in sys.argv:
            if not path.exists() or path.read_text() != content:
                sys.exit(f"{path} is not what sql-only/build.py writes: run python3 sql-only/build.py")
        else:
            path.write_text(content)
