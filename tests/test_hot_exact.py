"""Hot limits against the sequences that should break their bound (issue 30): a reset or a
change of the limit that rolls back, a mode switch inside one transaction, a subscriber that
takes only the limits, a new database given a dropped one's OID. Each ends with the number
of calls the limit still admits, which must be what its committed history leaves."""

import threading
import time

import psycopg
import pytest
from psycopg import errors

from properties import seeded
from calls import define
from clusters import PORTS, wait_for
from together import in_sessions

NOW = "2030-01-01 00:00:00+00"
PRELOADED = ["-c shared_preload_libraries=rate_limiter", "-c rate_limiter.prune_interval=0"]


def admitted(conn, name, key, calls=10):
    """How many of `calls` single-token calls, each in a transaction of its own, are admitted."""
    return sum(conn.execute("SELECT ok FROM rate_limiter.rate_limit(%s, %s, 1)", (name, key)).fetchone()[0]
               for _ in range(calls))


def exhausted_and_unloaded(conn, name="p1"):
    """A hot limit of 5 for a very long time, its key 'k' exhausted by committed calls, and its
    escrow dropped (by defining it again), so that the next call loads it."""
    conn.execute(f"SET rate_limiter.fake_now = '{NOW}'")
    define(conn, name, rate=1, period="1000 days", capacity=5, hot=True)
    assert conn.execute("SELECT ok FROM rate_limiter.rate_limit(%s, 'k', 5)", (name,)).fetchone() == (True,)
    define(conn, name, rate=1, period="1000 days", capacity=5, hot=True)


@pytest.mark.parametrize("undo", ["ROLLBACK", "ROLLBACK TO SAVEPOINT s"])
def test_a_reset_that_rolls_back_leaves_the_key_exhausted(database_name, undo):
    with psycopg.connect(dbname=database_name, autocommit=True) as c:
        exhausted_and_unloaded(c)
        c.execute("BEGIN")
        c.execute("SAVEPOINT s")
        c.execute("SELECT rate_limiter.reset_rate_limit('p1', 'k')")
        # The escrow would be loaded from what only this transaction sees.
        c.execute("SAVEPOINT call")
        with pytest.raises(errors.FeatureNotSupported) as refused:
            c.execute("SELECT ok FROM rate_limiter.rate_limit('p1', 'k', 1)")
        assert "commit" in refused.value.diag.message_hint
        c.execute("ROLLBACK TO SAVEPOINT call")
        # Reads are answered from this transaction's tables: the reset is seen.
        assert c.execute("SELECT remaining FROM rate_limiter.check_rate_limit('p1', 'k', 0)").fetchone() == (5,)
        c.execute(undo)
        if undo != "ROLLBACK":
            # Back before the reset: calls load the escrow from the exhausted key.
            assert c.execute("SELECT ok FROM rate_limiter.rate_limit('p1', 'k', 1)").fetchone() == (False,)
            c.execute("COMMIT")
        assert admitted(c, "p1", "k") == 0


def test_a_reset_that_commits_gives_the_key_back(database_name):
    with psycopg.connect(dbname=database_name, autocommit=True) as c:
        exhausted_and_unloaded(c)
        c.execute("SELECT rate_limiter.reset_rate_limit('p1', 'k')")
        assert admitted(c, "p1", "k") == 5


def test_a_mode_switch_inside_one_transaction_admits_no_more_than_the_capacity(database_name):
    with psycopg.connect(dbname=database_name, autocommit=True) as c:
        c.execute(f"SET rate_limiter.fake_now = '{NOW}'")
        define(c, "m", rate=1, period="1000 days", capacity=10, hot=True)
        granted = c.execute("SELECT granted FROM rate_limiter.rate_limit('m', 'k', 8)").fetchone()[0]
        c.execute("BEGIN")
        define(c, "m", rate=1, period="1000 days", capacity=10, hot=False)
        granted += c.execute("SELECT granted FROM rate_limiter.rate_limit('m', 'k', 2)").fetchone()[0]
        define(c, "m", rate=1, period="1000 days", capacity=10, hot=True)
        c.execute("SAVEPOINT call")
        with pytest.raises(errors.FeatureNotSupported):
            c.execute("SELECT granted FROM rate_limiter.rate_limit('m', 'k', 2)")
        c.execute("ROLLBACK TO SAVEPOINT call")
        c.execute("COMMIT")
        assert granted == 10
        assert admitted(c, "m", "k") == 0


def test_a_subscriber_of_the_limits_only_follows_a_hot_limit_out_of_the_mode(clusters):
    publisher = clusters("hot_primary", PORTS["hot_primary"], [*PRELOADED, "-c wal_level=logical"]).init().start()
    subscriber = clusters("hot_sub", PORTS["hot_subscriber"], PRELOADED).init().start()
    for cluster in (publisher, subscriber):
        with cluster.connect() as c:
            c.execute("CREATE EXTENSION rate_limiter")
            c.execute(f"ALTER DATABASE postgres SET rate_limiter.fake_now = '{NOW}'")
    with publisher.connect() as p:
        p.execute("CREATE PUBLICATION limits FOR TABLE rate_limiter.limits")
        define(p, "sub", rate=5, period="1 hour", hot=True)
    hot = "SELECT hot FROM rate_limiter.limits WHERE name = 'sub'"
    with subscriber.connect() as s:
        s.execute(f"CREATE SUBSCRIPTION s CONNECTION '{publisher.conninfo()}' PUBLICATION limits")
        wait_for(lambda: s.execute(hot).fetchone() == (True,), "the limit on the subscriber")
        assert admitted(s, "sub", "k") == 5
        with publisher.connect() as p:
            define(p, "sub", rate=5, period="1 hour", hot=False)
        wait_for(lambda: s.execute(hot).fetchone() == (False,), "the change on the subscriber")
        assert admitted(s, "sub", "k") == 0, "the subscriber's own debits were folded when the limit changed"
        assert s.execute("SELECT count(*) FROM rate_limiter.debits").fetchone() == (0,)
        s.execute("DROP SUBSCRIPTION s")


def test_a_new_database_with_a_dropped_ones_oid_starts_empty(clusters):
    server = clusters("hotkeys", PORTS["hotkeys"], PRELOADED).init().start()
    with server.connect() as admin:
        # A template whose key 'k' is exhausted: 5 committed debits of a limit of 5.
        admin.execute("CREATE DATABASE tmpl")
        with server.connect("tmpl") as t:
            t.execute("CREATE EXTENSION rate_limiter")
            t.execute(f"SET rate_limiter.fake_now = '{NOW}'")
            define(t, "reused", rate=5, period="1 hour", hot=True)
            assert admitted(t, "reused", "k", 5) == 5
        # A database that loads the key's escrow with 1 debit, then is dropped.
        admin.execute("CREATE DATABASE first")
        oid = admin.execute("SELECT oid FROM pg_database WHERE datname = 'first'").fetchone()[0]
        with server.connect("first") as f:
            f.execute("CREATE EXTENSION rate_limiter")
            f.execute(f"SET rate_limiter.fake_now = '{NOW}'")
            define(f, "reused", rate=5, period="1 hour", hot=True)
            assert admitted(f, "reused", "k", 1) == 1
            assert f.execute("SELECT allowed FROM rate_limiter.stats WHERE name = 'reused'").fetchone() == (1,)
        admin.execute("DROP DATABASE first")
        admin.execute(f"CREATE DATABASE second OID = {oid} TEMPLATE tmpl")
        with server.connect("second") as s:
            s.execute(f"SET rate_limiter.fake_now = '{NOW}'")
            assert admitted(s, "reused", "k", 5) == 0, "the template's 5 debits, not the dropped database's 1"
            assert s.execute("SELECT allowed, denied FROM rate_limiter.stats WHERE name = 'reused'").fetchone() == (0, 5)


def test_one_database_holds_no_more_than_its_share_of_the_entries(clusters):
    server = clusters("hotkeys", PORTS["hotkeys"], [*PRELOADED, "-c rate_limiter.hot_keys=4"]).init().start()
    with server.connect() as admin:
        for database_name in ("greedy", "other"):
            admin.execute(f"CREATE DATABASE {database_name}")
            with server.connect(database_name) as c:
                c.execute("CREATE EXTENSION rate_limiter")
                define(c, "hot", rate=10, period="1 hour", hot=True)
    # The greedy database holds a call in flight on each of its keys, as long as it likes.
    held = [server.connect("greedy") for _ in range(3)]
    try:
        for conn, key in zip(held[:2], "ab"):
            conn.execute("BEGIN")
            conn.execute("SELECT rate_limiter.rate_limit('hot', %s)", (key,))
        with pytest.raises(errors.ConfigurationLimitExceeded) as refused:
            held[2].execute("SELECT rate_limiter.rate_limit('hot', 'c')")
        assert "hot_keys_per_database" in refused.value.diag.message_hint
        # Half of the entries (the default share) are still the other database's.
        with server.connect("other") as other:
            other.execute("BEGIN")
            for key in "xy":
                assert other.execute("SELECT ok FROM rate_limiter.rate_limit('hot', %s)", (key,)).fetchone() == (True,)
            other.execute("COMMIT")
        # A superuser may give one database more.
        held[2].execute("SET rate_limiter.hot_keys_per_database = 3")
        assert held[2].execute("SELECT ok FROM rate_limiter.rate_limit('hot', 'c')").fetchone() == (True,)
    finally:
        for conn in held:
            conn.close()


def logged(conn):
    return conn.execute("SELECT count(*) FROM rate_limiter.debits").fetchone()[0]


CALLS = """CREATE PROCEDURE public.calls(keys int, each int, rollback_every int) LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 0 .. keys * each - 1 LOOP
        PERFORM rate_limiter.rate_limit('many', 'k' || (i % keys), 1);
        IF rollback_every > 0 AND i % rollback_every = 0 THEN ROLLBACK; ELSE COMMIT; END IF;
    END LOOP;
END $$"""


def test_the_log_stays_bounded_with_more_keys_in_use_than_entries(database_name):
    """20 keys round robin, more than this database's share of the 16 entries: every call
    loads its key again. Each key's log is still folded once it holds 1,000 debits."""
    with psycopg.connect(dbname=database_name, autocommit=True) as c:
        c.execute("SET synchronous_commit = off")
        c.execute(f"SET rate_limiter.fake_now = '{NOW}'")
        define(c, "many", rate=1, period="1000 days", capacity=1_000_000, hot=True)
        c.execute(CALLS)
        c.execute("CALL public.calls(20, 1500, 0)")  # 30,000 debits committed
        assert logged(c) <= 20 * 1001, "at most a fold's worth per key"
        # Nothing was lost in the folds: 1,500 taken from each key.
        assert c.execute("SELECT remaining FROM rate_limiter.check_rate_limit('many', 'k7', 0)").fetchone() == (998_500,)


def test_the_log_stays_bounded_when_the_folding_transactions_roll_back(database_name):
    """Every other transaction rolls back, the one that starts each fold among them."""
    with psycopg.connect(dbname=database_name, autocommit=True) as c:
        c.execute("SET synchronous_commit = off")
        c.execute(f"SET rate_limiter.fake_now = '{NOW}'")
        define(c, "many", rate=1, period="1000 days", capacity=1_000_000, hot=True)
        c.execute(CALLS)
        c.execute("CALL public.calls(1, 4000, 2)")  # 2,000 committed, alternating
        assert logged(c) <= 1001
        assert c.execute("SELECT remaining FROM rate_limiter.check_rate_limit('many', 'k0', 0)").fetchone() == (998_000,)


@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
def test_callers_that_read_with_one_snapshot_fold_too(database_name, isolation):
    """0.4.0 never folded for callers at REPEATABLE READ or SERIALIZABLE: a key only they
    used kept every debit. A fold reads the newest base row whatever the caller's snapshot,
    here one taken before another session's fold rewrote that row."""
    with psycopg.connect(dbname=database_name, autocommit=True) as a, psycopg.connect(dbname=database_name, autocommit=True) as b:
        for c in (a, b):
            c.execute("SET synchronous_commit = off")
            c.execute(f"SET rate_limiter.fake_now = '{NOW}'")
        define(a, "many", rate=1, period="1000 days", capacity=1_000_000, hot=True)
        a.execute(CALLS)
        a.execute(f"SET default_transaction_isolation = '{isolation}'")
        a.execute("CALL public.calls(1, 2500, 0)")  # folds start at the 1,001st and 2,001st call
        assert logged(a) <= 1001, "at most a fold's worth"
        # Calls 2,501 to 3,000 from b; then a's snapshot; then b's calls to 4,000, whose fold
        # at the 3,001st rewrites the base row after that snapshot.
        b.execute("CALL public.calls(1, 500, 0)")
        a.execute("BEGIN")
        a.execute("SELECT count(*) FROM rate_limiter.debits")
        b.execute("CALL public.calls(1, 1000, 0)")
        # a's call is the 4,001st: it folds the 1,000 before it into the row b rewrote.
        assert a.execute("SELECT ok FROM rate_limiter.rate_limit('many', 'k0', 1)").fetchone() == (True,)
        a.execute("COMMIT")
        assert logged(a) == 1, "only a's own debit, still in flight when it folded"
        assert a.execute("SELECT value FROM rate_limiter.state WHERE name = 'many'").fetchone() == (996_000,), \
            "the base row holds the 4,000 folded debits"
        assert a.execute("SELECT remaining FROM rate_limiter.check_rate_limit('many', 'k0', 0)").fetchone() == (996_000 - 1,)


def test_a_load_reads_only_its_keys_rows_and_can_be_cancelled(database_name):
    with psycopg.connect(dbname=database_name, autocommit=True) as c:
        c.execute(f"SET rate_limiter.fake_now = '{NOW}'")
        define(c, "big", rate=10, period="1 hour", hot=True)
        # A million debits of one key, as a role calling for minutes would leave them.
        c.execute(f"INSERT INTO rate_limiter.debits SELECT g, 'big', 'k', '{NOW}', 0.000001 "
                  "FROM generate_series(1, 1000000) g")  # no escrow of it loaded yet
        c.execute("BEGIN")
        assert c.execute("SELECT ok FROM rate_limiter.rate_limit('big', 'other key')").fetchone() == (True,)
        fetched = c.execute("SELECT idx_tup_fetch FROM pg_stat_xact_user_tables "
                            "WHERE relid = 'rate_limiter.debits'::regclass").fetchone()[0]
        c.execute("COMMIT")
        assert fetched <= 1, "the other key's load read none of the million rows"
        # Loading the big key holds no lock that keeps interrupts off: it can be cancelled.
        c.execute("SET statement_timeout = '10ms'")
        with pytest.raises(errors.QueryCanceled):
            c.execute("SELECT ok FROM rate_limiter.rate_limit('big', 'k')")
        c.execute("RESET statement_timeout")
        ok, remaining = c.execute("SELECT ok, remaining FROM rate_limiter.rate_limit('big', 'k')").fetchone()
        assert ok and remaining == pytest.approx(8), "the million debits took one token"


def test_a_subscriber_of_every_table_follows_a_publishers_move_out_of_the_mode(clusters):
    """Where the log and the state are replicated too, the publisher's fold arrives as its own
    changes: the subscriber's trigger must not fold again (its base row would collide)."""
    publisher = clusters("hot_primary", PORTS["hot_primary"], [*PRELOADED, "-c wal_level=logical"]).init().start()
    subscriber = clusters("hot_sub", PORTS["hot_subscriber"], PRELOADED).init().start()
    for cluster in (publisher, subscriber):
        with cluster.connect() as c:
            c.execute("CREATE EXTENSION rate_limiter")
            c.execute(f"ALTER DATABASE postgres SET rate_limiter.fake_now = '{NOW}'")
    reads = ["SELECT ok, remaining FROM rate_limiter.check_rate_limit('all', 'k', 0)",
             "SELECT count(*) FROM rate_limiter.debits", "SELECT hot FROM rate_limiter.limits WHERE name = 'all'"]
    with publisher.connect() as p, subscriber.connect() as s:
        p.execute("CREATE PUBLICATION everything FOR ALL TABLES")
        s.execute(f"CREATE SUBSCRIPTION s CONNECTION '{publisher.conninfo()}' PUBLICATION everything")
        # Synchronized first, so that what follows arrives through the apply worker.
        wait_for(lambda: s.execute("SELECT count(*) FILTER (WHERE srsubstate <> 'r') FROM pg_subscription_rel").fetchone()
                 == (0,), "the initial copy")
        define(p, "all", rate=10, period="1 hour", hot=True)
        assert admitted(p, "all", "k", 3) == 3  # no base row yet: three debits in the log
        wait_for(lambda: s.execute("SELECT count(*) FROM rate_limiter.debits").fetchone() == (3,), "the debits")
        define(p, "all", rate=10, period="1 hour", hot=False)  # folds: the base row is inserted
        expected = [p.execute(sql).fetchone() for sql in reads]
        assert expected == [(True, 7), (0,), (False,)]

        def seen():
            try:
                return [s.execute(sql).fetchone() for sql in reads]
            except psycopg.errors.UndefinedObject:  # the limit has not arrived yet
                return None

        wait_for(lambda: seen() == expected, "the subscriber to apply the fold", timeout=30,
                 detail=lambda: subscriber.log()[-1500:])
        s.execute("DROP SUBSCRIPTION s")


def test_concurrent_sessions_keep_the_ledger_through_resets_mode_switches_and_evictions(database_name):
    """The oracle's concurrent form: 8 sessions, some at REPEATABLE READ, take from one key of
    capacity 150 (no refill) with commits, rollbacks and savepoint rollbacks, each grant
    written to a ledger in its own transaction, while another session resets the key, moves
    the limit out of the hot mode and back, and evicts its escrow (the takers pause, so that
    it is idle and given away). Between two resets, what the ledger holds never exceeds the
    capacity, and after the last one it is exactly what the limit says it used."""
    capacity = 150
    with psycopg.connect(dbname=database_name, autocommit=True) as admin:
        admin.execute(f"SET rate_limiter.fake_now = '{NOW}'")
        admin.execute("CREATE TABLE ledger (id bigserial, granted float8, reset boolean DEFAULT false)")
        define(admin, "c", rate=1, period="1000 days", capacity=capacity, hot=True)
        define(admin, "evictor", rate=1, period="1 hour", hot=True)
    stop, running = threading.Event(), threading.Event()
    running.set()
    evicted = []

    def work(i):
        rng = seeded(i)
        with psycopg.connect(dbname=database_name, autocommit=True) as conn:
            conn.execute(f"SET rate_limiter.fake_now = '{NOW}'")
            if i % 3 == 0:
                conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            while not stop.is_set():
                running.wait()
                r = rng.random()
                take = "INSERT INTO ledger (granted) SELECT granted FROM rate_limiter.rate_limit('c', 'k', %s)"
                try:
                    with conn.transaction(force_rollback=r < 0.2):
                        if 0.2 <= r < 0.35:
                            with conn.transaction(force_rollback=True):
                                conn.execute(take, (rng.choice([1, 2]),))
                        conn.execute(take, (rng.choice([1, 1, 2, 3]),))
                        if r > 0.9:
                            time.sleep(0.002)
                except errors.SerializationFailure:
                    pass  # a row-based key at REPEATABLE READ, while the limit is out of the mode

    def disrupt():
        rng = seeded(99)
        with psycopg.connect(dbname=database_name, autocommit=True) as conn:
            conn.execute(f"SET rate_limiter.fake_now = '{NOW}'")
            hot, drained = True, False
            for what in ["evict", "reset", "switch", "evict", "switch", "reset", "evict"] + \
                    [rng.choice(["reset", "switch", "evict"]) for _ in range(8)]:
                time.sleep(0.3)
                if what == "reset" and not drained:
                    # However slow the machine, one epoch shows the bound reached.
                    wait_for(lambda: conn.execute("SELECT sum(granted) FROM ledger").fetchone()[0] == capacity,
                             "the takers to run the key down")
                    drained = True
                if what == "reset":
                    with conn.transaction():
                        conn.execute("SELECT rate_limiter.reset_rate_limit('c', 'k')")
                        # Drawn once no call before the reset is in flight (a hot reset holds
                        # calls off, a row-based one waits on the row): every grant after it
                        # comes later.
                        conn.execute("INSERT INTO ledger (granted, reset) VALUES (0, true)")
                elif what == "switch":
                    hot = not hot
                    define(conn, "c", rate=1, period="1000 days", capacity=capacity, hot=hot)
                elif hot:
                    running.clear()
                    time.sleep(0.1)  # the takers' transactions end
                    for k in range(16):
                        conn.execute("SELECT rate_limiter.rate_limit('evictor', %s, 0)", (f"e{k}",))
                    evicted.append(True)
                    running.set()
            define(conn, "c", rate=1, period="1000 days", capacity=capacity, hot=True)

    def session(i):
        if i < 8:
            return work(i)
        try:
            disrupt()
        finally:
            running.set()
            stop.set()

    in_sessions(9, session)
    assert evicted, "the escrow was evicted under load"
    with psycopg.connect(dbname=database_name, autocommit=True) as c:
        c.execute(f"SET rate_limiter.fake_now = '{NOW}'")
        epochs = c.execute("SELECT sum(granted) FROM (SELECT granted, count(*) FILTER (WHERE reset) "
                           "OVER (ORDER BY id) AS epoch FROM ledger) l GROUP BY epoch ORDER BY epoch").fetchall()
        assert len(epochs) > 1, "a reset ran"
        assert all(used <= capacity for (used,) in epochs), f"more than {capacity} between two resets: {epochs}"
        assert any(used == capacity for (used,) in epochs[:-1]), f"the load ran the key down: {epochs}"
        left = c.execute("SELECT remaining FROM rate_limiter.check_rate_limit('c', 'k', 0)").fetchone()[0]
        assert epochs[-1][0] + left == capacity


def test_a_hot_limit_from_before_the_bounds_can_be_defined_again_and_then_dropped(database_name):
    """A hot limit that 0.4.0 took (a rolling window of 178 million years) with debits in its
    log: 0.5.0 refuses its config, and with it a fold under it. Dropping it is refused with a
    hint while its debits are unfolded; defining it again, hot, within the bounds counts them
    under the new config; then it can be dropped."""
    with psycopg.connect(dbname=database_name, autocommit=True) as c:
        c.execute(f"SET rate_limiter.fake_now = '{NOW}'")
        c.execute("INSERT INTO rate_limiter.limits (name, kind, rate, period, hot) "
                  "VALUES ('ages', 'rolling window', 5, '178000000 years', true)")
        c.execute(f"INSERT INTO rate_limiter.debits VALUES (1, 'ages', 'k', '{NOW}', 3)")  # as 0.4.0 logged
        with pytest.raises(errors.InvalidParameterValue):
            c.execute("SELECT ok FROM rate_limiter.rate_limit('ages', 'k')")
        with pytest.raises(errors.InvalidParameterValue) as refused:
            c.execute("DELETE FROM rate_limiter.limits WHERE name = 'ages'")
        assert "define it again" in str(refused.value) and refused.value.diag.message_hint
        define(c, "ages", "rolling window", rate=5, period="36525 days", hot=True)
        assert c.execute("SELECT remaining FROM rate_limiter.check_rate_limit('ages', 'k', 0)").fetchone() == (2,)
        assert admitted(c, "ages", "k") == 2, "the 3 logged under the old config still count"
        c.execute("DELETE FROM rate_limiter.limits WHERE name = 'ages'")
        assert logged(c) == 0, "folded on the way out"
