"""Fixtures every tier-4 test file shares. Connections come from the PG* environment the test
command sets (socket in /tmp, user postgres, a fresh database); see clusters.py for the
clusters tests start themselves and their ports."""

import os
import uuid

import pytest

from clusters import DATABASE, VERSIONS, Cluster, connect


@pytest.fixture
def pg():
    """The PostgreSQL major a test runs on: 15, unless the test is marked
    `clusters.every_version`."""
    return "15"


@pytest.fixture
def test_cluster(pg):
    """The test command's cluster of the test's version."""
    return Cluster.of_test_command(pg)


@pytest.fixture
def name():
    """A limit name of the test's own, so tests on one cluster never interfere."""
    return "t_" + uuid.uuid4().hex[:12]


@pytest.fixture(scope="session", autouse=True)
def worker_database():
    """Under pytest-xdist, the worker's own test database (clusters.DATABASE) on every
    version's cluster, made afresh with the extension as the test command makes its own."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        for version in VERSIONS:
            cluster = Cluster.of_test_command(version)
            with cluster.connect() as admin:
                admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
                admin.execute(f"CREATE DATABASE {DATABASE}")
            with cluster.connect(DATABASE) as c:
                c.execute("CREATE EXTENSION rate_limiter")


@pytest.fixture
def test_conn(test_cluster):
    """A connection (autocommit) to the test command's database, on the cluster of the test's
    version."""
    with test_cluster.connect(DATABASE) as conn:
        yield conn


@pytest.fixture
def database_name(test_cluster):
    """The name of a fresh database with the extension, on the test command's cluster of the
    test's version; dropped after the test."""
    dbname = "rl_test_" + uuid.uuid4().hex[:8]
    with test_cluster.connect() as admin:
        admin.execute(f"CREATE DATABASE {dbname}")
        try:
            with test_cluster.connect(dbname) as c:
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


def pytest_configure(config):
    config.addinivalue_line("markers", "alone: replaces installed files; the test command runs it with no other test")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each report carries its test's version (of a major upgrade, the one upgraded to), which
    reaches the controller under xdist."""
    outcome = yield
    params = item.callspec.params if hasattr(item, "callspec") else {}
    outcome.get_result().user_properties.append(("pg", str(params.get("pg") or params.get("new") or "15")))


def pytest_terminal_summary(terminalreporter):
    """Each test's seconds (setup, call and teardown) with its version, one line "VERSION
    SECONDS TEST" per test and run, added to the file the test command prints its steps' times
    and the slowest tests from (RATE_LIMITER_TIMINGS)."""
    path = os.environ.get("RATE_LIMITER_TIMINGS")
    # Under xdist each worker has a terminal summary of its own tests too: only the controller's
    # counts (both once counted every test twice).
    if not path or "PYTEST_XDIST_WORKER" in os.environ:
        return
    seconds = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            pg = dict(getattr(report, "user_properties", ())).get("pg")
            if pg is not None and hasattr(report, "duration"):
                seconds[pg, report.nodeid] = seconds.get((pg, report.nodeid), 0.0) + report.duration
    with open(path, "a") as f:
        f.writelines(f"{pg} {total:.2f} {test}\n" for (pg, test), total in sorted(seconds.items()))
