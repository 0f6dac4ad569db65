"""Multi-session tests against the throwaway cluster scripts/test.sh starts.

Each test uses its own limit names, so they do not interfere. Connections come from the
PG* environment the test command sets (socket in /tmp, user postgres, a fresh database).
"""

import json
import threading
import time
import uuid

import psycopg
import pytest
from psycopg import errors, sql

from properties import seeded
from calls import define, hammer, limit
from clusters import connect, on_assert_server, wait_for
from together import in_sessions


def waiting_on_lock(conn, pid):
    return conn.execute(
        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()[0]


def test_second_consumer_waits_for_the_row_lock_until_commit(test_conn, name):
    define(test_conn, name, rate=10)
    limit(test_conn, name, "k")  # the row exists
    with connect(autocommit=False) as a, connect() as b:
        assert limit(a, name, "k")[0]
        result = {}
        t = threading.Thread(target=lambda: result.setdefault("b", limit(b, name, "k")))
        t.start()
        deadline = time.time() + 5
        while not waiting_on_lock(test_conn, b.info.backend_pid):
            assert time.time() < deadline, "b never queued behind a's row lock"
            time.sleep(0.01)
        assert t.is_alive()
        a.commit()
        t.join(5)
        assert result["b"][0] is True
        assert result["b"][2] == pytest.approx(7, abs=0.01)  # 10 - 1 (setup) - 1 (a) - 1 (b), read after a committed


def test_denied_call_takes_no_lock_and_writes_nothing(test_conn, name):
    define(test_conn, name, rate=1)
    assert limit(test_conn, name, "k")[0]
    with connect(autocommit=False) as holder, connect() as b:
        # Someone holds the row (as an in-flight consumer would).
        holder.execute("SELECT * FROM rate_limiter.state WHERE name = %s FOR UPDATE", (name,))
        b.execute("SET lock_timeout = '10s'")
        started = time.time()
        ok, retry_after, _, granted = limit(b, name, "k")
        assert (ok, granted) == (False, 0) and retry_after > 0
        # Had it tried to lock, lock_timeout would have raised after 10 s.
        assert time.time() - started < 5, "a call denied on committed state must not wait"
        holder.rollback()


def test_rollback_and_savepoint_rollback_give_tokens_back(test_conn, name):
    define(test_conn, name, rate=2)
    with connect(autocommit=False) as c:
        assert limit(c, name, "k", 2)[0]
        c.rollback()
        c.execute("SAVEPOINT s")
        assert limit(c, name, "k", 2)[0]
        assert not limit(c, name, "k")[0]
        c.execute("ROLLBACK TO SAVEPOINT s")
        assert limit(c, name, "k")[0]
        c.commit()
    assert limit(test_conn, name, "k")[2] == pytest.approx(0, abs=0.01)  # one left after the committed call, now taken


def test_read_only_transactions_can_check_but_not_consume(test_conn, name):
    define(test_conn, name, rate=5)
    with connect(autocommit=False) as c:
        c.execute("BEGIN READ ONLY")
        row = c.execute("SELECT ok, remaining FROM rate_limiter.check_rate_limit(%s, 'k')", (name,)).fetchone()
        assert row == (True, 4)
        with pytest.raises(errors.ReadOnlySqlTransaction):
            limit(c, name, "k")
        c.rollback()


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_conflicting_consumption_at_higher_isolation_is_40001(test_conn, name, level):
    define(test_conn, name, rate=10)
    limit(test_conn, name, "k")
    with connect(autocommit=False) as a, connect(autocommit=False) as b:
        for c in (a, b):
            c.execute(f"BEGIN ISOLATION LEVEL {level}")
            c.execute("SELECT 1 FROM rate_limiter.rate_limit_value(%s, 'k')", (name,))  # take the snapshot
        assert limit(a, name, "k")[0]
        a.commit()
        with pytest.raises(errors.SerializationFailure):
            limit(b, name, "k")
        b.rollback()


@on_assert_server
def test_a_wait_longer_than_the_servers_longest_wait_ends_at_statement_timeout(test_cluster, database_name, name):
    """A wait of more than 2^31 ms (about 25 days) is several waits on the latch: one was asked
    for, and the server asserts its bound (found by the fuzzer on the assert-enabled server)."""
    with test_cluster.connect(database_name) as c:
        define(c, name, rate=1, period="100 days")
        assert limit(c, name, "k")[0]
        c.execute("SET statement_timeout = '300ms'")
        with pytest.raises(errors.QueryCanceled):
            c.execute("SELECT ok FROM rate_limiter.wait_rate_limit(%s, 'k', timeout => '200 days')", (name,))
        c.execute("RESET statement_timeout")
        assert c.execute("SELECT 1").fetchone() == (1,)


def test_concurrent_sessions_never_exceed_the_bound_exactly(test_conn, name):
    # The clock is pinned, so nothing flows in: the bound is the capacity, exactly.
    define(test_conn, name, rate=1000, period="1 hour")
    total = hammer(name, sessions=8, calls=500, fake_now="2026-01-01 00:00:00+00")
    assert total == 1000


def test_concurrent_sessions_on_a_sliding_window_admit_exactly_what_the_weight_leaves(test_conn, name):
    define(test_conn, name, kind="sliding window", rate=1000, period="1 hour", start="2026-01-01 00:00:00+00")
    test_conn.execute("SET rate_limiter.fake_now = '2026-01-01 00:30:00+00'")
    assert limit(test_conn, name, "hot", count=600)[0]
    # A quarter into the next window the 600 still weigh 450: exactly 550 are left.
    total = hammer(name, sessions=8, calls=100, fake_now="2026-01-01 01:15:00+00")
    assert total == 550


def test_concurrent_sessions_on_a_rolling_window_admit_exactly_what_the_period_leaves(test_conn, name):
    define(test_conn, name, kind="rolling window", rate=500, period="1 hour", start="2026-01-01 00:00:00+00", buckets=10)
    test_conn.execute("SET rate_limiter.fake_now = '2026-01-01 00:00:00+00'")
    assert limit(test_conn, name, "hot", count=200)[0]
    # The 200 count until the end of their 6-minute cell plus an hour.
    assert hammer(name, sessions=8, calls=60, fake_now="2026-01-01 01:05:59+00") == 300
    assert hammer(name, sessions=8, calls=60, fake_now="2026-01-01 01:06:00+00") == 200


def test_rate_limit_all_in_reversed_orders_never_deadlocks_and_holds_every_bound(test_conn, name):
    a, b = name + "_a", name + "_b"
    define(test_conn, a, rate=100, period="1 hour")
    define(test_conn, b, rate=150, period="1 hour")
    orders = [json.dumps([{"name": a, "key": "k"}, {"name": b, "key": "k"}]),
              json.dumps([{"name": b, "key": "k"}, {"name": a, "key": "k"}])]

    def session(i):
        got = 0
        with connect(autocommit=False) as c:
            c.execute("SET rate_limiter.fake_now = '2026-01-01 00:00:00+00'")
            for _ in range(40):
                got += c.execute("SELECT granted FROM rate_limiter.rate_limit_all(%s)", (orders[i % 2],)).fetchone()[0]
                time.sleep(0.001)  # hold both rows a moment, so that orders cross
                c.commit()
        return got

    granted = in_sessions(8, session)  # any error, such as a 40P01, fails here
    assert sum(granted) == 100, "a binds; b gave no more than a allowed"
    assert test_conn.execute("SELECT value FROM rate_limiter.state WHERE name = %s", (b,)).fetchone() == (50,)


def test_concurrent_partial_calls_take_exactly_the_capacity(test_conn, name):
    define(test_conn, name, rate=1000, period="1 hour", mode="partial")
    # 1000 is not a multiple of 3: one call gets the last token alone.
    total = hammer(name, sessions=8, calls=60, count=3, fake_now="2026-01-01 00:00:00+00")
    assert total == 1000


def test_concurrent_penalized_calls_keep_the_debt_within_capacity(test_conn, name):
    define(test_conn, name, rate=100, period="1 hour", mode="penalize")
    total = hammer(name, sessions=8, calls=50, fake_now="2026-01-01 00:00:00+00")
    assert total == 100, "denied calls are counted, never granted"
    assert test_conn.execute("SELECT value FROM rate_limiter.state WHERE name = %s", (name,)).fetchone() == (-100,)


def test_concurrent_sessions_real_clock_stay_within_capacity_plus_inflow(test_conn, name):
    define(test_conn, name, rate=50, period="1 second", capacity=100)
    started = time.time()
    total = hammer(name, sessions=8, calls=300)
    elapsed = time.time() - started
    assert 100 <= total <= 100 + 50 * elapsed + 1


def test_throws_reaches_the_driver_as_rl429(test_conn, name):
    define(test_conn, name, rate=1)
    limit(test_conn, name, "k")
    with pytest.raises(psycopg.Error) as caught:
        limit(test_conn, name, "k", throws=True)
    assert caught.value.sqlstate == "RL429"
    detail = json.loads(caught.value.diag.message_detail)
    assert detail["kind"] == "RateLimited" and detail["name"] == name and detail["key"] == "k"
    assert detail["retryAfter"] > 0


@pytest.mark.parametrize("durable", [True, False])
def test_rate_limit_ok_answers_as_rate_limits_ok_call_for_call(test_conn, name, durable):
    """rate_limit_ok against its oracle, a twin limit called through rate_limit: the same ok at
    each call of a run that goes past the limit and back, the same tokens given back by a
    rolled-back savepoint, RL429 with throws, and the same statistics."""
    twin = name + "_twin"
    for n in (name, twin):
        define(test_conn, n, rate=3, period="1 minute", durable=durable)
    test_conn.execute("SET rate_limiter.fake_now = '2026-01-01 00:00:00+00'")
    cheap = lambda count, **kw: test_conn.execute(
        "SELECT rate_limiter.rate_limit_ok(%s, 'k', %s, reserve => %s)", (name, count, kw.get("reserve", False))).fetchone()[0]
    oracle = lambda count, **kw: test_conn.execute(
        "SELECT (rate_limiter.rate_limit(%s, 'k', %s, reserve => %s)).ok", (twin, count, kw.get("reserve", False))).fetchone()[0]
    remaining = lambda: [test_conn.execute("SELECT remaining FROM rate_limiter.check_rate_limit(%s, 'k')", (n,)).fetchone()[0]
                         for n in (name, twin)]
    answers = []
    for at, count in (("00:00:00", 1), ("00:00:00", 2), ("00:00:00", 1), ("00:00:10", 1), ("00:00:30", 0), ("00:01:00", 3)):
        test_conn.execute(f"SET rate_limiter.fake_now = '2026-01-01 {at}+00'")
        answers.append((cheap(count), oracle(count)))
    assert [a for a, _ in answers] == [b for _, b in answers] == [True, True, False, False, True, True]
    # A rolled-back savepoint gives back what the call took, as it does rate_limit's.
    test_conn.execute("SET rate_limiter.fake_now = '2026-01-01 00:05:00+00'")
    with connect(autocommit=False) as c:
        c.execute("SET rate_limiter.fake_now = '2026-01-01 00:05:00+00'")
        c.execute("SAVEPOINT s")
        assert c.execute("SELECT rate_limiter.rate_limit_ok(%s, 'k', 2)", (name,)).fetchone()[0]
        assert c.execute("SELECT (rate_limiter.rate_limit(%s, 'k', 2)).ok", (twin,)).fetchone()[0]
        c.execute("ROLLBACK TO SAVEPOINT s")
        c.commit()
    assert remaining() == [2, 2]  # of 3, after the 1 a check counts
    assert (cheap(3), oracle(3)) == (True, True)
    # A denial with throws raises RL429 as rate_limit's does, naming its own limit.
    for fn, n in (("rate_limit_ok(%s, 'k', throws => true)", name), ("rate_limit(%s, 'k', throws => true)", twin)):
        with pytest.raises(psycopg.Error) as caught:
            test_conn.execute(f"SELECT rate_limiter.{fn}", (n,))
        assert caught.value.sqlstate == "RL429"
        assert json.loads(caught.value.diag.message_detail) == {"kind": "RateLimited", "name": n, "key": "k", "retryAfter": 20000}
    # Counted in the statistics as the call it is.
    stats = "SELECT calls, allowed, denied, tokens_granted FROM rate_limiter.stats WHERE name = %s"
    assert test_conn.execute(stats, (name,)).fetchone() == test_conn.execute(stats, (twin,)).fetchone() == (9, 6, 3, 11)


def test_a_role_with_only_execute_cannot_touch_the_tables(test_conn, name):
    role = "app_" + uuid.uuid4().hex[:8]
    test_conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    test_conn.execute(sql.SQL("GRANT USAGE ON SCHEMA rate_limiter TO {}").format(sql.Identifier(role)))
    test_conn.execute(
        sql.SQL(
            "GRANT EXECUTE ON FUNCTION rate_limiter.rate_limit, rate_limiter.check_rate_limit TO {}"
        ).format(sql.Identifier(role))
    )
    test_conn.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
        sql.Identifier(test_conn.info.dbname), sql.Identifier(role)))
    define(test_conn, name, rate=1)
    try:
        with connect(user=role) as app:
            # A hostile search_path: its own '=' that says every text equals every other.
            app.execute("CREATE SCHEMA IF NOT EXISTS evil")
            app.execute("CREATE FUNCTION evil.eq(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true'")
            app.execute("CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.eq)")
            app.execute("SET search_path = evil, pg_catalog")
            assert limit(app, name, "a")[0]
            assert limit(app, name, "b")[0], "keys stay apart under the hostile operator"
            assert not limit(app, name, "a")[0]
            for statement in (
                "SELECT * FROM rate_limiter.state",
                "SELECT * FROM rate_limiter.limits",
                "UPDATE rate_limiter.state SET value = 100",
                "INSERT INTO rate_limiter.limits (name, kind, rate, period) VALUES ('x', 'token bucket', 1, '1 s')",
            ):
                with pytest.raises(errors.InsufficientPrivilege):
                    app.execute(statement)
            with pytest.raises(errors.InsufficientPrivilege):
                app.execute("SELECT rate_limiter.reset_rate_limit(%s, 'a')", (name,))
            with pytest.raises(errors.InsufficientPrivilege):
                app.execute("SELECT rate_limiter.define(%s, 'token bucket', 1000, '1 second')", (name,))
            with pytest.raises(errors.InsufficientPrivilege):
                app.execute("SELECT * FROM rate_limiter.rate_limit_value(%s, 'a')", (name,))
            with pytest.raises(errors.InsufficientPrivilege):
                app.execute("SET rate_limiter.fake_now = '2030-01-01'")
    finally:
        test_conn.execute("DROP SCHEMA IF EXISTS evil CASCADE")
        test_conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM {}").format(
            sql.Identifier(test_conn.info.dbname), sql.Identifier(role)))
        test_conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        test_conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@on_assert_server
def test_plpgsql_function_and_procedure_callers(test_conn, name):
    define(test_conn, name, rate=2)
    test_conn.execute(
        """
        CREATE OR REPLACE FUNCTION send_message(p_user text) RETURNS text LANGUAGE plpgsql AS $$
        DECLARE d rate_limiter.decision;
        BEGIN
            d := rate_limiter.rate_limit(%s, key => p_user);
            IF NOT d.ok THEN
                RETURN 'wait';
            END IF;
            RETURN 'sent';
        END $$
        """.replace("%s", "'" + name + "'")
    )
    got = [test_conn.execute("SELECT send_message('u')").fetchone()[0] for _ in range(3)]
    assert got == ["sent", "sent", "wait"]


def test_sharded_global_limit_under_16_sessions_no_deadlock_within_bound(test_conn, name):
    # 16 sessions each hold their transaction open a few ms after the call. The clock is
    # pinned, so the bound is the capacity exactly; sharding may deny a little early (two
    # looked-at shards empty while others are not) but must never grant more.
    define(test_conn, name, rate=400, period="1 hour", shards=16)
    # Any error, such as a 40P01 deadlock, fails the test.
    total = hammer(name, sessions=16, calls=40, fake_now="2026-01-01 00:00:00+00", key=None, hold=0.003)
    assert 0.9 * 400 <= total <= 400
    remaining = test_conn.execute(
        "SELECT coalesce(sum(value), 0) FROM rate_limiter.state WHERE name = %s", (name,)
    ).fetchone()[0]
    fresh_shards = 16 - test_conn.execute(
        "SELECT count(*) FROM rate_limiter.state WHERE name = %s", (name,)
    ).fetchone()[0]
    assert total + remaining + fresh_shards * 25 == pytest.approx(400)


def test_sharded_calls_do_not_queue_behind_a_held_shard(test_conn, name):
    define(test_conn, name, rate=1000, period="1 hour", shards=8)
    # Rows exist already (a first-ever insert is waited for, like any unique insert).
    test_conn.execute(
        "INSERT INTO rate_limiter.state SELECT %s, NULL, s, 125, now(), 'infinity' FROM generate_series(0, 7) s", (name,)
    )
    with connect(autocommit=False) as holder, connect() as b:
        assert limit(holder, name)[0]  # holds one shard's row lock until it ends
        b.execute("SET lock_timeout = '1s'")
        for _ in range(20):
            assert limit(b, name)[0]  # served by unlocked shards, never waits
        holder.rollback()


def test_a_changed_limit_reaches_sessions_that_cached_it(test_conn, name):
    define(test_conn, name, rate=1)
    with connect() as other:
        assert limit(other, name, "k")[0]
        assert not limit(other, name, "k")[0]  # its backend now caches rate 1
        define(test_conn, name, rate=1, capacity=5)
        assert limit(other, name, "k5", count=5)[0], "the next transaction sees capacity 5"
        test_conn.execute("UPDATE rate_limiter.limits SET capacity = 1 WHERE name = %s", (name,))
        with pytest.raises(errors.InvalidParameterValue):
            limit(other, name, "k2", count=2)  # more than capacity 1
        test_conn.execute("TRUNCATE rate_limiter.limits")
        with pytest.raises(errors.UndefinedObject):
            limit(other, name, "k")
        with connect(autocommit=False) as tx:
            define(tx, name, rate=3)
            assert limit(tx, name, "k3", count=3)[0], "its own uncommitted definition"
            with pytest.raises(errors.UndefinedObject):
                limit(other, name, "k")  # not committed yet
            tx.rollback()
        with pytest.raises(errors.UndefinedObject):
            limit(other, name, "k")


def test_a_block_reaches_sessions_that_saw_none(test_conn, name):
    define(test_conn, name, rate=100)
    with connect() as other:
        assert limit(other, name, "k")[0]  # its backend now knows there are no blocks
        test_conn.execute("SELECT rate_limiter.block(%s, 'k', now() + interval '1 hour')", (name,))
        row = other.execute("SELECT ok, reason FROM rate_limiter.rate_limit(%s, 'k')", (name,)).fetchone()
        assert row == (False, "blocked")
        test_conn.execute("SELECT rate_limiter.unblock(%s, 'k')", (name,))
        assert limit(other, name, "k")[0]


def wait(conn, name, key="k", timeout="30 seconds"):
    return conn.execute(
        "SELECT ok, granted, reason FROM rate_limiter.wait_rate_limit(%s, %s, timeout => %s::interval)",
        (name, key, timeout),
    ).fetchone()


def test_wait_rate_limit_sleeps_until_retry_after_then_takes(test_conn, name):
    define(test_conn, name, rate=10, period="1 second", capacity=1)
    assert limit(test_conn, name, "k")[0]
    started = time.monotonic()
    assert wait(test_conn, name) == (True, 1, None)
    assert time.monotonic() - started >= 0.05, "it slept until the token came back"


def test_wait_rate_limit_returns_the_denial_when_the_wait_would_pass_the_timeout(test_conn, name):
    define(test_conn, name, rate=1, period="1 hour")
    assert limit(test_conn, name, "k")[0]
    assert wait(test_conn, name, timeout="1 second") == (False, 0, "exhausted"), "did not wait"
    # Under a pinned clock the token never comes back: it waits once (100 ms), then times out.
    define(test_conn, name + "_pinned", rate=10, period="1 second", capacity=1)
    test_conn.execute("SET rate_limiter.fake_now = '2026-01-01 00:00:00+00'")
    assert limit(test_conn, name + "_pinned", "k")[0]
    assert wait(test_conn, name + "_pinned", timeout="150 milliseconds") == (False, 0, "timeout")


def test_statement_timeout_ends_a_waiting_call(test_conn, name):
    define(test_conn, name, rate=1, period="1 hour")
    assert limit(test_conn, name, "k")[0]
    test_conn.execute("SET statement_timeout = '200ms'")
    with pytest.raises(errors.QueryCanceled):
        wait(test_conn, name, timeout="2 hours")


def test_a_waiting_call_holds_no_row_lock(test_conn, name):
    define(test_conn, name, rate=10, period="1 second", capacity=1)
    result = []
    with connect(autocommit=False) as waiter:
        waiter.execute("SET rate_limiter.fake_now = '2026-01-01 00:00:00+00'")
        assert limit(waiter, name, "k")[0]
        waiter.commit()
        thread = threading.Thread(target=lambda: result.append(wait(waiter, name, timeout="5 seconds")))
        thread.start()
        time.sleep(0.3)  # the waiter is asleep between tries
        test_conn.execute("SET lock_timeout = '100ms'")
        test_conn.execute("SELECT rate_limiter.reset_rate_limit(%s, 'k')", (name,))  # needs the row's lock
        thread.join()
        waiter.commit()
    assert result == [(True, 1, None)], "the reset refilled it, and the next try took it"


@pytest.mark.parametrize("policy", ["deny", "allow"])
def test_lock_timeout_answers_by_policy_without_aborting_or_leaving_a_lock(test_conn, name, policy):
    define(test_conn, name, rate=100, lock_timeout="200 milliseconds", on_lock_timeout=policy)
    with connect(autocommit=False) as holder, connect(autocommit=False) as caller, connect() as third:
        assert limit(holder, name, "k")[0]  # holds the row until it ends
        row = caller.execute(
            "SELECT ok, granted, reason, retry_after FROM rate_limiter.rate_limit(%s, 'k')", (name,)
        ).fetchone()
        expected = (False, 0, "lock_timeout", 200) if policy == "deny" else (True, 0, "lock_timeout", None)
        assert row == expected
        assert caller.execute("SELECT 1").fetchone() == (1,), "the caller's transaction goes on"
        holder.commit()
        # The caller, still in its transaction, holds no lock on the row.
        third.execute("SET lock_timeout = '100ms'")
        third.execute("SELECT rate_limiter.reset_rate_limit(%s, 'k')", (name,))
        caller.commit()
    with pytest.raises(errors.FeatureNotSupported):
        define(test_conn, name, rate=100, lock_timeout="1 second", shards=2)


def test_a_credit_waits_for_the_row_whatever_the_lock_timeout(test_conn, name):
    """A give-back is never dropped: with the limit's lock_timeout long passed, a credit is
    still queued for the row, and gives back once the holder commits."""
    define(test_conn, name, rate=100, lock_timeout="100 milliseconds")
    pin = "SET rate_limiter.fake_now = '2030-01-01'"
    result = []
    test_conn.execute(pin)
    assert limit(test_conn, name, "k", 5)[0]  # committed: there is something to give back
    with connect(autocommit=False) as holder, connect(autocommit=False) as giver:
        holder.execute(pin)
        giver.execute(pin)
        assert limit(holder, name, "k", 1)[0]  # holds the row until it ends
        pid = giver.info.backend_pid
        thread = threading.Thread(
            target=lambda: result.append(giver.execute("SELECT granted FROM rate_limiter.credit(%s, 'k', 3)", (name,)).fetchone())
        )
        thread.start()
        wait_for(lambda: waiting_on_lock(test_conn, pid), "the giver to queue for the row")
        time.sleep(0.6)  # six lock_timeouts
        assert waiting_on_lock(test_conn, pid) and result == [], "still queued for the row"
        holder.commit()
        thread.join()
        giver.commit()
    assert result == [(-3,)]
    assert test_conn.execute("SELECT remaining FROM rate_limiter.check_rate_limit(%s, 'k', 0)", (name,)).fetchone() == (97,)


def test_sixteen_sessions_creating_one_fresh_key_see_no_error(test_conn, name):
    define(test_conn, name, rate=1000)
    assert hammer(name, sessions=16, calls=1, key="fresh") == 16
    assert test_conn.execute("SELECT count(*) FROM rate_limiter.state WHERE name = %s", (name,)).fetchone() == (1,)


def test_concurrent_takes_and_credits_stay_exact(test_conn, name):
    """8 sessions take and give back on one key at once, some of them rolling back: the state
    is exactly the capacity minus what committed takes took plus what committed credits gave.
    The clock is pinned, so nothing refills in between."""
    capacity = 1_000_000
    pin = "SET rate_limiter.fake_now = '2030-01-01'"
    test_conn.execute(pin)
    test_conn.execute(f"SELECT rate_limiter.define('{name}', 'token bucket', {capacity}, '1 hour')")
    test_conn.execute(f"SELECT rate_limiter.rate_limit('{name}', 'k', {capacity // 2})")  # room both ways

    def session(i):
        committed = 0.0
        rng = seeded(i)
        with connect(dbname=test_conn.info.dbname, autocommit=False) as c:
            c.execute(pin)
            c.commit()
            for _ in range(150):
                if rng.random() < 0.5:
                    call = f"SELECT granted FROM rate_limiter.rate_limit('{name}', 'k', {rng.randint(1, 50)})"
                else:
                    call = f"SELECT granted FROM rate_limiter.credit('{name}', 'k', {rng.randint(0, 50)})"
                (granted,) = c.execute(call).fetchone()
                if rng.random() < 0.2:
                    c.rollback()
                else:
                    c.commit()
                    committed += granted
        return committed

    net = sum(in_sessions(8, session))
    value = test_conn.execute(f"SELECT value FROM rate_limiter.state WHERE name = '{name}' AND key = 'k'").fetchone()[0]
    assert value == capacity - capacity // 2 - net
    assert net != 0, "the sessions took and gave"
