"""Overrides and tiers from the attacker's and the careless administrator's side: a key's
numbers, or its tier's, changed while 8 sessions call it, and a caller with EXECUTE on
rate_limit alone reaching for another key's override (docs/api.md, Overrides)."""

import threading
import time
import uuid

import psycopg
import pytest

from calls import define, limit
from clusters import on_assert_server
from together import in_sessions

FAKE_NOW = "2026-01-01 00:10:00+00"


def race(test_cluster, database_name, name, change, sessions=8, calls=30):
    """`sessions` sessions call (name, 'k') `calls` times each, a transaction a call, at one
    instant; the first runs `change` (SQL) after its 5th call. Tokens granted in all."""
    def session(i):
        got = 0
        with test_cluster.connect(database_name, autocommit=False) as c:
            c.execute(f"SET rate_limiter.fake_now = '{FAKE_NOW}'")
            c.commit()
            for n in range(calls):
                if i == 0 and n == 5:
                    c.execute(change, (name,))
                    c.commit()
                got += limit(c, name, "k")[3]
                c.commit()
        return got

    return sum(in_sessions(sessions, session))


# Where a key's count is kept: a row, shared memory (durable => false), or a hot limit's
# escrow and log (hot => true).
WHERE = {"durable": {}, "memory": {"durable": False}, "hot": {"hot": True}}


@on_assert_server
@pytest.mark.parametrize("where", WHERE)
def test_an_override_raised_under_eight_sessions_admits_exactly_the_new_rate_in_the_window(test_cluster, database_name, name, where):
    """Calls before the change take under 10, calls after under 20, all from one count (a
    sliding window keeps what each window took): the window admits 20, exactly, whatever the
    interleaving (240 calls, enough after the change); in a row, in shared memory or in a hot
    limit's escrow."""
    with test_cluster.connect(database_name) as c:
        define(c, name, "sliding window", rate=10, start="2026-01-01 00:00:00+00", **WHERE[where])
    assert race(test_cluster, database_name, name, "SELECT rate_limiter.override(%s, 'k', rate => 20)") == 20
    with test_cluster.connect(database_name) as c:
        c.execute(f"SET rate_limiter.fake_now = '{FAKE_NOW}'")
        assert limit(c, name, "k")[0] is False
        assert c.execute("SELECT remaining FROM rate_limiter.check_rate_limit(%s, 'k', 0)", (name,)).fetchone() == (0,)


def test_an_override_lowered_under_eight_sessions_never_admits_more_than_the_higher_rate(test_cluster, database_name, name):
    """What was taken under 20 counts against 10: never more than 20 in the window, never
    fewer than 10, and nothing after the change once 10 were taken."""
    with test_cluster.connect(database_name) as c:
        define(c, name, "sliding window", rate=10, start="2026-01-01 00:00:00+00")
        c.execute("SELECT rate_limiter.override(%s, 'k', rate => 20)", (name,))
    admitted = race(test_cluster, database_name, name, "SELECT rate_limiter.override(%s, 'k', rate => 10)")
    assert 10 <= admitted <= 20
    with test_cluster.connect(database_name) as c:
        c.execute(f"SET rate_limiter.fake_now = '{FAKE_NOW}'")
        assert limit(c, name, "k")[0] is False


@on_assert_server
@pytest.mark.parametrize("where", WHERE)
def test_a_tier_raised_under_eight_sessions_admits_exactly_its_new_rate_to_its_key(test_cluster, database_name, name, where):
    """The key's numbers come from its tier; the tier's change reaches it mid-run, its count
    kept: 20 in the window, exactly."""
    with test_cluster.connect(database_name) as c:
        define(c, name, "sliding window", rate=1, start="2026-01-01 00:00:00+00", **WHERE[where])
        c.execute("SELECT rate_limiter.define_tier(%s, 'pro', rate => 10)", (name,))
        c.execute("SELECT rate_limiter.override(%s, 'k', tier => 'pro')", (name,))
    assert race(test_cluster, database_name, name, "SELECT rate_limiter.define_tier(%s, 'pro', rate => 20)") == 20


def test_an_override_rolled_back_is_forgotten_by_the_backend_that_saw_it(test_cluster, database_name, name):
    """A session sets an override, calls under it (its cache now holds it), and rolls the
    override back, whole or to a savepoint: its next calls are under the limit's numbers again,
    with what the rolled-back calls took given back too."""
    with test_cluster.connect(database_name, autocommit=False) as c:
        c.execute(f"SET rate_limiter.fake_now = '{FAKE_NOW}'")
        define(c, name, "sliding window", rate=1, start="2026-01-01 00:00:00+00")
        c.commit()
        c.execute("SELECT rate_limiter.override(%s, 'k', rate => 100)", (name,))
        assert [limit(c, name, "k")[0] for _ in range(3)] == [True, True, True]
        c.rollback()
        assert [limit(c, name, "k")[0] for _ in range(2)] == [True, False]
        c.rollback()
        c.execute("SAVEPOINT s")
        c.execute("SELECT rate_limiter.override(%s, 'k', rate => 100)", (name,))
        assert [limit(c, name, "k")[0] for _ in range(3)] == [True, True, True]
        c.execute("ROLLBACK TO SAVEPOINT s")
        assert [limit(c, name, "k")[0] for _ in range(2)] == [True, False]
        c.commit()


def test_a_concurrency_override_lowered_waits_for_the_slots_held_beyond_it(test_cluster, database_name, name):
    """Three transactions hold the key's 3 slots under its override; the first ends. Lowered to
    1, a new call would find slot 0 free while slots 1 and 2 are still held: so the change
    waits for them, as a redefinition does, and the key never has more holders than the
    override in force allows once the change is in."""
    conns = [test_cluster.connect(database_name, autocommit=False) for _ in range(4)]
    admin, holders = conns[0], conns[1:]
    try:
        define(admin, name, "concurrency", rate=1, period="1 minute")
        admin.execute("SELECT rate_limiter.override(%s, 'k', rate => 3)", (name,))
        admin.commit()
        acquire = "SELECT ok FROM rate_limiter.acquire(%s, 'k')"
        assert [h.execute(acquire, (name,)).fetchone()[0] for h in holders] == [True, True, True]
        holders[0].commit()
        admin.execute("SET lock_timeout = '300ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            admin.execute("SELECT rate_limiter.override(%s, 'k', rate => 1)", (name,))
        admin.rollback()
        for h in holders[1:]:
            h.commit()
        admin.execute("SELECT rate_limiter.override(%s, 'k', rate => 1)", (name,))
        admin.commit()
        assert holders[0].execute(acquire, (name,)).fetchone()[0]
        assert not holders[1].execute(acquire, (name,)).fetchone()[0], "1 slot, held"
    finally:
        for c in conns:
            c.close()


def test_a_memory_limits_key_keeps_its_count_in_shared_memory_under_its_override(test_cluster, database_name, name):
    """A memory limit's key moved up, exempted and back: its count stays in shared memory (no
    row), and a change made in a transaction is not called under in that transaction (0A000),
    as a change of the limit is not."""
    with test_cluster.connect(database_name) as c:
        c.execute(f"SET rate_limiter.fake_now = '{FAKE_NOW}'")
        define(c, name, "sliding window", rate=2, period="1 hour", start="2026-01-01 00:00:00+00", durable=False)
        assert [limit(c, name, "k")[0] for _ in range(3)] == [True, True, False]
        c.execute("SELECT rate_limiter.override(%s, 'k', rate => 5)", (name,))
        assert [limit(c, name, "k")[0] for _ in range(4)] == [True, True, True, False], "5 less the 2 taken"
        c.execute("SELECT rate_limiter.override(%s, 'k', exempt => true)", (name,))
        assert all(limit(c, name, "k")[0] for _ in range(5)), "exempt"
        c.execute("SELECT rate_limiter.remove_override(%s, 'k')", (name,))
        assert not limit(c, name, "k")[0], "5 taken against the limit's 2"
        assert c.execute("SELECT count(*) FROM rate_limiter.state WHERE name = %s", (name,)).fetchone() == (0,)
        with c.transaction():
            c.execute("SELECT rate_limiter.override(%s, 'k', rate => 50)", (name,))
            with pytest.raises(psycopg.errors.FeatureNotSupported), c.transaction():  # a savepoint
                limit(c, name, "k")
        assert limit(c, name, "k")[0], "committed: 50 less the 5 taken"


def test_prune_deletes_an_ended_override_without_waiting_for_the_slots_held(test_cluster, database_name, name):
    """An override of a concurrency limit that has ended changes no key's numbers: prune()
    deletes it without waiting for the transaction holding a slot (a change of a live one
    waits, as above). 0.8.0 refuses such an override with an end (issue 64, F2); one that 0.7.0
    made is planted here with the table's trigger off, as an update from 0.7.0 keeps it."""
    with test_cluster.connect(database_name, autocommit=False) as admin, \
         test_cluster.connect(database_name, autocommit=False) as holder:
        define(admin, name, "concurrency", rate=1, period="1 minute")
        admin.execute("ALTER TABLE rate_limiter.overrides DISABLE TRIGGER overrides_changed")
        admin.execute("INSERT INTO rate_limiter.overrides (name, key, rate, until) "
                      "VALUES (%s, 'k', 2, now() + interval '50 milliseconds')", (name,))
        admin.execute("ALTER TABLE rate_limiter.overrides ENABLE ALWAYS TRIGGER overrides_changed")
        admin.commit()
        time.sleep(0.1)
        assert holder.execute("SELECT ok FROM rate_limiter.acquire(%s, 'k')", (name,)).fetchone() == (True,)
        admin.execute("SET lock_timeout = '300ms'")
        assert admin.execute("SELECT rate_limiter.prune()").fetchone()[0] >= 1
        assert admin.execute("SELECT count(*) FROM rate_limiter.overrides WHERE name = %s", (name,)).fetchone() == (0,)
        admin.commit()
        holder.commit()


def test_a_tier_is_not_removed_under_an_override_naming_it_that_has_not_committed(test_cluster, database_name, name):
    """override(tier => 'pro') holds the tier's row until it commits: remove_tier() waits for it
    and then refuses (23503), so that no override is left naming a tier that is gone."""
    with test_cluster.connect(database_name, autocommit=False) as admin, \
         test_cluster.connect(database_name, autocommit=False) as other:
        define(admin, name, "sliding window", rate=1)
        admin.execute("SELECT rate_limiter.define_tier(%s, 'pro', rate => 10)", (name,))
        admin.commit()
        admin.execute("SELECT rate_limiter.override(%s, 'k', tier => 'pro')", (name,))
        other.execute("SET lock_timeout = '300ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            other.execute("SELECT rate_limiter.remove_tier(%s, 'pro')", (name,))
        other.rollback()
        admin.commit()
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            other.execute("SELECT rate_limiter.remove_tier(%s, 'pro')", (name,))
        other.rollback()


def test_an_inline_call_takes_its_keys_override_counted_by_its_own_config(test_cluster, database_name, name):
    """The stores (clients/) pass their numbers inline: the administrator's override of (name,
    key) decides that key's calls all the same, its count kept in the call's own state, while
    other keys keep the call's numbers; an inline concurrency config is refused (0A000), its
    slots waited for only under a named limit."""
    # A sliding window: a raised rate gives its difference at once (docs/api.md, Overrides).
    inline = '{"kind": "sliding window", "rate": 2, "period": "1 hour", "start": "2026-01-01 00:00:00+00"}'
    with test_cluster.connect(database_name) as c:
        c.execute(f"SET rate_limiter.fake_now = '{FAKE_NOW}'")

        def calls(key, n):
            return [c.execute("SELECT ok FROM rate_limiter.rate_limit(%s, %s, config => %s::jsonb)",
                              (name, key, inline)).fetchone()[0] for _ in range(n)]

        assert calls("k", 3) == [True, True, False]
        define(c, name, "sliding window", rate=2, period="1 hour")
        c.execute("SELECT rate_limiter.override(%s, 'k', rate => 5)", (name,))
        assert calls("k", 4) == [True, True, True, False], "5 in the window, 2 of them taken before"
        assert calls("other", 3) == [True, True, False]
        c.execute("SELECT rate_limiter.override(%s, 'k', exempt => true)", (name,))
        assert calls("k", 4) == [True] * 4
        c.execute("SELECT rate_limiter.remove_override(%s, 'k')", (name,))
        assert calls("k", 1) == [False], "the 5 taken count against 2"
        c.execute("SELECT rate_limiter.override(%s, 'k', rate => 5)", (name,))
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="inline concurrency"):
            c.execute("SELECT * FROM rate_limiter.acquire(%s, 'k', config => '{\"kind\": \"concurrency\", \"rate\": 3, "
                      "\"period\": 1000}'::jsonb)", (name,))


# What a change of the limit or its tier must do once the override() it waited for has
# committed: (the override, the change, the error it must end with or None, how many
# overrides the limit then has).
IN_PRO = "SELECT rate_limiter.override(%s, 'k', tier => 'pro')"
CHANGES_AFTER_AN_OVERRIDE = {
    "remove_tier": (IN_PRO, "SELECT rate_limiter.remove_tier(%(n)s, 'pro')", psycopg.errors.ForeignKeyViolation, 1),
    # A hot limit's overrides have no end.
    "define_hot": ("SELECT rate_limiter.override(%s, 'k', rate => 5, until => now() + interval '1 hour')",
                   "SELECT rate_limiter.define(%(n)s, 'token bucket', 1, '1 hour', hot => true)",
                   psycopg.errors.FeatureNotSupported, 1),
    "delete_limit": (IN_PRO, "DELETE FROM rate_limiter.limits WHERE name = %(n)s", None, 0),
}


@pytest.mark.parametrize("isolation", ["read committed", "repeatable read"])
@pytest.mark.parametrize("change", CHANGES_AFTER_AN_OVERRIDE)
def test_a_change_that_waited_for_an_override_sees_it_at_every_isolation_level(test_cluster, database_name, name,
                                                                               isolation, change):
    """A change whose snapshot is older than an override() that commits while the change waits
    for it: the tier is not removed (23503), the limit is not made hot under an override with
    an end (0A000), a deleted limit takes the override with it. Under REPEATABLE READ the change's own snapshot does not show
    the override; the checks read what is committed now, as a foreign key's do."""
    override, sql, refusal, left = CHANGES_AFTER_AN_OVERRIDE[change]
    with test_cluster.connect(database_name) as setup:
        define(setup, name, "token bucket", rate=1)
        setup.execute("SELECT rate_limiter.define_tier(%s, 'pro', rate => 10)", (name,))
    with test_cluster.connect(database_name, autocommit=False) as admin, \
         test_cluster.connect(database_name, autocommit=False) as changer:
        changer.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
        changer.execute("SELECT count(*) FROM rate_limiter.overrides")  # its snapshot, before the override
        admin.execute(override, (name,))
        outcome = []

        def run_change():
            try:
                changer.execute(sql, {"n": name})
                changer.commit()
                outcome.append(None)
            except psycopg.Error as error:
                changer.rollback()
                outcome.append(type(error))

        thread = threading.Thread(target=run_change)
        thread.start()
        pid = changer.info.backend_pid
        with test_cluster.connect(database_name) as watcher:
            for _ in range(500):
                if not thread.is_alive():
                    raise AssertionError(f"{change} did not wait for the override: {outcome}")
                if watcher.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                                   (pid,)).fetchone()[0]:
                    break
                time.sleep(0.01)
            else:
                raise AssertionError(f"{change} did not wait for the override")
        admin.commit()
        thread.join(30)
        assert outcome == [refusal]
        overrides = admin.execute("SELECT count(*) FROM rate_limiter.overrides WHERE name = %s", (name,)).fetchone()[0]
        assert overrides == left
        admin.commit()


@pytest.fixture
def caller(test_cluster, database_name, name):
    """A role that may call rate_limit, nothing more, and a limit with an override of a key."""
    role = "caller_" + uuid.uuid4().hex[:8]
    with test_cluster.connect(database_name) as c:
        c.execute(f"CREATE ROLE {role} LOGIN")
        c.execute(f"GRANT USAGE ON SCHEMA rate_limiter TO {role}")
        c.execute(f"GRANT EXECUTE ON FUNCTION rate_limiter.rate_limit, rate_limiter.check_rate_limit TO {role}")
        define(c, name, "token bucket", rate=1)
        c.execute("SELECT rate_limiter.override(%s, 'customer:7', rate => 1000, note => 'plan: pro')", (name,))
    yield role
    with test_cluster.connect(database_name) as c:
        c.execute(f"DROP OWNED BY {role}")
        c.execute(f"DROP ROLE {role}")


def test_a_caller_with_execute_on_rate_limit_cannot_create_change_or_read_an_override(test_cluster, database_name, name, caller):
    with test_cluster.connect(database_name, user=caller) as c:
        for sql in ["SELECT rate_limiter.override(%s, 'mallory', rate => 1000000)",
                    "SELECT rate_limiter.override(%s, 'customer:7', rate => 1)",
                    "SELECT rate_limiter.remove_override(%s, 'customer:7')",
                    "SELECT * FROM rate_limiter.overrides WHERE name = %s",
                    "DELETE FROM rate_limiter.overrides WHERE name = %s",
                    "SELECT rate_limiter.define_tier(%s, 'unlimited', rate => 1000000)",
                    "SELECT rate_limiter.remove_tier(%s, 'unlimited')",
                    "SELECT * FROM rate_limiter.tiers WHERE name = %s"]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(sql, (name,))
        # What it may do is call: the key's own numbers apply, mallory's are the limit's.
        assert limit(c, name, "mallory")[0] is True
        assert limit(c, name, "mallory")[0] is False
        assert all(limit(c, name, "customer:7")[0] for _ in range(5))
    with test_cluster.connect(database_name) as c:
        assert c.execute("SELECT key, rate FROM rate_limiter.overrides WHERE name = %s", (name,)).fetchall() == [("customer:7", 1000.0)]
