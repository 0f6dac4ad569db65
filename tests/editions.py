"""The SQL-only edition installed as its README says, for the tests that run on it."""

import subprocess
import uuid
from pathlib import Path

import pytest

from clusters import pg_bin

EDITION = Path(__file__).resolve().parent.parent / "sql-only" / "rate_limiter.sql"


def install(test_cluster, dbname, owner):
    """The edition, installed into a new database of `owner` by `owner`, as the README says."""
    with test_cluster.connect() as admin:
        admin.execute(f"CREATE DATABASE {dbname} OWNER {owner}")
    result = subprocess.run([f"{pg_bin(test_cluster.version)}/psql", "-X", "-q", "-h", "/tmp", "-p", str(test_cluster.port), "-U", owner,
                             "-d", dbname, "-v", "ON_ERROR_STOP=1", "-f", str(EDITION)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.fixture
def edition(test_cluster):
    """A database with the edition, installed by its owner, a role that is not a superuser,
    whose default privileges would give another role everything it creates."""
    owner, dbname, other = "ed_owner_" + uuid.uuid4().hex[:6], "ed_" + uuid.uuid4().hex[:8], "ed_other_" + uuid.uuid4().hex[:6]
    with test_cluster.connect() as admin:
        admin.execute(f"CREATE ROLE {owner} LOGIN NOSUPERUSER")
        admin.execute(f"CREATE ROLE {other}")
        for kind in ("TABLES", "FUNCTIONS", "SCHEMAS", "TYPES", "SEQUENCES"):
            admin.execute(f"ALTER DEFAULT PRIVILEGES FOR ROLE {owner} GRANT ALL ON {kind} TO {other}")
    try:
        install(test_cluster, dbname, owner)
        with test_cluster.connect(dbname) as c:
            assert c.execute("""SELECT count(*) FROM pg_class WHERE relnamespace = 'rate_limiter'::regnamespace
                                AND relacl::text LIKE %s""", (f"%{other}%",)).fetchone() == (0,)
            assert c.execute("""SELECT count(*) FROM pg_proc WHERE pronamespace = 'rate_limiter'::regnamespace
                                AND proacl::text LIKE %s""", (f"%{other}%",)).fetchone() == (0,)
            assert c.execute("""SELECT count(*) FROM pg_type WHERE typnamespace = 'rate_limiter'::regnamespace
                                AND typacl::text LIKE %s""", (f"%{other}%",)).fetchone() == (0,)
            assert other not in str(c.execute("SELECT nspacl FROM pg_namespace WHERE nspname = 'rate_limiter'").fetchone()[0])
        yield dbname, owner
    finally:
        with test_cluster.connect() as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
            admin.execute(f"DROP OWNED BY {other}")
            for kind in ("TABLES", "FUNCTIONS", "SCHEMAS", "TYPES", "SEQUENCES"):
                admin.execute(f"ALTER DEFAULT PRIVILEGES FOR ROLE {owner} REVOKE ALL ON {kind} FROM {other}")
            admin.execute(f"DROP ROLE {other}")
            admin.execute(f"DROP ROLE {owner}")
