"""Fixtures every tier-4 test file shares. Connections come from the PG* environment the test
command sets (socket in /tmp, user postgres, a fresh database); see clusters.py for the
clusters tests start themselves and their ports."""

import os
import uuid

import pytest

from clusters import Cluster, connect


@pytest.fixture
def pg():
    """The PostgreSQL major a test runs on: 15, unless the test is marked
    `clusters.every_version`."""
    return "15"


@pytest.fixture
def main(pg):
    """The test command's cluster of the test's version."""
    return Cluster.of_test_command(pg)


@pytest.fixture
def name():
    """A limit name of the test's own, so tests on one cluster never interfere."""
    return "t_" + uuid.uuid4().hex[:12]


@pytest.fixture
def db(main):
    """A session on the test command's database, on the cluster of the test's version."""
    with main.connect(os.environ.get("PGDATABASE", "rate_limiter_test")) as conn:
        yield conn


@pytest.fixture
def database(main):
    """A fresh database with the extension, on the test command's cluster of the test's
    version."""
    dbname = "rl_test_" + uuid.uuid4().hex[:8]
    with main.connect() as admin:
        admin.execute(f"CREATE DATABASE {dbname}")
        try:
            with main.connect(dbname) as c:
                c.execute("CREATE EXTENSION rate_limiter")
            yield dbname
        finally:
            admin.execute(f"DROP DATABASE {dbname} WITH (FORCE)")


@pytest.fixture
def clusters(pg):
    """Makes clusters of the test's own and version (`make(name, port, settings)`), removed
    when it ends."""
    made = []

    def make(kind, port, settings=(), version=None):
        cluster = Cluster(f"{kind}_{uuid.uuid4().hex[:6]}", port, settings, version or pg)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.destroy()
