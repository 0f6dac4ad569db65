"""Concurrency limits (docs/semantics.md, "Concurrency limits"): at most `rate` slots of a key
held at once, by transactions until they end and by leases until they expire or are released.
Checked from outside: a ledger of holders kept by the clients themselves, entered after a
grant and left before the slot is given back, must never count more than the limit."""

import threading
import time
import uuid

import psycopg
import pytest

from properties import seeded
from calls import define
from clusters import DATABASE, PORTS, every_version, wait_for
from together import in_sessions


def acquire(conn, name, key="k", count=1, **kw):
    extra = "".join(f", {k} => %({k})s" for k in kw)
    return conn.execute(
        f"SELECT ok, remaining, retry_after, lease_id, reason FROM rate_limiter.acquire(%(n)s, %(k)s, %(c)s{extra})",
        {"n": name, "k": key, "c": count, **kw},
    ).fetchone()


def free(conn, name, key="k"):
    return conn.execute("SELECT remaining FROM rate_limiter.check_rate_limit(%s, %s, 0)", (name, key)).fetchone()[0]


class Ledger:
    """Holders as the clients count them: entered after a grant, left before the slot is
    given back (commit, rollback or release), so it never counts more than truly hold."""

    def __init__(self):
        self.lock, self.now, self.most, self.grants = threading.Lock(), 0, 0, 0

    def enter(self, n):
        with self.lock:
            self.now += n
            self.grants += 1
            self.most = max(self.most, self.now)

    def leave(self, n):
        with self.lock:
            self.now -= n


@every_version
def test_never_more_holders_than_slots_among_sessions_holding_by_transaction_and_by_lease(test_cluster, name):
    slots, sessions, rounds = 3, 8, 40
    with test_cluster.connect(DATABASE) as c:
        define(c, name, "concurrency", rate=slots, period="50 milliseconds")
    ledger = Ledger()

    def session(i):
        rng = seeded(i)
        denied = 0
        with test_cluster.connect(DATABASE) as c:
            for _ in range(rounds):
                count = rng.choice([1, 1, 2])
                if i % 2 == 0:  # a slot for the transaction
                    c.execute("BEGIN")
                    ok = acquire(c, name, count=count)[0]
                    if ok:
                        ledger.enter(count)
                        time.sleep(rng.uniform(0, 0.004))
                        ledger.leave(count)
                    c.execute(rng.choice(["COMMIT", "ROLLBACK"]))
                else:  # a lease, ended by release
                    ok, _, _, lease, _ = acquire(c, name, count=count, lease="10 seconds")
                    if ok:
                        ledger.enter(count)
                        time.sleep(rng.uniform(0, 0.004))
                        ledger.leave(count)
                        assert c.execute("SELECT rate_limiter.release(%s, 'k', %s)", (name, lease)).fetchone()[0]
                denied += not ok
        return denied

    denied = sum(in_sessions(sessions, session))
    assert ledger.most <= slots, f"{ledger.most} held at once, more than {slots}"
    assert ledger.most == slots, "the sessions contended enough to fill every slot"
    assert denied > 0 and ledger.grants > sessions * rounds // 10, (denied, ledger.grants)
    with test_cluster.connect(DATABASE) as c:
        assert free(c, name) == slots, "every slot was given back"
        assert c.execute("SELECT count(*) FROM rate_limiter.leases WHERE name = %s", (name,)).fetchone()[0] == 0
        calls, allowed = c.execute("SELECT calls, allowed FROM rate_limiter.stats WHERE name = %s", (name,)).fetchone()
        assert (calls, allowed) == (sessions * rounds, ledger.grants), "counted in the statistics"


@every_version
def test_a_transactions_slot_ends_with_it_commit_abort_or_savepoint(test_cluster, name):
    with test_cluster.connect(DATABASE) as a, test_cluster.connect(DATABASE) as b:
        define(a, name, "concurrency", rate=1, period="1 second")
        for end in ["COMMIT", "ROLLBACK", "ROLLBACK TO SAVEPOINT s"]:
            a.execute("BEGIN")
            a.execute("SAVEPOINT s")
            assert acquire(a, name)[0]
            ok, remaining, retry_after, _, reason = acquire(b, name)
            assert (ok, remaining, retry_after, reason) == (False, 0, 1000, "exhausted"), end
            a.execute(end)
            assert acquire(b, name)[0], f"free after {end}"
            if end.startswith("ROLLBACK TO"):
                a.execute("COMMIT")


@every_version
def test_a_lease_outlives_its_transaction_and_ends_by_itself_or_by_release(test_cluster, name):
    with test_cluster.connect(DATABASE) as a, test_cluster.connect(DATABASE) as b:
        define(a, name, "concurrency", rate=2, period="1 minute")
        ok, remaining, _, lease, _ = acquire(a, name, lease="1 second")
        assert ok and remaining == 1 and lease is not None
        assert acquire(b, name, count=1)[0] and not acquire(b, name, count=2)[0]
        ok, _, retry_after, _, _ = acquire(b, name, count=2)
        assert not ok and 0 < retry_after <= 1000, "told to come back when the lease ends"
        time.sleep(1.2)
        assert acquire(b, name, count=2)[0], "the lease ended by itself"
        assert not a.execute("SELECT rate_limiter.renew(%s, 'k', %s, '1 minute')", (name, lease)).fetchone()[0]
        assert not a.execute("SELECT rate_limiter.release(%s, 'k', %s)", (name, lease)).fetchone()[0]
        # Renewed before it ends, it holds on.
        lease = acquire(a, name, lease="1 second")[3]
        assert a.execute("SELECT rate_limiter.renew(%s, 'k', %s, '1 minute')", (name, lease)).fetchone()[0]
        time.sleep(1.2)
        assert free(b, name) == 1
        # Only its id ends it.
        assert not b.execute("SELECT rate_limiter.release(%s, 'k', %s)", (name, uuid.uuid4())).fetchone()[0]
        assert free(b, name) == 1
        assert a.execute("SELECT rate_limiter.release(%s, 'k', %s)", (name, lease)).fetchone()[0]
        assert free(b, name) == 2


@every_version
def test_a_lease_taken_in_a_transaction_that_rolls_back_never_existed(test_cluster, name):
    with test_cluster.connect(DATABASE) as a, test_cluster.connect(DATABASE) as b:
        define(a, name, "concurrency", rate=1, period="1 second")
        a.execute("BEGIN")
        assert acquire(a, name, lease="1 hour")[0]
        assert not acquire(b, name)[0], "held while the transaction runs"
        a.execute("ROLLBACK")
        a.execute("BEGIN")
        a.execute("SAVEPOINT s")
        assert acquire(a, name, lease="1 hour")[0]
        a.execute("ROLLBACK TO SAVEPOINT s")
        assert acquire(b, name)[0], "free once the savepoint is rolled back"
        a.execute("COMMIT")
        assert a.execute("SELECT count(*) FROM rate_limiter.leases WHERE name = %s", (name,)).fetchone()[0] == 0


@every_version
def test_a_lease_committed_after_a_repeatable_read_snapshot_still_holds_its_slot(test_cluster, name):
    with test_cluster.connect(DATABASE) as a, test_cluster.connect(DATABASE) as b:
        define(a, name, "concurrency", rate=1, period="1 second")
        a.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        a.execute("SELECT count(*) FROM rate_limiter.limits")  # the snapshot is taken
        assert acquire(b, name, lease="1 hour")[0]
        assert not acquire(a, name)[0], "the lease committed after the snapshot is seen"
        a.execute("COMMIT")


@every_version
def test_wait_rate_limit_waits_for_a_slot_to_free(test_cluster, name):
    with test_cluster.connect(DATABASE) as a, test_cluster.connect(DATABASE) as b:
        define(a, name, "concurrency", rate=1, period="1 minute")
        a.execute("BEGIN")
        assert acquire(a, name)[0]
        threading.Timer(0.3, lambda: a.execute("COMMIT")).start()
        started = time.monotonic()
        ok, = b.execute("SELECT ok FROM rate_limiter.wait_rate_limit(%s, 'k', 1, '10 seconds')", (name,)).fetchone()
        waited = time.monotonic() - started
        assert ok and 0.25 < waited < 3, waited


def test_a_concurrency_limit_answers_http_headers(test_conn, name):
    define(test_conn, name, "concurrency", rate=2, period="1 second")
    headers = test_conn.execute(
        "SELECT rate_limiter.http_headers(%s, d) FROM rate_limiter.rate_limit(%s, 'k') d", (name, name)).fetchone()[0]
    assert headers == {"RateLimit-Policy": f'"{name}";q=2;qu="concurrent-requests"', "RateLimit": f'"{name}";r=1;t=1'}
    test_conn.execute("BEGIN")
    test_conn.execute("SELECT rate_limiter.acquire(%s, 'k', 2)", (name,))
    denied = test_conn.execute(
        "SELECT rate_limiter.http_headers(%s, d) FROM rate_limiter.rate_limit(%s, 'k') d", (name, name)).fetchone()[0]
    test_conn.execute("ROLLBACK")
    assert denied == {"RateLimit-Policy": f'"{name}";q=2;qu="concurrent-requests"', "RateLimit": f'"{name}";r=0;t=1', "Retry-After": "1"}


@every_version
def test_a_crash_frees_the_transactions_slots_and_keeps_unexpired_leases(clusters, pg):
    cluster = clusters("slots_crash", PORTS["slots_crash"], ["-c shared_preload_libraries=rate_limiter"]).init().start()
    with cluster.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        define(c, "c", "concurrency", rate=4, period="1 second")
        assert acquire(c, "c", lease="1 hour")[0]
        assert acquire(c, "c", lease="1 second")[0]
    holder = cluster.connect()
    holder.execute("BEGIN")
    assert acquire(holder, "c", count=2)[0]
    with cluster.connect() as c:
        assert free(c, "c") == 0
    time.sleep(1.1)
    cluster.kill9()
    try:
        holder.close()
    except psycopg.Error:
        pass
    cluster.start()
    with cluster.connect() as c:
        assert free(c, "c") == 3, "the transaction's two slots and the ended lease are free; the hour's lease holds"
        assert c.execute("SELECT count(*) FROM rate_limiter.leases WHERE expires_at > now()").fetchone()[0] == 1


@every_version
def test_a_role_with_execute_alone_takes_and_ends_leases_but_cannot_read_their_ids(test_cluster, name):
    role = "slots_" + name
    with test_cluster.connect(DATABASE) as admin:
        define(admin, name, "concurrency", rate=1, period="1 second")
        admin.execute(f"CREATE ROLE {role} LOGIN")
        try:
            admin.execute(f"GRANT USAGE ON SCHEMA rate_limiter TO {role}")
            admin.execute(f"GRANT EXECUTE ON FUNCTION rate_limiter.acquire, rate_limiter.release, "
                          f"rate_limiter.renew, rate_limiter.check_rate_limit TO {role}")
            with test_cluster.connect(DATABASE, user=role) as c:
                ok, _, _, lease, _ = acquire(c, name, lease="1 hour")
                assert ok and lease is not None
                assert not acquire(c, name)[0]
                assert c.execute("SELECT rate_limiter.renew(%s, 'k', %s, '2 hours')", (name, lease)).fetchone()[0]
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    c.execute("SELECT lease_id FROM rate_limiter.leases")
                assert c.execute("SELECT rate_limiter.release(%s, 'k', %s)", (name, lease)).fetchone()[0]
                assert acquire(c, name)[0]
                assert c.execute("SELECT current_user").fetchone()[0] == role
        finally:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


@every_version
def test_a_lease_write_that_waits_for_another_transactions_row_keeps_no_other_call_waiting(test_cluster, name):
    with test_cluster.connect(DATABASE) as a, test_cluster.connect(DATABASE) as b, \
            test_cluster.connect(DATABASE) as c:
        define(a, name, "concurrency", rate=2, period="1 second")
        lease = acquire(a, name, lease="1 second")[3]
        time.sleep(1.1)
        # A deletes the ended lease's row and keeps its transaction open.
        a.execute("BEGIN")
        assert not a.execute("SELECT rate_limiter.release(%s, 'k', %s)", (name, lease)).fetchone()[0]
        taken = []
        writer = threading.Thread(target=lambda: taken.append(acquire(b, name, count=2, lease="1 minute")))
        writer.start()
        waiting = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s"
        wait_for(lambda: c.execute(waiting, (b.info.backend_pid,)).fetchone()[0], "B to wait for A's row")
        assert writer.is_alive(), "B's lease waits for A's deletion of the row it replaces"
        c.execute("SET statement_timeout = '3s'")
        ok, remaining, *_ = acquire(c, name)
        assert (ok, remaining) == (False, 0), "C is answered at once: B holds both slots"
        a.execute("COMMIT")
        writer.join(10)
        assert taken and taken[0][0]


@every_version
def test_a_lowered_rate_waits_for_the_transactions_holding_slots_and_counts_every_lease(test_cluster, name):
    with test_cluster.connect(DATABASE) as a, test_cluster.connect(DATABASE) as b:
        define(a, name, "concurrency", rate=3, period="1 second")
        a.execute("BEGIN")
        assert acquire(a, name, count=3)[0]
        lowered = threading.Thread(target=lambda: define(b, name, "concurrency", rate=1, period="1 second"))
        lowered.start()
        time.sleep(0.3)
        assert lowered.is_alive(), "define waits for the transaction holding slots 1 and 2"
        a.execute("COMMIT")
        lowered.join(10)
        assert not lowered.is_alive()
        assert acquire(b, name)[0]
        # Leases above the new rate still hold.
        define(a, name, "concurrency", rate=3, period="1 second")
        assert acquire(a, name, count=3, lease="1 hour")[0]
        define(a, name, "concurrency", rate=1, period="1 second")
        ok, remaining, *_ = acquire(b, name)
        assert (ok, remaining) == (False, -2)


# Ways to lower how many slots a concurrency name allows while a transaction holds slots of
# the first definition: (the first definition, the statements before a define of rate 2).
# Issue 41: 0.5.0 waited only when both rows were concurrency limits and the rate fell.
LOWERINGS = {
    "through another kind": ({"rate": 5}, ["SELECT rate_limiter.define('c', 'token bucket', 1, '1 second')"]),
    "by delete": ({"rate": 5}, ["DELETE FROM rate_limiter.limits WHERE name = 'c'"]),
    "by truncate": ({"rate": 5}, ["TRUNCATE rate_limiter.limits"]),
    "by a change of kind": ({"rate": 5}, ["UPDATE rate_limiter.limits SET kind = 'fixed window' WHERE name = 'c'"]),
    # Shadow mode admits past the slots; enforcing again at the same rate lowers what it allows.
    "out of shadow mode": ({"rate": 2, "enforce": False}, []),
}


@every_version
@pytest.mark.parametrize("route", LOWERINGS)
def test_a_concurrency_limit_lowered_by_any_route_waits_for_the_holders_of_its_slots(test_cluster, database_name, route):
    first, statements = LOWERINGS[route]
    with test_cluster.connect(database_name) as a, test_cluster.connect(database_name) as b, test_cluster.connect(database_name) as watch:
        define(a, "c", "concurrency", period="10 seconds", **first)
        a.execute("BEGIN")
        assert acquire(a, "c", count=first["rate"])[0], "A holds every slot until its transaction ends"

        def lower():
            for sql in statements:
                b.execute(sql)
            define(b, "c", "concurrency", rate=2, period="10 seconds")

        lowering = threading.Thread(target=lower)
        lowering.start()
        waiting = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s"
        wait_for(lambda: not lowering.is_alive() or watch.execute(waiting, (b.info.backend_pid,)).fetchone()[0],
                 "the change to wait or end")
        assert lowering.is_alive(), "the change waits for the transaction holding the old rate's slots"
        a.execute("COMMIT")
        lowering.join(10)
        assert not lowering.is_alive()
        a.execute("BEGIN")
        b.execute("BEGIN")
        assert acquire(a, "c", count=2)[0]
        assert not acquire(b, "c")[0], "2 holders at most"
        a.execute("ROLLBACK")
        b.execute("ROLLBACK")


@every_version
def test_one_transaction_holds_at_most_max_slots_per_transaction_and_every_database_still_connects(test_cluster, database_name):
    """Each slot held is an entry of the lock table every database shares (issue 41: 0.5.0
    let one transaction hold 13,379, and every new connection failed with 'out of shared
    memory'). rate_limiter.max_slots_per_transaction (32) bounds one transaction, a call's
    count included; a subtransaction's abort gives its part back."""
    wide = '{"kind": "concurrency", "rate": 1000, "period": 1000}'
    role = "slots_" + uuid.uuid4().hex[:8]
    with test_cluster.connect(database_name) as a, test_cluster.connect() as admin:

        def take(key, count, **kw):
            return acquire(a, "inline", key, count, config=wide, **kw)[0]

        def advisory_locks():
            return admin.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND locktype = 'advisory'",
                                 (a.info.backend_pid,)).fetchone()[0]

        a.execute("BEGIN")
        for k in range(4):
            assert take(f"k{k}", 8)
        with pytest.raises(psycopg.errors.ConfigurationLimitExceeded) as refused:
            take("k4", 1)
        assert "max_slots_per_transaction" in refused.value.diag.message_hint
        a.execute("ROLLBACK")
        # The 0.5.0 sequence: calls of count 1000 on new keys, each in a savepoint.
        a.execute("BEGIN")
        for k in range(13):
            a.execute("SAVEPOINT s")
            with pytest.raises(psycopg.errors.ConfigurationLimitExceeded):
                take(f"wide{k}", 1000)
            a.execute("ROLLBACK TO SAVEPOINT s")
        assert take("w", 32)
        assert advisory_locks() == 32
        with test_cluster.connect("postgres") as elsewhere:
            assert elsewhere.execute("SELECT 1").fetchone() == (1,), "another database still connects"
        a.execute("ROLLBACK")
        # A savepoint rolled back gives its slots, and its part of the bound, back.
        a.execute("BEGIN")
        a.execute("SAVEPOINT s")
        assert take("s", 32)
        a.execute("ROLLBACK TO SAVEPOINT s")
        assert advisory_locks() == 0
        assert take("s", 32), "the rolled-back savepoint's slots no longer count"
        a.execute("ROLLBACK")
        # Only a superuser moves the bound.
        admin.execute(f"CREATE ROLE {role} LOGIN")
        try:
            with test_cluster.connect(database_name, user=role) as plain, pytest.raises(psycopg.errors.InsufficientPrivilege):
                plain.execute("SET rate_limiter.max_slots_per_transaction = 1000")
        finally:
            admin.execute(f"DROP ROLE {role}")


def test_what_one_call_leaves_in_leases_is_bounded_in_rows_and_in_time(test_cluster, database_name):
    """Issue 41: 50 calls of count 1000 with leases of 100 years wrote 50,000 rows that no
    prune could remove. A call leases at most rate_limiter.max_slots_per_transaction slots
    (32), for at most rate_limiter.max_lease (a day); prune() removes a lease once it ends."""
    name = "leases"
    with test_cluster.connect(database_name) as test_conn:
        define(test_conn, name, "concurrency", rate=1000, period="1 second")
        with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
            acquire(test_conn, name, count=1, lease="100 years")
        assert "max_lease" in str(refused.value)
        with pytest.raises(psycopg.errors.ConfigurationLimitExceeded):
            acquire(test_conn, name, count=1000, lease="1 hour")
        ok, _, _, lease, _ = acquire(test_conn, name, count=32, lease="1 day")
        assert ok
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            test_conn.execute("SELECT rate_limiter.renew(%s, 'k', %s, '2 days')", (name, lease))
        rows = "SELECT count(*) FROM rate_limiter.leases WHERE name = %s"
        assert test_conn.execute(rows, (name,)).fetchone() == (32,)
        test_conn.execute("SET rate_limiter.fake_now = '2999-01-01 00:00:00+00'")
        test_conn.execute("SELECT rate_limiter.prune()")
        test_conn.execute("RESET rate_limiter.fake_now")
        assert test_conn.execute(rows, (name,)).fetchone() == (0,), "the ended lease's rows are pruned"


@every_version
def test_two_renewals_of_one_lease_take_turns_and_both_hold_it(test_cluster, name):
    with test_cluster.connect(DATABASE) as a, test_cluster.connect(DATABASE) as b:
        define(a, name, "concurrency", rate=1, period="1 second")
        lease = acquire(a, name, lease="1 minute")[3]
        a.execute("BEGIN")
        assert a.execute("SELECT rate_limiter.renew(%s, 'k', %s, '2 minutes')", (name, lease)).fetchone()[0]
        second = []
        t = threading.Thread(target=lambda: second.append(
            b.execute("SELECT rate_limiter.renew(%s, 'k', %s, '3 minutes')", (name, lease)).fetchone()[0]))
        t.start()
        time.sleep(0.3)
        a.execute("COMMIT")
        t.join(10)
        assert second == [True], "the second renewal waited for the first, and the lease was still held"
