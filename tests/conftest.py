"""Fixtures every tier-4 test file shares. Connections come from the PG* environment the test
command sets (socket in /tmp, user postgres, a fresh database); see clusters.py for the
clusters tests start themselves and their ports."""

import uuid

import pytest

from clusters import Cluster, connect


@pytest.fixture
def name():
    """A limit name of the test's own, so tests on one cluster never interfere."""
    return "t_" + uuid.uuid4().hex[:12]


@pytest.fixture
def db():
    with connect() as conn:
        yield conn


@pytest.fixture
def database():
    """A fresh database with the extension, on the test command's cluster."""
    dbname = "rl_test_" + uuid.uuid4().hex[:8]
    with connect() as admin:
        admin.execute(f"CREATE DATABASE {dbname}")
        try:
            with connect(dbname=dbname) as c:
                c.execute("CREATE EXTENSION rate_limiter")
            yield dbname
        finally:
            admin.execute(f"DROP DATABASE {dbname} WITH (FORCE)")


@pytest.fixture
def clusters():
    """Makes clusters of the test's own (`make(name, port, settings)`), removed when it ends."""
    made = []

    def make(kind, port, settings=()):
        cluster = Cluster(f"{kind}_{uuid.uuid4().hex[:6]}", port, settings)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.destroy()
