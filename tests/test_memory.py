"""Memory limits (durable => false, docs/memory-limits.md): counted in shared memory with no
row and no WAL, exact under concurrent sessions, given back on rollback, bounded in the
entries one database can take, and forgotten with their database or extension. Each check of
the bound is the ledger's (tests/ledger.py); the answers against a row-based limit are
tests/test_hot_oracle.py's, rollbacks and nested savepoints tests/test_hot.py's."""

import os
import re
import threading
import time

import pytest
from psycopg import errors

from properties import seeded
from calls import define, snapshot_keys
from clusters import PORTS, every_version, kill_9_under_load, wait_for
from ledger import NOW, granted, ledger, mixed_load, remaining, session
from together import in_background, in_sessions


@every_version
@pytest.mark.parametrize("keys, sessions", [(1, 8), (1, 32), (40, 8)])
def test_the_bound_is_exact_under_concurrent_sessions(test_cluster, database_name, keys, sessions):
    """Sessions mixing commits, rollbacks and savepoint rollbacks, on one key (32 sessions
    fill its ring: a call then waits for the oldest call in flight) and spread over 40."""
    with session(database_name, server=test_cluster) as admin:
        ledger(admin)
        define(admin, "mem_token", "token bucket", rate=300, period="1 day", durable=False)
        define(admin, "mem_fixed", "fixed window", rate=300, period="1 day", durable=False)
    for name in ("mem_token", "mem_fixed"):
        for k in range(keys):
            mixed_load(database_name, name, f"k{k}", sessions, 60 if keys == 1 else 4, server=test_cluster)
        with session(database_name, server=test_cluster) as c:
            for k in range(keys):
                used, left = granted(c, name, f"k{k}"), remaining(c, name, f"k{k}")
                assert used + left == 300, f"{name} k{k}: {used} granted and {left} left of 300"
            if keys == 1:
                assert remaining(c, name, "k0") < 10, "the load ran the limit down"
            assert c.execute("SELECT count(*) FROM rate_limiter.state WHERE name = %s", (name,)).fetchone() == (0,)


ALL = """SELECT ok, limited_by FROM rate_limiter.rate_limit_all(jsonb_build_array(
    jsonb_build_object('name', 'mem', 'key', %s::text, 'count', %s::float8),
    jsonb_build_object('name', 'dur', 'key', %s::text, 'count', %s::float8)))"""


def forgets(c):
    return c.execute("SELECT count(*) FROM rate_limiter.memory_snapshot WHERE kind = 'forget'").fetchone()[0]


def test_rate_limit_all_takes_memory_parts_with_durable_ones_all_or_none(database_name):
    """A denial by either part takes nothing from the other; both granted take from both,
    and a rollback gives the memory part back with the durable one."""
    with session(database_name) as c:
        define(c, "mem", rate=3, period="1 hour", durable=False)
        define(c, "dur", rate=5, period="1 hour")
        assert c.execute(ALL, ("k", 2, "k", 2)).fetchone() == (True, None)
        assert (remaining(c, "mem", "k"), remaining(c, "dur", "k")) == (1, 3)
        assert c.execute(ALL, ("k", 2, "k", 1)).fetchone() == (False, "mem")
        assert c.execute(ALL, ("k", 1, "k", 4)).fetchone() == (False, "dur")
        assert (remaining(c, "mem", "k"), remaining(c, "dur", "k")) == (1, 3), "a denial took nothing"
        c.execute("BEGIN")
        assert c.execute(ALL, ("k", 1, "k", 1)).fetchone() == (True, None)
        c.execute("ROLLBACK")
        assert (remaining(c, "mem", "k"), remaining(c, "dur", "k")) == (1, 3), "rolled back from both"


def test_rate_limit_all_under_concurrent_sessions_takes_every_part_or_none(test_cluster, database_name):
    """8 sessions call rate_limit_all on two memory limits and a durable one, the smaller
    memory limit running out first: a memory part denied after the other was taken gives
    it back, so each limit counts exactly the committed calls that were granted."""
    take = """INSERT INTO ledger SELECT 'all', 'k', ok::int, clock_timestamp()
              FROM rate_limiter.rate_limit_all(jsonb_build_array(
                  jsonb_build_object('name', 'big', 'key', 'k'), jsonb_build_object('name', 'small', 'key', 'k'),
                  jsonb_build_object('name', 'dur', 'key', 'k')))"""
    with session(database_name, server=test_cluster) as admin:
        ledger(admin)
        define(admin, "big", rate=1000, period="1 day", durable=False)
        define(admin, "small", rate=60, period="1 day", durable=False)
        define(admin, "dur", rate=1000, period="1 day")

    def body(i):
        rng = seeded(i)
        with session(database_name, server=test_cluster) as conn:
            for _ in range(30):
                with conn.transaction(force_rollback=rng.random() < 0.2):
                    conn.execute(take)
    in_sessions(8, body)
    with session(database_name, server=test_cluster) as c:
        granted_all = granted(c, "all", "k")
        assert granted_all == 60 - remaining(c, "small", "k") and remaining(c, "small", "k") < 10, "the small one ran out"
        assert 1000 - remaining(c, "big", "k") == granted_all, "the big memory limit counts the granted calls only"
        assert 1000 - remaining(c, "dur", "k") == granted_all, "the durable limit too"


def test_a_full_ring_waits_for_the_oldest_call_in_flight_whose_rollback_then_gives_back(database_name):
    """16 calls of one key in flight fill its entry's ring: the next call waits for the
    oldest one's transaction, as a durable call waits for the row, rather than fold it into
    the committed counts (where its rollback would give nothing back)."""
    holders = [session(database_name) for _ in range(16)]
    try:
        define(holders[0], "mem", rate=100, period="1 hour", durable=False)
        for h in holders:
            h.execute("BEGIN")
            h.execute("SELECT rate_limiter.rate_limit('mem', 'k')")
        with session(database_name) as late:
            late.execute("SET lock_timeout = '300ms'")
            with pytest.raises(errors.LockNotAvailable):
                late.execute("SELECT rate_limiter.rate_limit('mem', 'k')")
            holders[0].execute("ROLLBACK")
            assert late.execute("SELECT ok FROM rate_limiter.rate_limit('mem', 'k')").fetchone() == (True,)
            for h in holders[1:]:
                h.execute("ROLLBACK")
            assert remaining(late, "mem", "k") == 99, "every rollback gave its token back"
    finally:
        for h in holders:
            h.close()


def test_a_credit_counts_once_committed_and_a_rolled_back_one_never(database_name):
    with session(database_name) as a, session(database_name) as b:
        define(a, "mem", "fixed window", rate=3, period="1 hour", durable=False)
        a.execute("SELECT rate_limiter.rate_limit('mem', 'k', 3)")
        b.execute("BEGIN")
        assert b.execute("SELECT granted FROM rate_limiter.credit('mem', 'k', 2)").fetchone() == (-2,)
        assert a.execute("SELECT ok FROM rate_limiter.rate_limit('mem', 'k')").fetchone() == (False,), "in flight"
        b.execute("ROLLBACK")
        assert remaining(a, "mem", "k") == 0, "rolled back: nothing given"
        b.execute("SELECT rate_limiter.credit('mem', 'k', 2)")
        assert remaining(a, "mem", "k") == 2, "committed: 2 back"


def test_a_call_writes_no_wal_and_a_durable_one_does(database_name):
    with session(database_name) as c:
        define(c, "mem", rate=100, period="1 hour", durable=False)
        define(c, "row", rate=100, period="1 hour")
        for name, writes in (("mem", False), ("row", True)):
            # The second call: the first may set hint bits, which checksums WAL-log.
            c.execute("SELECT rate_limiter.rate_limit(%s, 'k')", (name,))
            plan = "\n".join(row for (row,) in c.execute(
                "EXPLAIN (ANALYZE, WAL, COSTS OFF, TIMING OFF, SUMMARY OFF) "
                "SELECT * FROM rate_limiter.rate_limit(%s, 'k')", (name,)))
            wal = re.search(r"WAL: records=(\d+)", plan)
            assert (wal is not None and int(wal.group(1)) > 0) == writes, f"{name}:\n{plan}"
        for begin in ("BEGIN", "BEGIN READ ONLY"):
            c.execute(begin)
            assert c.execute("SELECT ok FROM rate_limiter.rate_limit('mem', 'k')").fetchone() == (True,)
            assert c.execute("SELECT pg_current_xact_id_if_assigned()").fetchone() == (None,), "no transaction id"
            c.execute("COMMIT")


def test_a_change_waits_for_calls_in_flight_and_keeps_the_counts(database_name):
    with session(database_name) as a, session(database_name) as b:
        define(a, "mem", rate=10, period="1 hour", durable=False)
        a.execute("BEGIN")
        a.execute("SELECT rate_limiter.rate_limit('mem', 'k', 4)")
        b.execute("SET lock_timeout = '200ms'")
        with pytest.raises(errors.LockNotAvailable):
            define(b, "mem", rate=20, period="1 hour", durable=False)
        a.execute("COMMIT")
        define(b, "mem", rate=20, period="1 hour", durable=False)
        assert remaining(b, "mem", "k") == 16, "the 4 taken still count under the new rate: 16 of 20"
        b.execute("BEGIN")
        define(b, "mem", rate=30, period="1 hour", durable=False)
        with pytest.raises(errors.FeatureNotSupported):
            b.execute("SELECT rate_limiter.rate_limit('mem', 'k')")
        b.execute("ROLLBACK")
        b.execute("SELECT rate_limiter.reset_rate_limit('mem', 'k')")
        assert remaining(b, "mem", "k") == 20
        a.execute("SELECT rate_limiter.rate_limit('mem', 'k', 3)")
        a.execute("DELETE FROM rate_limiter.limits WHERE name = 'mem'")
        define(a, "mem", rate=10, period="1 hour", durable=False)
        assert remaining(a, "mem", "k") == 10, "deleted and defined again: afresh"


STATE_LOCKS = ("SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() "
               "AND relation = 'rate_limiter.state'::regclass")
WAITING = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s"


def changing(conn, name, rate):
    """A thread that defines memory limit `name` at `rate` in `conn` and commits, and its
    outcome (`in_background`: [None] once done)."""
    return in_background(lambda: define(conn, name, rate=rate, period="1 hour", durable=False))


# Alone: a change under way in another test's database that shares this one's word of the
# gate (one of 64, by OID) would send this test's call through the table's lock.
@pytest.mark.alone
def test_a_memory_call_in_flight_locks_no_table_and_a_change_still_waits_for_it(database_name):
    """Issue 66: a memory limit's call passes a gate in shared memory instead of locking
    rate_limiter.state (about 2,000 instructions a transaction); a change waits for it all
    the same, and a call of a durable limit in the transaction it waits for is not a deadlock
    (the change locks the table only once the calls it found have ended)."""
    with session(database_name) as a, session(database_name) as b, session(database_name) as watch:
        define(a, "mem", rate=10, period="1 hour", durable=False)
        define(a, "rows", rate=10, period="1 hour")
        a.execute("SET deadlock_timeout = '50ms'")
        b.execute("SET deadlock_timeout = '50ms'")
        a.execute("BEGIN")
        a.execute("SELECT rate_limiter.rate_limit('mem', 'k', 4)")
        assert a.execute(STATE_LOCKS).fetchone() == (0,), "no lock of the state table for a memory call"
        thread, changed = changing(b, "mem", 20)
        wait_for(lambda: watch.execute(WAITING, (b.info.backend_pid,)).fetchone()[0], "the change to wait for A")
        assert a.execute("SELECT ok FROM rate_limiter.rate_limit('rows', 'k')").fetchone() == (True,)
        assert a.execute(STATE_LOCKS).fetchone() == (1,), "a durable call locks the table"
        time.sleep(0.2)  # four deadlock timeouts
        assert thread.is_alive(), "the change still waits for A"
        a.execute("COMMIT")
        thread.join(10)
        assert not thread.is_alive() and changed == [None], changed
        assert remaining(a, "mem", "k") == 16, "the 4 taken still count under the new rate"


def test_a_call_that_comes_while_a_change_waits_is_counted_under_it(database_name):
    """A memory call made while a change waits for another takes the table's lock and is
    waited for too (or waits for the change): no count is lost either way."""
    with session(database_name) as a, session(database_name) as b, session(database_name) as c, \
            session(database_name) as watch:
        define(a, "mem", rate=10, period="1 hour", durable=False)
        a.execute("BEGIN")
        a.execute("SELECT rate_limiter.rate_limit('mem', 'k', 4)")
        change, changed = changing(b, "mem", 20)
        wait_for(lambda: watch.execute(WAITING, (b.info.backend_pid,)).fetchone()[0], "the change to wait for A")
        # C commits its call at once (autocommit), before the change or after it.
        late, took = in_background(lambda: c.execute("SELECT ok FROM rate_limiter.rate_limit('mem', 'k', 3)").fetchone())
        time.sleep(0.2)
        a.execute("COMMIT")
        late.join(10)
        change.join(10)
        assert not late.is_alive() and not change.is_alive() and changed == [None] and took == [(True,)], (changed, took)
        assert remaining(a, "mem", "k") == 13, "4 and 3 taken, under the new rate of 20"


def test_a_change_whose_wait_failed_in_a_savepoint_waits_again(database_name):
    """A change's wait for the calls in flight that ends in an error (lock_timeout) caught by
    a savepoint is not taken as done: the next change in the transaction waits again."""
    with session(database_name) as a, session(database_name) as b:
        define(a, "mem", rate=10, period="1 hour", durable=False)
        a.execute("BEGIN")
        a.execute("SELECT rate_limiter.rate_limit('mem', 'k', 4)")
        b.execute("SET lock_timeout = '200ms'")
        b.execute("BEGIN")
        for _ in range(2):
            b.execute("SAVEPOINT s")
            with pytest.raises(errors.LockNotAvailable):
                define(b, "mem", rate=20, period="1 hour", durable=False)
            b.execute("ROLLBACK TO SAVEPOINT s")
        a.execute("COMMIT")
        define(b, "mem", rate=20, period="1 hour", durable=False)
        b.execute("COMMIT")
        assert remaining(a, "mem", "k") == 16


def test_a_memory_limit_redefined_under_load_loses_and_invents_nothing(database_name):
    """The gate under load: six sessions take, roll back (whole or a savepoint) and hold
    calls in flight while the limit is redefined again and again (its period: with the clock
    standing still, what it counts stays comparable). Each call either ended before a change
    or is counted under it: none lost, none twice, none refused for a config changed under
    it (55000)."""
    with session(database_name) as admin:
        ledger(admin)
        define(admin, "m", rate=100000, period="1 day", durable=False)
    stop = threading.Event()
    loading, loaded = in_background(lambda: mixed_load(database_name, "m", "k", 6, 10000, stop))
    try:
        with session(database_name) as admin:
            for period in ("2 days", "1 day") * 3:
                time.sleep(0.4)
                define(admin, "m", rate=100000, period=period, durable=False)
            time.sleep(0.4)
    finally:
        stop.set()
        loading.join(30)
    assert loaded == [None], loaded
    with session(database_name) as c:
        used = granted(c, "m", "k")
        assert used > 100, "the load ran"
        assert used + remaining(c, "m", "k") == 100000


@pytest.mark.parametrize("durable", [False, True])
def test_a_redefinition_in_another_session_is_seen_by_the_next_call(database_name, durable):
    """Issue 66's promise: what a backend keeps of the configs it called (by name, and the
    last one) is current at its next call once another session's change commits."""
    with session(database_name) as a, session(database_name) as b:
        define(a, "x", rate=10, period="1 hour", durable=durable)
        for _ in range(2):
            a.execute("SELECT rate_limiter.rate_limit('x', 'k')")
        define(b, "x", rate=3, period="1 hour", durable=durable)
        left = a.execute("SELECT remaining FROM rate_limiter.rate_limit('x', 'k')").fetchone()
        assert left == (0,), "2 taken of 3, and this one: none left (7 under the old rate of 10)"


def test_a_change_waits_for_no_call_of_another_database(test_cluster, database_name):
    """The gate's slots say their database: a change waits for its own database's calls in
    flight, never for another's."""
    with test_cluster.connect() as admin:
        admin.execute("CREATE DATABASE rl_gate_other")
        try:
            with test_cluster.connect("rl_gate_other") as other, session(database_name) as b:
                other.execute("CREATE EXTENSION rate_limiter")
                for conn in (other, b):
                    define(conn, "mem", rate=10, period="1 hour", durable=False)
                other.execute("BEGIN")
                other.execute("SELECT rate_limiter.rate_limit('mem', 'k', 4)")
                b.execute("SET lock_timeout = '2s'")
                define(b, "mem", rate=20, period="1 hour", durable=False)
                other.execute("COMMIT")
        finally:
            admin.execute("DROP DATABASE IF EXISTS rl_gate_other")


def test_a_call_in_a_savepoint_rolled_back_keeps_no_change_waiting(database_name):
    """A memory call taken back by the rollback of its savepoint leaves nothing in flight: a
    change after it does not wait for the rest of the transaction (as the table's lock, taken
    in the savepoint, was released with it)."""
    with session(database_name) as a, session(database_name) as b:
        define(a, "mem", rate=10, period="1 hour", durable=False)
        a.execute("BEGIN")
        a.execute("SAVEPOINT s")
        a.execute("SELECT rate_limiter.rate_limit('mem', 'k', 4)")
        a.execute("ROLLBACK TO SAVEPOINT s")
        b.execute("SET lock_timeout = '2s'")
        define(b, "mem", rate=20, period="1 hour", durable=False)
        a.execute("SELECT rate_limiter.rate_limit('mem', 'k', 3)")
        a.execute("COMMIT")
        assert remaining(b, "mem", "k") == 17, "the rolled-back 4 never counted, the 3 under the new rate"


def test_a_call_behind_a_prepared_change_reads_its_config_after_commit_prepared(database_name):
    """A change prepared (PREPARE TRANSACTION) holds the table's lock until COMMIT PREPARED
    sends its invalidations, while no change is counted at the gate: a call that passed the
    gate and then waits for the lock reads its config again once it has it."""
    with session(database_name) as a, session(database_name) as p:
        define(a, "mem", rate=10, period="1 hour", durable=False)
        define(a, "c", "concurrency", rate=3, period="1 minute")
        a.execute("SELECT rate_limiter.rate_limit('mem', 'k')")  # this backend guesses the gate first
        p.execute("BEGIN")
        define(p, "c", "concurrency", rate=1, period="1 minute")
        p.execute("PREPARE TRANSACTION 'rl_lowered'")
        try:
            call, answers = in_background(lambda: a.execute("SELECT ok FROM rate_limiter.rate_limit('c', 'k', 2)").fetchone())
            wait_for(lambda: p.execute(WAITING, (a.info.backend_pid,)).fetchone()[0], "the call to wait for the lock")
        finally:
            p.execute("COMMIT PREPARED 'rl_lowered'")
        call.join(10)
        assert len(answers) == 1 and isinstance(answers[0], errors.InvalidParameterValue), answers
        assert "count 2 exceeds 1" in str(answers[0]), "decided under the lowered rate, not let through under 3"


def test_a_database_or_extension_dropped_and_made_again_starts_empty(test_cluster):
    config = """'{"kind": "fixed window", "rate": 2, "period": "1 day", "durable": false}'"""
    with test_cluster.connect() as admin:
        admin.execute("CREATE DATABASE rl_memory_oid")
        oid = admin.execute("SELECT oid FROM pg_database WHERE datname = 'rl_memory_oid'").fetchone()[0]
        try:
            for _ in range(2):
                with test_cluster.connect("rl_memory_oid") as c:
                    c.execute("CREATE EXTENSION rate_limiter")
                    c.execute(f"SET rate_limiter.fake_now = '{NOW}'")
                    full = c.execute(f"SELECT remaining FROM rate_limiter.check_rate_limit('m', 'k', 0, config => {config})")
                    assert full.fetchone() == (2,), "a new database's key is full, one given a dropped one's OID too"
                    c.execute(f"SELECT rate_limiter.rate_limit('m', 'k', 2, config => {config})")
                    c.execute("DROP EXTENSION rate_limiter")
                    c.execute("CREATE EXTENSION rate_limiter")
                    c.execute(f"SET rate_limiter.fake_now = '{NOW}'")
                    assert c.execute(f"SELECT remaining FROM rate_limiter.check_rate_limit('m', 'k', 0, config => {config})"
                                     ).fetchone() == (2,), "the extension made again starts empty"
                    c.execute(f"SELECT rate_limiter.rate_limit('m', 'k', 2, config => {config})")
                admin.execute("DROP DATABASE rl_memory_oid")
                admin.execute(f"CREATE DATABASE rl_memory_oid OID {oid}")
        finally:
            admin.execute("DROP DATABASE IF EXISTS rl_memory_oid")


def assert_all_memory_parts_answer_read_only(conn):
    """In a read-only transaction (conn's server a standby, or in one begun READ ONLY), given
    memory limits 'mem' (5 an hour) and 'mem2' (3) and a durable one 'rows'."""
    memory = '[{"name": "mem", "key": "all"}, {"name": "mem2", "key": "all", "count": 2}]'
    with_durable = '[{"name": "mem", "key": "all"}, {"name": "rows", "key": "all"}]'
    answer = "SELECT ok, round(remaining::numeric, 3) FROM rate_limiter.{}(%s)"
    assert conn.execute(answer.format("rate_limit_all"), (memory,)).fetchone() == (True, 1)
    assert conn.execute(answer.format("check_rate_limit_all"), (memory,)).fetchone() == (False, 1)
    with pytest.raises(errors.ReadOnlySqlTransaction):
        conn.execute("SELECT rate_limiter.rate_limit_all(%s)", (with_durable,))


@every_version
def test_rate_limit_all_of_memory_limits_answers_in_a_read_only_transaction(test_cluster, database_name):
    """Issue 52, F3: rate_limit_all prepared its writes before it knew whether any part was
    durable, and failed with 25006 where rate_limit on the same limits answers."""
    with test_cluster.connect(database_name) as c:
        define(c, "mem", rate=5, period="1 hour", durable=False)
        define(c, "mem2", rate=3, period="1 hour", durable=False)
        define(c, "rows", rate=3, period="1 hour")
        c.execute("BEGIN READ ONLY")
        assert_all_memory_parts_answer_read_only(c)
        c.execute("ROLLBACK")
        # Rolled back with the transaction, as a memory call is.
        assert c.execute("SELECT remaining FROM rate_limiter.check_rate_limit('mem2', 'all', 0)").fetchone() == (3,)


@every_version
def test_a_standby_counts_its_own_calls_and_once_promoted_the_primarys_last_snapshot(clusters):
    """A memory limit works on a hot standby, in its read-only transactions: it counts that
    server's calls, and the primary's are not there (docs/memory-limits.md). Promoted, it
    starts from the primary's last snapshot, which replicated: a key the primary drained is
    drained there, over the standby's own count of it."""
    primary = clusters("primary", PORTS["primary"], ["-c shared_preload_libraries=rate_limiter"]).init().start()
    standby = clusters("standby", PORTS["standby"], ["-c shared_preload_libraries=rate_limiter"])
    with primary.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(f"ALTER DATABASE postgres SET rate_limiter.fake_now = '{NOW}'")
        define(c, "mem", rate=5, period="1 hour", durable=False)
        define(c, "mem2", rate=3, period="1 hour", durable=False)
        define(c, "rows", rate=3, period="1 hour")
        c.execute("SELECT rate_limiter.rate_limit('mem', 'k', 4)")
    standby.follow(primary)
    with standby.connect() as s:
        wait_for(lambda: s.execute("SELECT count(*) FROM rate_limiter.limits WHERE name = 'mem'").fetchone() == (1,),
                 "the limit replayed")
        answers = [s.execute("SELECT ok FROM rate_limiter.rate_limit('mem', 'k', 2)").fetchone()[0] for _ in range(3)]
        assert answers == [True, True, False], "the standby's own 5, none of the primary's 4"
        s.execute("BEGIN")
        assert s.execute("SELECT ok FROM rate_limiter.rate_limit('mem', 'other', 5)").fetchone() == (True,)
        s.execute("ROLLBACK")
        assert s.execute("SELECT remaining FROM rate_limiter.check_rate_limit('mem', 'other', 0)").fetchone() == (5,)
        with pytest.raises(errors.ReadOnlySqlTransaction):
            s.execute("""SELECT rate_limiter.rate_limit('durable', 'k', config => '{"kind": "token bucket", "rate": 1, "period": 1000}')""")
        # Several memory limits at once too; one durable part makes the call a write.
        assert_all_memory_parts_answer_read_only(s)
    with primary.connect() as c:
        c.execute("SELECT rate_limiter.rate_limit('mem', 'k', 5)")  # the primary's 'k' drained
        c.execute("SELECT rate_limiter.rate_limit('mem', 'p', 3)")
        c.execute("SELECT rate_limiter.rate_limit('mem', 'q', 5)")
        wait_for(lambda: snapshot_keys(c) >= 3, "the primary's snapshot")
        c.execute("SELECT pg_switch_wal()")
        lsn = c.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    with standby.connect() as s, standby.connect() as holder:
        wait_for(lambda: s.execute("SELECT pg_last_wal_replay_lsn() >= %s", (lsn,)).fetchone() == (True,),
                 "the snapshot replayed")
        holder.execute("BEGIN")  # the standby's own call of 'q', in flight at the promotion
        holder.execute("SELECT rate_limiter.rate_limit('mem', 'q', 1)")
        s.execute("SELECT pg_promote()")
        left = "SELECT remaining FROM rate_limiter.check_rate_limit('mem', %s, 0)"
        assert s.execute(left, ("p",)).fetchone() == (2,), "the primary's count, loaded at promotion"
        assert s.execute(left, ("k",)).fetchone() == (0,), "the primary's count over the standby's own (1 left)"
        assert s.execute(left, ("other",)).fetchone() == (5,)
        assert s.execute(left, ("q",)).fetchone() == (0,), "the primary's count over a call in flight"
        holder.execute("COMMIT")
        assert s.execute(left, ("q",)).fetchone() == (0,)


@every_version
def test_a_standby_with_no_room_for_a_key_refuses_it_with_53400_and_counts_a_denial(clusters):
    """docs/memory-limits.md, "Never refused": a standby writes no rows, so a key that finds no
    entry (its share of a table of 64 entries is 56) is refused there with 53400, counted as
    a denial; the keys that found room keep answering."""
    primary = clusters("primary", PORTS["primary"], ["-c shared_preload_libraries=rate_limiter"]).init().start()
    standby = clusters("standby", PORTS["standby"], ["-c shared_preload_libraries=rate_limiter",
                                                     "-c rate_limiter.memory_keys=64"])
    with primary.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        define(c, "mem", "fixed window", rate=5, period="1 day", durable=False)
    standby.follow(primary)
    with primary.connect() as c:
        lsn = c.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    with standby.connect() as s:
        wait_for(lambda: s.execute("SELECT pg_last_wal_replay_lsn() >= %s", (lsn,)).fetchone() == (True,),
                 "the limit replayed")
        answers = []
        for i in range(100):
            try:
                answers.append(s.execute("SELECT ok FROM rate_limiter.rate_limit('mem', %s)", (f"k{i}",)).fetchone()[0])
            except errors.ConfigurationLimitExceeded:
                answers.append("53400")
        admitted = answers.count(True)
        assert 0 < admitted <= 56 and answers.count("53400") == 100 - admitted, answers
        assert s.execute("SELECT denied FROM rate_limiter.stats WHERE name = 'mem'").fetchone() == (100 - admitted,)
        first = answers.index(True)
        assert s.execute("SELECT ok FROM rate_limiter.rate_limit('mem', %s)", (f"k{first}",)).fetchone() == (True,)


@every_version
def test_a_standby_promoted_by_a_restart_takes_the_primarys_snapshot_not_its_own_file(clusters):
    """F2 of issue 53: a standby stopped cleanly writes its own calls' counts to its file; started
    again without standby.signal it is a primary, and loads the primary's snapshot, not that
    file: a key the primary drained stays drained."""
    primary = clusters("primary", PORTS["primary"], ["-c shared_preload_libraries=rate_limiter"]).init().start()
    standby = clusters("standby", PORTS["standby"], ["-c shared_preload_libraries=rate_limiter"])
    with primary.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(f"ALTER DATABASE postgres SET rate_limiter.fake_now = '{NOW}'")
        define(c, "mem", rate=10, period="1 hour", durable=False)
    standby.follow(primary)
    with primary.connect() as c:
        assert c.execute("SELECT ok FROM rate_limiter.rate_limit('mem', 'k', 10)").fetchone() == (True,)
        wait_for(lambda: snapshot_keys(c) >= 1, "the primary's snapshot")
        c.execute("SELECT pg_switch_wal()")
        lsn = c.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    with standby.connect() as s:
        wait_for(lambda: s.execute("SELECT pg_last_wal_replay_lsn() >= %s", (lsn,)).fetchone() == (True,),
                 "the snapshot replayed")
        assert s.execute("SELECT ok FROM rate_limiter.rate_limit('mem', 'k', 1)").fetchone() == (True,), \
            "the standby counts its own calls: 9 left of its own"
    primary.stop()
    standby.stop()
    os.remove(f"{standby.dir}/standby.signal")
    standby.start()
    with standby.connect() as s:
        assert s.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
        assert s.execute("SELECT remaining FROM rate_limiter.check_rate_limit('mem', 'k', 0)").fetchone() == (0,), \
            "the primary's count, not the standby's file (9)"


def test_a_promoted_standby_takes_the_primarys_row_of_a_key_that_found_no_room_over_its_own(clusters):
    """A key the primary counted in its row (its table of 64 entries full) and the standby in
    its own entry: once promoted, the standby counts it in the replicated row, as the primary
    did, not in its entry (the primary's 2 of 2 taken, not the standby's 1 of 2)."""
    settings = ["-c shared_preload_libraries=rate_limiter", "-c rate_limiter.memory_keys=64"]
    primary = clusters("primary", PORTS["primary"], settings).init().start()
    standby = clusters("standby", PORTS["standby"], settings)
    with primary.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(f"ALTER DATABASE postgres SET rate_limiter.fake_now = '{NOW}'")
    standby.follow(primary)
    with primary.connect() as c:
        define(c, "mem", "fixed window", rate=2, period="1 hour", start=NOW, durable=False)
        for i in range(80):
            c.execute("SELECT rate_limiter.rate_limit('mem', %s)", (f"k{i}",))
        in_row = c.execute("SELECT key FROM rate_limiter.state ORDER BY key LIMIT 1").fetchone()[0]
        assert c.execute("SELECT ok FROM rate_limiter.rate_limit('mem', %s)", (in_row,)).fetchone() == (True,)
        c.execute("SELECT pg_switch_wal()")
        lsn = c.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    with standby.connect() as s:
        wait_for(lambda: s.execute("SELECT pg_last_wal_replay_lsn() >= %s", (lsn,)).fetchone() == (True,), "replayed")
        assert s.execute("SELECT ok FROM rate_limiter.rate_limit('mem', %s)", (in_row,)).fetchone() == (True,), \
            "the standby's own count: 1 of 2"
        s.execute("SELECT pg_promote()")
        assert s.execute("SELECT ok FROM rate_limiter.rate_limit('mem', %s)", (in_row,)).fetchone() == (False,), \
            "the primary's row: 2 of 2 taken"


@every_version
def test_a_clean_restart_keeps_the_counts_and_a_crash_without_snapshots_starts_them_full(clusters):
    """The postmaster writes the counted keys at a clean shutdown and reads them back at the
    next start; after a crash (immediate stop) with snapshots off there is no file and no
    snapshot, and every key is full."""
    server = clusters("memkeys", PORTS["memkeys"], ["-c shared_preload_libraries=rate_limiter",
                                                    "-c rate_limiter.prune_interval=0",
                                                    "-c rate_limiter.memory_snapshot=0"]).init().start()
    inline = """'{"kind": "token bucket", "rate": 10, "period": "1 hour", "durable": false}'"""
    with server.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(f"ALTER DATABASE postgres SET rate_limiter.fake_now = '{NOW}'")
        define(c, "mem", rate=10, period="1 hour", durable=False)
    with server.connect() as c:
        c.execute("SELECT rate_limiter.rate_limit('mem', 'k', 7)")
        c.execute(f"SELECT rate_limiter.rate_limit('inline', 'k', 4, config => {inline})")
    holder = server.connect()
    holder.execute("BEGIN")
    holder.execute("SELECT rate_limiter.rate_limit('mem', 'other', 5)")  # in flight: the stop rolls it back
    server.stop("fast")
    holder.close()
    server.start()
    left = "SELECT (SELECT remaining FROM rate_limiter.check_rate_limit('mem', %s, 0))"
    with server.connect() as c:
        assert c.execute(left, ("k",)).fetchone() == (3,), "kept through a clean restart"
        assert c.execute(left, ("other",)).fetchone() == (10,), "a call in flight at the stop rolled back"
        assert c.execute(f"SELECT remaining FROM rate_limiter.check_rate_limit('inline', 'k', 0, config => {inline})"
                         ).fetchone() == (6,)
        c.execute("SELECT rate_limiter.rate_limit('mem', 'k', 2)")
        assert c.execute("SELECT count(*) FROM rate_limiter.memory_snapshot").fetchone() == (0,), "snapshots are off"
    server.stop("immediate")
    server.start()
    with server.connect() as c:
        assert c.execute(left, ("k",)).fetchone() == (10,), "a crash with snapshots off starts every key full"
    server.stop("fast")
    server.start()
    with server.connect() as c:
        assert c.execute(left, ("k",)).fetchone() == (10,), "no older file is read after a crash"


LOAD = """
\\set r random(1, 5)
BEGIN;
INSERT INTO ledger SELECT 'mem', 'k', granted, clock_timestamp() FROM rate_limiter.rate_limit('mem', 'k');
\\if :r = 1
ROLLBACK;
\\else
COMMIT;
\\endif
"""


@every_version
def test_a_crash_under_load_forgets_at_most_the_admissions_since_the_last_snapshot(clusters):
    """8 sessions take tokens (a fifth roll back) and the server is killed (SIGKILL, every
    process) mid-load: after the restart the key counts every committed admission but those
    of the last snapshot interval and the worker's round (1 s allowed), and no more than was
    committed plus one call in flight per session (the snapshot counts calls in flight)."""
    interval = 0.2
    server = clusters("memkeys", PORTS["memkeys"], ["-c shared_preload_libraries=rate_limiter",
                                                    f"-c rate_limiter.memory_snapshot={int(interval * 1000)}"]
                      ).init().start()
    with server.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(f"ALTER DATABASE postgres SET rate_limiter.fake_now = '{NOW}'")  # no refill
        define(c, "mem", rate=5000, period="1 hour", durable=False)
        ledger(c)
    killed_at = kill_9_under_load(server, LOAD, clients=8, rate=300, seconds=30, until=lambda: time.sleep(4))
    with server.connect() as c:
        committed = c.execute("SELECT sum(granted) FROM ledger").fetchone()[0]
        recent = c.execute("SELECT coalesce(sum(granted), 0) FROM ledger WHERE at > to_timestamp(%s)",
                           (killed_at - interval - 1.0,)).fetchone()[0]
        counted = 5000 - remaining(c, "mem", "k")
    assert committed > 2 * recent, f"the load ran long enough to tell ({committed} committed, {recent} recent)"
    assert committed - recent <= counted, f"forgot more than the last snapshot: {committed} committed, {counted} counted"
    assert counted <= committed + 8, f"counted more than was committed and in flight: {committed}, {counted}"


def test_a_truncate_of_the_limits_after_a_crash_keeps_the_database_loaded(clusters):
    """After a crash the database loads its snapshot once; a TRUNCATE of its limits forgets
    the counts, but not that it loaded: a new session does not load the old rows over the
    counts since, and the worker goes on writing them."""
    server = clusters("memkeys", PORTS["memkeys"], ["-c shared_preload_libraries=rate_limiter",
                                                    "-c rate_limiter.memory_snapshot=200"]).init().start()
    with server.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(f"ALTER DATABASE postgres SET rate_limiter.fake_now = '{NOW}'")
    with server.connect() as c:
        define(c, "mem", rate=10, period="1 hour", durable=False)
        c.execute("SELECT rate_limiter.rate_limit('mem', 'k', 6)")
        wait_for(lambda: snapshot_keys(c) >= 1, "the snapshot")
    server.kill9()
    server.start()
    with server.connect() as c:
        assert remaining(c, "mem", "k") == 4, "loaded after the crash"
        c.execute("TRUNCATE rate_limiter.limits")
        define(c, "mem", rate=10, period="1 hour", durable=False)
        assert forgets(c) == 1, "the truncate's forget, logged"
        c.execute("SELECT rate_limiter.rate_limit('mem', 'k', 1)")
        wait_for(lambda: snapshot_keys(c) >= 2, "the worker writing the database's counts again")
    with server.connect() as c:
        assert remaining(c, "mem", "k") == 9, "the counts since the truncate, not the rows from before it"


def test_a_reset_a_deleted_limit_and_a_truncate_forget_their_snapshot_rows(clusters):
    """What a reset, a delete of the limit or a TRUNCATE forgets is not loaded back after a
    crash: each logs its forget in the same transaction."""
    server = clusters("memkeys", PORTS["memkeys"], ["-c shared_preload_libraries=rate_limiter",
                                                    "-c rate_limiter.memory_snapshot=200"]).init().start()
    with server.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(f"ALTER DATABASE postgres SET rate_limiter.fake_now = '{NOW}'")
    with server.connect() as c:
        for name in ("mem", "gone"):
            define(c, name, rate=10, period="1 hour", durable=False)
        for name, key in (("mem", "k"), ("mem", "kept"), ("gone", "k")):
            c.execute("SELECT rate_limiter.rate_limit(%s, %s, 6)", (name, key))
        wait_for(lambda: snapshot_keys(c) >= 3, "the snapshot")
        c.execute("BEGIN")
        c.execute("SELECT rate_limiter.reset_rate_limit('mem', 'k')")
        c.execute("ROLLBACK")
        assert forgets(c) == 0, "a rolled-back reset logs nothing"
        c.execute("SELECT rate_limiter.reset_rate_limit('mem', 'k')")
        c.execute("DELETE FROM rate_limiter.limits WHERE name = 'gone'")
        assert forgets(c) == 2, "the reset and the delete, logged"
    server.kill9()
    server.start()
    with server.connect() as c:
        assert remaining(c, "mem", "k") == 10, "the reset key is not loaded back"
        assert remaining(c, "mem", "kept") == 4
        define(c, "gone", rate=10, period="1 hour", durable=False)
        assert remaining(c, "gone", "k") == 10, "nor the deleted limit's"
        c.execute("TRUNCATE rate_limiter.limits")
        assert forgets(c) == 3


def test_a_clock_before_1970_finds_entries_for_new_keys(database_name):
    """Entries never used since the server started are free whatever the clock says."""
    with session(database_name, fake_now="1960-06-01 00:00:00+00") as c:
        define(c, "mem", rate=3, period="1 hour", durable=False)
        oks = [c.execute("SELECT ok FROM rate_limiter.rate_limit('mem', %s)", (f"k{i}",)).fetchone()[0]
               for i in range(20)]
        assert oks == [True] * 20


def test_rate_limit_all_refuses_a_memory_part_whose_ring_is_full_of_its_own_calls(database_name):
    """Its older calls would be folded for good, which a denial of another part could not
    take back: refused (0A000) rather than taken in part."""
    with session(database_name) as c:
        define(c, "mem", rate=100, period="1 hour", durable=False)
        c.execute("BEGIN")
        for _ in range(16):
            c.execute("SELECT rate_limiter.rate_limit('mem', 'k')")
        with pytest.raises(errors.FeatureNotSupported):
            c.execute("""SELECT rate_limiter.rate_limit_all('[{"name": "mem", "key": "k"}]')""")
        c.execute("ROLLBACK")
        assert remaining(c, "mem", "k") == 100
