"""Connections to the test cluster from the libpq environment (PGHOST, PGPORT, PGUSER,
PGDATABASE), as each driver spells them."""

import os
import uuid

import psycopg
import pytest

import rate_limiter_postgres


def env(name, default):
    return os.environ.get(name, default)


HOST, PORT = env("PGHOST", "/tmp"), env("PGPORT", "5432")
USER, DB = env("PGUSER", "postgres"), env("PGDATABASE", "postgres")
QUERY = f"host={HOST}&port={PORT}"


@pytest.fixture
def name():
    return "py_" + uuid.uuid4().hex[:10]


@pytest.fixture
def conn():
    with psycopg.connect(autocommit=True) as c:
        yield c


@pytest.fixture
def storage_uri():
    return f"rate-limiter+postgresql://{USER}@/{DB}?{QUERY}"


@pytest.fixture(autouse=True)
def installed_not_source():
    assert "site-packages" in rate_limiter_postgres.__file__, rate_limiter_postgres.__file__
