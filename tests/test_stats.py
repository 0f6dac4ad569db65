"""Statistics in shared memory: rate_limiter.stats, rate_limiter.top_denied, stats_reset.

The test command's cluster preloads the library, so these run on it with names of their
own (the counters are per database, in memory the server's databases share). Clusters with other settings are started here.
"""

import uuid

import psycopg
import pytest

from calls import define, hammer, limit
from clusters import PORTS, connect, every_version

FIELDS = "calls, allowed, denied, tokens_granted, tokens_reserved"


def stats(conn, name):
    return conn.execute(f"SELECT {FIELDS} FROM rate_limiter.stats WHERE name = %s", (name,)).fetchone()


def top_denied(conn, name):
    return conn.execute("SELECT key, denied, approximate_error FROM rate_limiter.top_denied WHERE name = %s "
                        "ORDER BY denied DESC, key", (name,)).fetchall()


def test_concurrent_sessions_are_counted_exactly(test_conn, name):
    define(test_conn, name, rate=100, period="1 hour")
    assert hammer(name, sessions=8, calls=50, fake_now="2026-01-01 00:00:00+00") == 100
    assert stats(test_conn, name) == (400, 100, 300, 100.0, 0.0)
    assert top_denied(test_conn, name) == [("hot", 300, 0)]
    last_allowed, last_denied, since = test_conn.execute(
        "SELECT last_allowed_at, last_denied_at, stats_reset FROM rate_limiter.stats WHERE name = %s", (name,)).fetchone()
    assert since <= last_allowed <= last_denied


def test_calls_count_as_attempts_even_when_their_transaction_rolls_back(test_conn, name):
    define(test_conn, name, rate=1, period="1 hour")
    with connect(autocommit=False) as c:
        assert limit(c, name, "k")[0]
        c.rollback()
    assert limit(test_conn, name, "k")[0]  # the token came back ...
    assert stats(test_conn, name) == (2, 2, 0, 2.0, 0.0)  # ... but both calls are counted


def test_what_each_entry_point_counts(test_conn, name):
    define(test_conn, name, rate=2, period="1 hour")
    other = name + "_b"
    define(test_conn, other, rate=1, period="1 hour")
    test_conn.execute("SET rate_limiter.fake_now = '2026-01-01 00:00:00+00'")  # nothing refills meanwhile
    # A reservation that must wait is allowed, and its tokens are reserved, not granted.
    assert limit(test_conn, name, "r", 2)[0]
    assert limit(test_conn, name, "r", 1, reserve=True)[:2] == (True, pytest.approx(1800000.0))
    # A check is not a call; a wait is one call however often it tries.
    test_conn.execute("SELECT rate_limiter.check_rate_limit(%s, 'k')", (name,))
    test_conn.execute("SELECT rate_limiter.wait_rate_limit(%s, 'r', timeout => '0 seconds')", (name,))
    assert stats(test_conn, name) == (3, 2, 1, 2.0, 1.0)
    # rate_limit_all counts under every name: allowed under both, then denied under both,
    # with the key in the sketch of the limit that denied it only.
    reqs = f'[{{"name": "{name}", "key": "a"}}, {{"name": "{other}", "key": "a"}}]'
    assert test_conn.execute("SELECT ok FROM rate_limiter.rate_limit_all(%s)", (reqs,)).fetchone() == (True,)
    assert test_conn.execute("SELECT ok, limited_by FROM rate_limiter.rate_limit_all(%s)", (reqs,)).fetchone() == (False, other)
    assert stats(test_conn, name) == (5, 3, 2, 3.0, 1.0)
    assert stats(test_conn, other) == (2, 1, 1, 1.0, 0.0)
    assert top_denied(test_conn, name) == [("r", 1, 0)]
    assert top_denied(test_conn, other) == [("a", 1, 0)]
    # A blocked call is denied and counted; its key is in the sketch.
    test_conn.execute("SELECT rate_limiter.block(%s, 'bad')", (other,))
    assert not limit(test_conn, other, "bad")[0]
    assert top_denied(test_conn, other) == [("a", 1, 0), ("bad", 1, 0)]
    test_conn.execute("SELECT rate_limiter.unblock(%s, 'bad')", (other,))


def test_top_denied_keeps_the_heavy_hitters_of_many_keys(test_conn, name):
    define(test_conn, name, rate=1, period="1 hour")
    # 200 keys denied 3 times each, one attacker 400 times: more keys than the sketch holds.
    test_conn.execute("SELECT rate_limiter.rate_limit(%s, 'k' || g %% 200) FROM generate_series(1, 800) g", (name,))
    test_conn.execute("SELECT rate_limiter.rate_limit(%s, 'attacker') FROM generate_series(1, 401)", (name,))
    rows = top_denied(test_conn, name)
    assert len(rows) == 64
    key, denied, error = rows[0]
    assert key == "attacker" and denied - error <= 400 <= denied
    for key, denied, error in rows[1:]:
        assert denied - error <= 3 <= denied


def test_stats_reset_zeroes_one_name_or_all(test_conn, name):
    define(test_conn, name, rate=1, period="1 hour")
    other = name + "_b"
    define(test_conn, other, rate=1, period="1 hour")
    for n in (name, name, other):
        limit(test_conn, n, "k")
    before = test_conn.execute("SELECT stats_reset FROM rate_limiter.stats WHERE name = %s", (name,)).fetchone()[0]
    assert test_conn.execute("SELECT rate_limiter.stats_reset(%s)", (name,)).fetchone() == (1,)
    assert stats(test_conn, name) == (0, 0, 0, 0.0, 0.0) and top_denied(test_conn, name) == []
    assert test_conn.execute("SELECT last_allowed_at, last_denied_at, stats_reset > %s FROM rate_limiter.stats "
                      "WHERE name = %s", (before, name)).fetchone() == (None, None, True)
    assert stats(test_conn, other) == (1, 1, 0, 1.0, 0.0)
    assert test_conn.execute("SELECT rate_limiter.stats_reset() >= 3").fetchone() == (True,)
    assert stats(test_conn, other) == (0, 0, 0, 0.0, 0.0)


def test_track_stats_off_counts_nothing_and_is_superuser_only(test_conn, name):
    define(test_conn, name, rate=1, period="1 hour")
    test_conn.execute("SET rate_limiter.track_stats = off")
    limit(test_conn, name, "k")
    test_conn.execute("RESET rate_limiter.track_stats")
    assert stats(test_conn, name) is None  # never counted, so no row either
    role = "r_" + uuid.uuid4().hex[:8]
    test_conn.execute(f"CREATE ROLE {role}")
    try:
        test_conn.execute(f"SET ROLE {role}")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            test_conn.execute("SET rate_limiter.track_stats = off")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            test_conn.execute("SELECT * FROM rate_limiter.stats")
    finally:
        test_conn.execute("RESET ROLE")
        test_conn.execute(f"DROP ROLE {role}")


@pytest.fixture
def cluster(clusters):
    """A cluster of the test's own with the extension, from conftest's `clusters`."""
    def make(port, settings):
        c = clusters("stats", port, settings).init().start()
        with c.connect() as conn:
            conn.execute("CREATE EXTENSION rate_limiter")
        return c

    return make


def test_names_beyond_stats_max_names_are_counted_under_other(cluster):
    c = cluster(PORTS["stats"], ["-c shared_preload_libraries=rate_limiter", "-c rate_limiter.stats_max_names=2",
                       "-c rate_limiter.prune_interval=0"])
    config = '{"kind": "token bucket", "rate": 1, "period": "1 hour"}'
    with c.connect() as conn:
        for n in ("a", "b", "c", "d", "a"):
            conn.execute("SELECT rate_limiter.rate_limit(%s, 'k', config => %s)", (n, config))
        assert sorted(conn.execute("SELECT name, calls, allowed, denied FROM rate_limiter.stats").fetchall()) == [
            ("*other*", 2, 2, 0), ("a", 2, 1, 1), ("b", 1, 1, 0)]
    # Counters live in shared memory: a restart starts them from zero.
    c.stop()
    c.start()
    with c.connect() as conn:
        assert conn.execute("SELECT name, calls FROM rate_limiter.stats").fetchall() == []


def test_without_preload_the_views_are_empty_and_say_once_how_to_enable_them(cluster):
    c = cluster(PORTS["stats_unloaded"], [])
    with c.connect() as conn:
        notices = []
        conn.add_notice_handler(lambda d: notices.append((d.sqlstate, d.message_primary, d.message_hint)))
        conn.execute("SELECT rate_limiter.rate_limit('a', 'k', config => '{\"kind\":\"token bucket\",\"rate\":1,\"period\":1000}')")
        assert conn.execute("SELECT count(*) FROM rate_limiter.stats").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM rate_limiter.top_denied").fetchone() == (0,)
        assert conn.execute("SELECT rate_limiter.stats_reset()").fetchone() == (0,)
        assert notices == [("55000", "rate_limiter statistics are off: the library is not in shared_preload_libraries",
                            "Add rate_limiter to shared_preload_libraries in postgresql.conf and restart the server.")]


@every_version
def test_the_room_of_dropped_databases_goes_to_new_names(cluster):
    """0.4.0 kept a dropped database's entries until a restart: five databases of 250 names
    each, dropped, left every new name of every other database in `*other*`. Here two
    databases fill the room (10 names each of 20), are dropped, and a third has all of it."""
    c = cluster(PORTS["stats"], ["-c shared_preload_libraries=rate_limiter", "-c rate_limiter.stats_max_names=20",
                                 "-c rate_limiter.stats_max_names_per_database=10", "-c rate_limiter.prune_interval=0"])
    config = '{"kind": "token bucket", "rate": 1, "period": "1 hour"}'

    def call_names(dbname, names):
        with c.connect(dbname) as conn:
            for n in names:
                conn.execute("SELECT rate_limiter.rate_limit(%s, 'k', config => %s)", (n, config))
            return sorted(conn.execute("SELECT name FROM rate_limiter.stats").fetchall())

    with c.connect() as admin:
        for round in range(3):  # dropped and created again, three times over
            for d in ("d1", "d2"):
                admin.execute(f"CREATE DATABASE {d}")
                with c.connect(d) as conn:
                    conn.execute("CREATE EXTENSION rate_limiter")
                assert len(call_names(d, [f"{d}_{round}_{i}" for i in range(10)])) == 10
            for d in ("d1", "d2"):
                admin.execute(f"DROP DATABASE {d}")
        admin.execute("CREATE DATABASE d3")
        with c.connect("d3") as conn:
            conn.execute("CREATE EXTENSION rate_limiter")
        assert call_names("d3", [f"n{i}" for i in range(10)]) == sorted((f"n{i}",) for i in range(10)), \
            "every name has a row of its own, none is in *other*"
        # The dropped databases' rows are gone from every view.
        with c.connect() as conn:
            names = {n for (n,) in conn.execute("SELECT name FROM rate_limiter.stats_every_database()")}
        assert not any(n.startswith("d1_") or n.startswith("d2_") for n in names)
