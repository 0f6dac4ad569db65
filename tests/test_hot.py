"""Hot limits (docs/hot-limits.md): one key that concurrent transactions consume without
queueing on its row, exact under any interleaving, given back on rollback, kept through
crashes, replicated, and reset, pruned and redefined under load. Each check is the ledger's:
what committed transactions were granted, plus what the limit has left, is what it had."""

import threading
import time

import pytest
from psycopg import errors

from calls import amcheck_clean, define
from clusters import PORTS, every_version, kill_9_under_load, rows_reach, wait_for
from ledger import NOW, granted, ledger, mixed_load, remaining, session, take


@pytest.mark.parametrize("sessions", [8, 16, 32])
def test_the_bound_is_exact_under_concurrent_sessions(database_name, sessions):
    with session(database_name) as admin:
        ledger(admin)
        for kind in ("token bucket", "fixed window"):
            name = f"hot_{kind.split()[0]}"
            define(admin, name, kind, rate=300, period="1 day", hot=True)
    for name in ("hot_token", "hot_fixed"):
        mixed_load(database_name, name, "k", sessions, 60)
        with session(database_name) as c:
            used = granted(c, name, "k")
            left = remaining(c, name, "k")
            assert used + left == 300, f"{name}: {used} granted and {left} left of 300"
            assert used <= 300
            assert left < 10, f"{name}: the load ran the limit down ({left} left)"
            assert c.execute("SELECT count(*) FROM rate_limiter.debits WHERE name = %s", (name,)).fetchone()[0] > 0


def test_a_hot_call_does_not_wait_for_another_transaction_and_a_row_based_one_does(database_name):
    with session(database_name) as admin:
        define(admin, "hot", rate=10, period="1 hour", hot=True)
        define(admin, "row", rate=10, period="1 hour")
    with session(database_name) as holder, session(database_name) as other:
        other.execute("SET lock_timeout = '200ms'")
        for name in ("hot", "row"):
            holder.execute("BEGIN")
            holder.execute("SELECT rate_limiter.rate_limit(%s, 'k', 3)", (name,))
            if name == "hot":
                # In flight, the holder's 3 count: 10 - 3 - 1.
                assert other.execute("SELECT ok, remaining FROM rate_limiter.rate_limit('hot', 'k')").fetchone() == (True, 6)
            else:
                with pytest.raises(errors.LockNotAvailable):
                    other.execute("SELECT rate_limiter.rate_limit('row', 'k')")
            holder.execute("ROLLBACK")
        assert other.execute("SELECT remaining FROM rate_limiter.check_rate_limit('hot', 'k', 0)").fetchone() == (9,)


@pytest.mark.parametrize("escrow", [{"hot": True}, {"durable": False}], ids=["hot", "memory"])
def test_rollback_and_savepoint_rollback_give_back(database_name, escrow):
    """Either escrow, a hot limit's or a memory limit's (tests/test_memory.py)."""
    with session(database_name) as c:
        ledger(c)
        define(c, "hot", rate=10, period="1 hour", **escrow)
        take(c, "hot", "k", 4, rollback=True)
        assert remaining(c, "hot", "k") == 10
        take(c, "hot", "k", 4, savepoint=True)  # 4 rolled back to the savepoint, 4 kept
        assert remaining(c, "hot", "k") == 6
        c.execute("BEGIN")
        c.execute("SELECT rate_limiter.rate_limit('hot', 'k', 5)")
        c.execute("SAVEPOINT a")
        c.execute("SAVEPOINT b")
        assert c.execute("SELECT ok FROM rate_limiter.rate_limit('hot', 'k', 2)").fetchone() == (False,), "5 in flight"
        c.execute("SELECT rate_limiter.rate_limit('hot', 'k', 1)")
        c.execute("RELEASE b")
        c.execute("ROLLBACK TO a")  # the 1 inside b, released into a, goes back too
        c.execute("COMMIT")
        assert remaining(c, "hot", "k") == 1
        assert granted(c, "hot", "k") + 5 + remaining(c, "hot", "k") == 10, "the ledger's 4, and 5 outside it"


def test_what_the_argument_does_not_cover_is_refused(database_name):
    with session(database_name) as c:
        for extra in ("min_gap => '1 second'", "mode => 'partial'", "mode => 'penalize'", "shards => 4",
                      "lock_timeout => '1 second'"):
            with pytest.raises(errors.FeatureNotSupported) as raised:
                c.execute(f"SELECT rate_limiter.define('x', 'token bucket', 10, '1 hour', hot => true, {extra})")
            assert raised.value.diag.message_hint
        with pytest.raises(errors.CheckViolation):
            c.execute("INSERT INTO rate_limiter.limits (name, kind, rate, period, shards, hot) "
                      "VALUES ('x', 'token bucket', 1, '1 hour', 2, true)")
        with pytest.raises(errors.FeatureNotSupported):
            c.execute("SELECT rate_limiter.rate_limit('x', 'k', config => "
                      "'{\"kind\": \"token bucket\", \"rate\": 1, \"period\": 1000, \"hot\": true}')")
        define(c, "hot", rate=10, period="1 hour", hot=True)
        with pytest.raises(errors.FeatureNotSupported):
            c.execute("SELECT rate_limiter.credit('hot', 'k', 1)")
        with pytest.raises(errors.FeatureNotSupported):
            c.execute("SELECT rate_limiter.rate_limit_all('[{\"name\": \"hot\", \"key\": \"k\"}]')")
        c.execute("BEGIN")
        c.execute("SELECT rate_limiter.rate_limit('hot', 'k', 2)")
        with pytest.raises(errors.FeatureNotSupported):
            c.execute("PREPARE TRANSACTION 'hot'")
        assert remaining(c, "hot", "k") == 10, "the refused PREPARE rolled the call back"
        # A TRUNCATE would forget the log's debits with their configs: refused while any.
        c.execute("SELECT rate_limiter.rate_limit('hot', 'k', 2)")
        with pytest.raises(errors.FeatureNotSupported):
            c.execute("TRUNCATE rate_limiter.limits")
        assert remaining(c, "hot", "k") == 8


def test_reset_and_prune_under_load(database_name):
    with session(database_name) as admin:
        ledger(admin)
        define(admin, "hot", rate=100000, period="1 day", hot=True)
    stop = threading.Event()
    load = threading.Thread(target=lambda: mixed_load(database_name, "hot", "k", 6, 10000, stop))
    load.start()
    resets = []
    try:
        with session(database_name) as admin:
            for _ in range(3):
                time.sleep(1)
                admin.execute("SELECT rate_limiter.prune()")
                with admin.transaction():
                    admin.execute("SELECT rate_limiter.reset_rate_limit('hot', 'k')")
                    # Taken while the reset holds calls off: every call after it is later.
                    resets.append(admin.execute("SELECT clock_timestamp()").fetchone()[0])
                admin.execute("SELECT rate_limiter.prune()")
            time.sleep(1)
    finally:
        stop.set()
        load.join()
    with session(database_name) as c:
        after = granted(c, "hot", "k", since=resets[-1])
        assert after > 0, "calls ran after the last reset"
        assert after + remaining(c, "hot", "k") == 100000


def test_moving_into_and_out_of_the_mode_under_load_loses_and_invents_nothing(database_name):
    with session(database_name) as admin:
        ledger(admin)
        define(admin, "m", rate=100000, period="1 day")
    stop = threading.Event()
    load = threading.Thread(target=lambda: mixed_load(database_name, "m", "k", 6, 10000, stop))
    load.start()
    try:
        with session(database_name) as admin:
            for hot in (True, False, True, False, True):
                time.sleep(0.7)
                define(admin, "m", rate=100000, period="1 day", hot=hot)
            time.sleep(0.7)
    finally:
        stop.set()
        load.join()
    with session(database_name) as c:
        used = granted(c, "m", "k")
        assert used > 100, "the load ran"
        assert used + remaining(c, "m", "k") == 100000
        define(c, "m", rate=100000, period="1 day", hot=False)
        assert c.execute("SELECT count(*) FROM rate_limiter.debits").fetchone() == (0,), "moving out folds the log"
        assert used + remaining(c, "m", "k") == 100000


def test_the_log_is_folded_into_the_base_row(database_name):
    with session(database_name) as c:
        ledger(c)
        define(c, "hot", rate=100000, period="1 day", hot=True)
        for _ in range(2500):
            c.execute("SELECT rate_limiter.rate_limit('hot', 'k')")
        assert c.execute("SELECT count(*) FROM rate_limiter.debits").fetchone()[0] < 1000
        assert c.execute("SELECT 100000 - value FROM rate_limiter.state WHERE name = 'hot'").fetchone()[0] > 1500
        assert remaining(c, "hot", "k") == 100000 - 2500
        # The base row and the log add up to what the escrow holds.
        assert c.execute("SELECT value - (SELECT sum(count) FROM rate_limiter.debits) "
                         "FROM rate_limiter.state WHERE name = 'hot'").fetchone() == (100000 - 2500,)


def test_more_hot_keys_in_flight_than_entries_is_53400_and_without_preloading_55000(clusters):
    small = clusters("hotkeys", PORTS["hotkeys"], ["-c shared_preload_libraries=rate_limiter",
                                                   "-c rate_limiter.hot_keys=2",
                                                   "-c rate_limiter.hot_keys_per_database=2"]).init().start()
    with small.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(f"ALTER DATABASE postgres SET rate_limiter.fake_now = '{NOW}'")
        define(c, "hot", rate=10, period="1 hour", hot=True)
    with small.connect() as a, small.connect() as b, small.connect() as c:
        for conn, key in ((a, "a"), (b, "b")):
            conn.execute("BEGIN")
            conn.execute("SELECT rate_limiter.rate_limit('hot', %s)", (key,))
        with pytest.raises(errors.ConfigurationLimitExceeded) as raised:
            c.execute("SELECT rate_limiter.rate_limit('hot', 'c')")
        assert "hot_keys" in raised.value.diag.message_hint
        a.execute("COMMIT")
        assert c.execute("SELECT ok FROM rate_limiter.rate_limit('hot', 'c')").fetchone() == (True,), "a's entry is free"
        b.execute("COMMIT")
        assert c.execute("SELECT remaining FROM rate_limiter.check_rate_limit('hot', 'a', 0)").fetchone() == (9,)
    small.stop()
    small.settings = []
    small.start()
    with small.connect() as c:
        assert c.execute("SELECT remaining FROM rate_limiter.check_rate_limit('hot', 'a', 0)").fetchone() == (9,)
        with pytest.raises(errors.ObjectNotInPrerequisiteState) as raised:
            c.execute("SELECT rate_limiter.rate_limit('hot', 'a')")
        assert "shared_preload_libraries" in raised.value.diag.message_hint


def test_a_call_in_flight_that_the_full_ring_sank_keeps_its_entry(clusters):
    one = clusters("hotkeys", PORTS["hotkeys"], ["-c shared_preload_libraries=rate_limiter",
                                                 "-c rate_limiter.hot_keys=1"]).init().start()
    with one.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(f"ALTER DATABASE postgres SET rate_limiter.fake_now = '{NOW}'")
        define(c, "hot", rate=100000, period="1 hour", hot=True)
    with one.connect() as idle, one.connect() as c:
        idle.execute("BEGIN")
        idle.execute("SELECT rate_limiter.rate_limit('hot', 'k', 7)")
        # More commits than the ring holds: the idle transaction's debit is sunk, and every
        # listed one settles.
        c.execute("SELECT count(*) FROM generate_series(1, 4200) g, LATERAL rate_limiter.rate_limit('hot', 'k', g * 0 + 1) d "
                  "WHERE d.ok")
        for _ in range(3):
            c.execute("SELECT rate_limiter.rate_limit('hot', 'k')")
        # Its entry is not given away while that debit is in flight: a rebuild would miss it.
        with pytest.raises(errors.ConfigurationLimitExceeded):
            c.execute("SELECT rate_limiter.rate_limit('hot', 'j')")
        idle.execute("COMMIT")
        assert c.execute("SELECT ok FROM rate_limiter.rate_limit('hot', 'j')").fetchone() == (True,)
        # k's escrow was given to j; rebuilt from the tables, k counts the idle call too.
        assert c.execute("SELECT remaining FROM rate_limiter.check_rate_limit('hot', 'k', 0)").fetchone() == (
            100000 - 7 - 4200 - 3,)


LOAD = """\\set k random(1, 4)
\\set r random(1, 4)
\\set n random(1, 3)
BEGIN;
INSERT INTO ledger SELECT 'crash', :k, granted, clock_timestamp() FROM rate_limiter.rate_limit('crash', :k::text, :n);
\\if :r = 1
ROLLBACK;
\\else
COMMIT;
\\endif
"""


@every_version
def test_kill_9_under_load_three_times_loses_nothing_and_admits_nothing_extra(clusters):
    cluster = clusters("hot_crash", PORTS["hot_crash"], ["-c shared_preload_libraries=rate_limiter"]).init().start()
    capacity = 1000000000
    with cluster.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(f"ALTER DATABASE postgres SET rate_limiter.fake_now = '{NOW}'")
        ledger(c)
        define(c, "crash", rate=capacity, period="1 hour", hot=True)
    check = """
        SELECT count(*) FROM (SELECT k, sum(granted) AS granted FROM ledger GROUP BY k) l
        FULL JOIN (SELECT g::text AS k, %s - remaining AS used
                   FROM generate_series(1, 4) g, rate_limiter.check_rate_limit('crash', g::text, 0)) s
        USING (k) WHERE l.granted IS DISTINCT FROM s.used AND NOT (l.granted IS NULL AND s.used = 0)"""
    rows_before = 0
    for crash in range(3):
        # Killed mid-load, once this round's load has committed 300 rows (not at its start,
        # where the rows of the rounds before would already be enough).
        kill_9_under_load(cluster, LOAD, clients=8, seconds=20, until=lambda: rows_reach(cluster, "ledger", rows_before + 300))
        with cluster.connect() as c:
            rows = rows_before = c.execute("SELECT count(*) FROM ledger").fetchone()[0]
            assert rows > 100 * (crash + 1), "the load ran"
            # From the tables (no escrow yet), then from the escrow the first call loads.
            assert c.execute(check, (capacity,)).fetchone() == (0,), f"crash {crash + 1}: the tables disagree with the ledger"
            c.execute("SELECT rate_limiter.rate_limit('crash', g::text, 0) FROM generate_series(1, 4) g")
            assert c.execute(check, (capacity,)).fetchone() == (0,), f"crash {crash + 1}: the escrow disagrees with the ledger"
            amcheck_clean(c)
    # Nothing extra after a restart: a limit with 5 left admits 5.
    with cluster.connect() as c:
        define(c, "small", rate=5, period="1 hour", hot=True)
        c.execute("SELECT rate_limiter.rate_limit('small', 'k', 3)")
    cluster.kill9()
    cluster.start()
    with cluster.connect() as c:
        oks = [c.execute("SELECT ok FROM rate_limiter.rate_limit('small', 'k')").fetchone()[0] for _ in range(4)]
        assert oks == [True, True, False, False]


def test_a_standby_and_a_subscriber_agree_with_the_primary(clusters):
    primary = clusters("hot_primary", PORTS["hot_primary"],
                       ["-c shared_preload_libraries=rate_limiter", "-c wal_level=logical"]).init().start()
    standby = clusters("hot_standby", PORTS["hot_standby"], ["-c shared_preload_libraries=rate_limiter"])
    subscriber = clusters("hot_sub", PORTS["hot_subscriber"], ["-c shared_preload_libraries=rate_limiter"]).init().start()
    with primary.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(f"ALTER DATABASE postgres SET rate_limiter.fake_now = '{NOW}'")
        c.execute("CREATE PUBLICATION everything FOR ALL TABLES")
    standby.follow(primary)
    with subscriber.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(f"ALTER DATABASE postgres SET rate_limiter.fake_now = '{NOW}'")
        c.execute(f"CREATE SUBSCRIPTION s CONNECTION '{primary.conninfo()}' PUBLICATION everything")
    with primary.connect() as p:
        p.execute(f"SET rate_limiter.fake_now = '{NOW}'")
        define(p, "hot", rate=100, period="1 hour", hot=True)
        for count in (3, 4, 5):
            p.execute("SELECT rate_limiter.rate_limit('hot', 'k', %s)", (count,))
        p.execute("BEGIN")
        p.execute("SELECT rate_limiter.rate_limit('hot', 'k', 7)")
        p.execute("ROLLBACK")
        lsn = p.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        reads = ["SELECT ok, remaining FROM rate_limiter.check_rate_limit('hot', 'k', 0)",
                 "SELECT value, ts FROM rate_limiter.rate_limit_value('hot', 'k')"]
        expected = [p.execute(sql).fetchone() for sql in reads]
        assert expected[0] == (True, 88)
    with standby.connect() as s, subscriber.connect() as sub:
        wait_for(lambda: s.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)).fetchone()[0], "replay")
        # Each table syncs on its own: the log can be there before the limit's row is.
        caught_up = """SELECT (SELECT count(*) FROM rate_limiter.debits) = 3
                              AND EXISTS (SELECT FROM rate_limiter.limits WHERE name = 'hot')
                              AND NOT EXISTS (SELECT FROM pg_subscription_rel WHERE srsubstate <> 'r')"""
        wait_for(lambda: sub.execute(caught_up).fetchone() == (True,), "the subscriber")
        for conn in (s, sub):
            conn.execute(f"SET rate_limiter.fake_now = '{NOW}'")
            assert [conn.execute(sql).fetchone() for sql in reads] == expected
        sub.execute("DROP SUBSCRIPTION s")
