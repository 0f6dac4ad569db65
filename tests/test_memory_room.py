"""Issue 53: memory limits never refuse a key for want of room, and no caller can aim at
another's key. A key that finds no entry in shared memory is counted in its row of
rate_limiter.state, exactly as a durable limit's, until that row equals an absent key's
(docs/memory-limits.md, "Bounded memory"). Where a key lands comes from a keyed hash under
the cluster's secret, which no role can read."""

import json

import pytest
from psycopg import errors

from calls import define
from clusters import PORTS, every_version
from ledger import NOW, remaining, session


def small_cluster(clusters, entries):
    return clusters("memkeys", PORTS["memkeys"], ["-c shared_preload_libraries=rate_limiter",
                                                  f"-c rate_limiter.memory_keys={entries}"]).init().start()


# Calls each of keys 1..n once per round, each in a transaction of its own (COMMIT after
# every call), and counts the rounds' admissions, all inside the server.
WALK = """
CREATE PROCEDURE walk(name text, n int, rounds int, INOUT admitted int[] DEFAULT '{}')
LANGUAGE plpgsql AS $$
DECLARE
    ok boolean;
    this_round int;
BEGIN
    FOR r IN 1..rounds LOOP
        this_round := 0;
        FOR g IN 1..n LOOP
            SELECT l.ok INTO ok FROM rate_limiter.rate_limit(name, 'k' || g) l;
            this_round := this_round + ok::int;
            COMMIT;
        END LOOP;
        admitted := admitted || this_round;
    END LOOP;
END $$;
"""


def walk(c, name, n, rounds):
    return c.execute("CALL walk(%s, %s, %s)", (name, n, rounds)).fetchone()[0]


@every_version
def test_a_table_of_1024_entries_answers_20000_keys_each_exactly(clusters):
    """20,000 keys of a limit of 2 an hour through a table of 1,024 entries: every key is
    admitted exactly twice over three rounds, none refused; those beyond the database's share
    (7/8 of the table) are counted in rows, which the statistics count. A key past the table
    taken in a transaction that rolls back is given back, as a durable one is."""
    small = small_cluster(clusters, 1024)
    with small.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(f"SET rate_limiter.fake_now = '{NOW}'")
        c.execute("SET synchronous_commit = off")
        define(c, "m", "fixed window", rate=2, period="1 hour", start=NOW, durable=False)
        c.execute(WALK)
        assert walk(c, "m", 20_000, 3) == [20_000, 20_000, 0]
        in_rows = c.execute("SELECT count(*) FROM rate_limiter.state WHERE name = 'm'").fetchone()[0]
        assert 20_000 - 1024 <= in_rows <= 20_000 - 1024 * 7 // 8, in_rows
        assert c.execute("SELECT memory_in_rows FROM rate_limiter.stats WHERE name = 'm'").fetchone()[0] >= 2 * in_rows
        c.execute("BEGIN")
        assert c.execute("SELECT ok FROM rate_limiter.rate_limit('m', 'past the table', 2)").fetchone() == (True,)
        c.execute("ROLLBACK")
        assert [c.execute("SELECT ok FROM rate_limiter.rate_limit('m', 'past the table')").fetchone()[0]
                for _ in range(3)] == [True, True, False], "the rollback gave both back"
        assert c.execute("SELECT count(*) FROM rate_limiter.state WHERE key = 'past the table'").fetchone() == (1,)
        # An hour on, every window ended: the keys move back into memory as they are called.
        c.execute("SET rate_limiter.fake_now = '2030-01-01 01:00:00+00'")
        assert walk(c, "m", 300, 3) == [300, 300, 0]
    small.stop()


@every_version
def test_a_key_counted_in_its_row_stays_there_across_a_restart_and_a_crash(clusters):
    """The snapshot table's mark tells a restarted server that keys may be in rows: a key
    drained in its row stays drained after a clean restart and after a crash, not counted
    afresh in an entry that a restart freed."""
    small = small_cluster(clusters, 64)
    with small.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(f"ALTER DATABASE postgres SET rate_limiter.fake_now = '{NOW}'")
    with small.connect() as c:
        define(c, "m", "fixed window", rate=1, period="1 hour", start=NOW, durable=False)
        taken = [c.execute("SELECT ok FROM rate_limiter.rate_limit('m', %s)", (f"k{i}",)).fetchone()[0]
                 for i in range(100)]
        assert taken == [True] * 100
        in_row = c.execute("SELECT key FROM rate_limiter.state ORDER BY key LIMIT 1").fetchone()[0]
    for stop in ("fast", "immediate"):
        small.stop(stop)
        small.start()
        with small.connect() as c:
            assert c.execute("SELECT ok FROM rate_limiter.rate_limit('m', %s)", (in_row,)).fetchone() == (False,), stop
            assert c.execute("SELECT ok FROM rate_limiter.check_rate_limit('m', %s)", (in_row,)).fetchone() == (False,)
    small.stop()


@every_version
def test_inline_variants_of_the_victims_key_leave_its_named_count_alone(clusters):
    """F1, first sequence: a caller with EXECUTE calls the victim's own (name, key) under 32
    inline configs, each held for an hour. The named limit's count of the key still answers,
    exactly: two admitted, the third denied, nothing refused."""
    small = small_cluster(clusters, 64)
    with small.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(f"SET rate_limiter.fake_now = '{NOW}'")
        define(c, "send", "fixed window", rate=2, period="1 hour", start=NOW, durable=False)
        for i in range(32):
            config = f'{{"kind": "fixed window", "rate": {i + 1}, "period": "1 hour", "durable": false}}'
            assert c.execute("SELECT ok FROM rate_limiter.rate_limit('send', 'victim', config => %s)",
                             (config,)).fetchone() == (True,)
        assert [c.execute("SELECT ok FROM rate_limiter.rate_limit('send', 'victim')").fetchone()[0]
                for _ in range(3)] == [True, True, False]
    small.stop()


@every_version
def test_keys_that_fill_the_table_leave_the_victims_key_answering(clusters):
    """F1, second sequence, at its worst: the caller does not need to aim, it fills every
    entry of a 64-entry table (and its database's share) with keys held for an hour. The
    victim's key, new or already counted, answers exactly: not 53400."""
    small = small_cluster(clusters, 64)
    with small.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(f"SET rate_limiter.fake_now = '{NOW}'")
        define(c, "send", "fixed window", rate=2, period="1 hour", start=NOW, durable=False)
        assert c.execute("SELECT ok FROM rate_limiter.rate_limit('send', 'counted victim')").fetchone() == (True,)
        for i in range(200):
            c.execute("SELECT rate_limiter.rate_limit('send', %s)", (f"filler {i}",))
        for victim, left in (("counted victim", 1), ("new victim", 2)):
            answers = [c.execute("SELECT ok FROM rate_limiter.rate_limit('send', %s)", (victim,)).fetchone()[0]
                       for _ in range(3)]
            assert answers == [True] * left + [False] * (3 - left), victim
    small.stop()


def test_no_role_reads_the_secret_that_places_keys(clusters):
    """The keyed hash's secret is a file of the data directory, readable by its owner alone,
    which SQL reaches only through superuser functions."""
    import os
    import stat
    small = small_cluster(clusters, 64)
    mode = stat.S_IMODE(os.stat(f"{small.dir}/rate_limiter_memory.secret").st_mode)
    assert mode == 0o600 and os.path.getsize(f"{small.dir}/rate_limiter_memory.secret") == 16
    with small.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute("CREATE ROLE caller LOGIN")
        c.execute("GRANT USAGE ON SCHEMA rate_limiter TO caller")
    with small.connect(user="caller") as c:
        with pytest.raises(errors.InsufficientPrivilege):
            c.execute("SELECT pg_read_binary_file('rate_limiter_memory.secret')")
    small.stop()


def test_a_redefined_limit_keeps_its_keys_counted_under_the_new_period(clusters):
    """A key drained under a window of a minute, its limit then given windows of an hour: two
    minutes on, its entry is not given to a new key (it still counts under the hour), so the
    key stays drained, and new keys past the table are counted in rows."""
    small = small_cluster(clusters, 64)
    with small.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(f"SET rate_limiter.fake_now = '{NOW}'")
        define(c, "m", "fixed window", rate=1, period="1 minute", start=NOW, durable=False)
        assert c.execute("SELECT ok FROM rate_limiter.rate_limit('m', 'k')").fetchone() == (True,)
        define(c, "m", "fixed window", rate=1, period="1 hour", start=NOW, durable=False)
        c.execute("SET rate_limiter.fake_now = '2030-01-01 00:02:00+00'")
        for i in range(100):
            assert c.execute("SELECT ok FROM rate_limiter.rate_limit('m', %s)", (f"n{i}",)).fetchone() == (True,)
        assert c.execute("SELECT ok FROM rate_limiter.rate_limit('m', 'k')").fetchone() == (False,), "still drained"
        assert c.execute("SELECT count(*) > 0 FROM rate_limiter.state WHERE key = 'k'").fetchone() == (False,), \
            "k kept its entry"
    small.stop()


@every_version
def test_a_limit_redefined_shorter_gives_its_full_keys_entries_away(clusters):
    """40 keys drained under windows of an hour, the limit then given windows of a second:
    two seconds on, each of them equals an absent key, so 60 new keys find the room of all 64
    entries. (Kept to the old windows' end, the 40 would leave 24 entries, and 36 of the new
    keys at least in rows.)"""
    small = small_cluster(clusters, 64)
    with small.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(WALK)
        c.execute(f"SET rate_limiter.fake_now = '{NOW}'")
        define(c, "m", "fixed window", rate=1, period="1 hour", start=NOW, durable=False)
        assert walk(c, "m", 40, 1) == [40]
        define(c, "m", "fixed window", rate=1, period="1 second", start=NOW, durable=False)
        c.execute("SET rate_limiter.fake_now = '2030-01-01 00:00:02+00'")
        c.execute("SELECT rate_limiter.define('n', 'fixed window', 1, '1 hour', start => %s, durable => false)", (NOW,))
        assert walk(c, "n", 60, 1) == [60]
        in_rows = c.execute("SELECT count(*) FROM rate_limiter.state WHERE name = 'n'").fetchone()[0]
        assert in_rows < 36, f"{in_rows} of 60 new keys in rows: the redefined keys kept their entries"
    small.stop()


@every_version
def test_each_database_keeps_its_share_and_a_module_not_loaded_says_so(clusters):
    """A database beyond its share of a 64-entry table counts its new keys in rows while
    another database still has entries; without the library preloaded a memory limit says
    how to turn memory limits on."""
    small = small_cluster(clusters, 64)
    config = """'{"kind": "fixed window", "rate": 1, "period": "1 hour", "start": 1893456000000, "durable": false}'"""
    with small.connect() as admin:
        admin.execute("CREATE DATABASE other")
    for dbname in ("postgres", "other"):
        with small.connect(dbname) as c:
            c.execute("CREATE EXTENSION rate_limiter")
            c.execute(f"ALTER DATABASE {dbname} SET rate_limiter.fake_now = '{NOW}'")
    with small.connect() as c, small.connect("other") as o:
        take = f"SELECT ok FROM rate_limiter.rate_limit('m', %s, config => {config})"
        for i in range(60):
            assert c.execute(take, (f"k{i}",)).fetchone() == (True,)
        assert c.execute("SELECT count(*) FROM rate_limiter.state").fetchone() == (60 - 64 * 7 // 8,)
        assert c.execute(take, ("k0",)).fetchone() == (False,), "a counted key still answers"
        for i in range(8):
            assert o.execute(take, (f"k{i}",)).fetchone() == (True,)
        assert o.execute("SELECT count(*) FROM rate_limiter.state").fetchone() == (0,), \
            "the other database's keys found the entries the first one could not take"
    small.stop()
    small.settings = ["-c rate_limiter.prune_interval=0"]
    small.start()
    with small.connect() as c:
        with pytest.raises(errors.ObjectNotInPrerequisiteState) as raised:
            c.execute(f"SELECT rate_limiter.rate_limit('m', 'k', config => {config})")
        assert "shared_preload_libraries" in raised.value.diag.message_hint


def shared_memory_touched(pid):
    """The bytes of shared memory process `pid` has touched (its RssShmem)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssShmem:"))


def test_a_million_keys_fit_the_default_table_without_a_refusal_or_a_row(clusters):
    """The default rate_limiter.memory_keys holds a million keys of one database in shared
    memory: each admitted once, none refused, none counted in a row, and each denied after
    (a sample). Snapshots off, so that the rounds do not write a million rows meanwhile.
    The start wrote only the partitions' locks and index, not the 140 MB of the table (a
    page is committed when first touched; docs/memory-limits.md): the postmaster, which made
    it, has touched less than half of it, the server's own shared memory included (4 kB
    pages: huge pages, which RssShmem does not count, are reserved whole)."""
    server = clusters("memkeys", PORTS["memkeys"], ["-c shared_preload_libraries=rate_limiter",
                                                    "-c rate_limiter.memory_snapshot=0", "-c huge_pages=off"]).init().start()
    with server.connect() as c:
        assert c.execute("SHOW rate_limiter.memory_keys").fetchone() == ("1200000",)
        table = c.execute("SELECT size FROM pg_shmem_allocations WHERE name = 'rate_limiter memory keys'").fetchone()[0]
        touched = shared_memory_touched(server.postmaster())
        assert touched < table / 2, f"the postmaster touched {touched} bytes of shared memory at start, the table is {table}"
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(f"SET rate_limiter.fake_now = '{NOW}'")
        define(c, "m", "fixed window", rate=1, period="1 hour", start=NOW, durable=False)
        c.execute(WALK)
        assert walk(c, "m", 1_000_000, 1) == [1_000_000]
        assert walk(c, "m", 10_000, 1) == [0]
        assert c.execute("SELECT count(*) FROM rate_limiter.state").fetchone() == (0,)
        assert c.execute("SELECT memory_in_rows FROM rate_limiter.stats WHERE name = 'm'").fetchone() == (0,)
    server.stop()
    # The clean shutdown found the keys through the partitions' index, reading no entry of
    # a key never used: the million saved for the next start.
    assert "rate_limiter: 1000000 memory limit keys saved for the next start" in server.log()


@every_version
def test_rate_limit_all_decides_a_memory_part_counted_in_its_row_with_the_others_all_or_none(clusters):
    """A memory part whose key found no room is decided as a durable part of rate_limit_all:
    taken with the others, or, when another part denies, not at all (its row untouched), and
    exactly when its own row runs out."""
    small = small_cluster(clusters, 64)
    with small.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(f"SET rate_limiter.fake_now = '{NOW}'")
        define(c, "mem", "fixed window", rate=2, period="1 hour", start=NOW, durable=False)
        define(c, "rows", "fixed window", rate=1, period="1 hour", start=NOW)
        for i in range(80):
            c.execute("SELECT rate_limiter.rate_limit('mem', %s)", (f"filler {i}",))
        in_row = c.execute("SELECT key FROM rate_limiter.state WHERE name = 'mem' ORDER BY key LIMIT 1").fetchone()[0]
        both = f'[{{"name": "mem", "key": "{in_row}"}}, {{"name": "rows", "key": "x"}}]'
        row = "SELECT value FROM rate_limiter.state WHERE name = 'mem' AND key = %s"
        assert c.execute(row, (in_row,)).fetchone() == (1,)
        assert c.execute("SELECT ok FROM rate_limiter.rate_limit_all(%s)", (both,)).fetchone() == (True,)
        assert c.execute(row, (in_row,)).fetchone() == (0,), "taken from its row"
        c.execute("SELECT rate_limiter.reset_rate_limit('mem', %s)", (in_row,))
        assert c.execute("SELECT ok FROM rate_limiter.rate_limit_all(%s)", (both,)).fetchone() == (False,), \
            "'rows' denies: nothing is taken"
        assert c.execute("SELECT count(*) FROM rate_limiter.state WHERE name = 'mem' AND key = %s",
                         (in_row,)).fetchone() == (0,)
        assert c.execute("SELECT remaining FROM rate_limiter.check_rate_limit('mem', %s, 0)", (in_row,)).fetchone() == (2,)
    small.stop()


@every_version
def test_a_backend_past_its_32_escrows_keeps_its_next_keys_calls_as_committed(test_cluster, database_name):
    """docs/memory-limits.md, "The pool": one transaction with calls of 40 keys in flight. The
    first 32 borrow this backend's escrows and roll back with it; the next 8 find none, and
    are decided on the committed state and kept as committed: counted at once (never admitted
    twice, even within the transaction), but the rollback gives them nothing back."""
    with session(database_name, server=test_cluster) as c:
        define(c, "pool", "fixed window", rate=2, period="1 hour", start=NOW, durable=False)
        call = "SELECT ok FROM rate_limiter.rate_limit('pool', %s)"
        c.execute("BEGIN")
        first = [c.execute(call, (f"k{i}",)).fetchone()[0] for i in range(40)]
        second = [c.execute(call, (f"k{i}",)).fetchone()[0] for i in range(40)]
        third = [c.execute(call, (f"k{i}",)).fetchone()[0] for i in (0, 39)]
        c.execute("ROLLBACK")
        left = [remaining(c, "pool", f"k{i}") for i in range(40)]
    assert (first, second, third) == ([True] * 40, [True] * 40, [False, False])
    assert left == [2] * 32 + [0] * 8


@every_version
def test_one_transaction_locks_a_bounded_number_of_keys_counted_in_rows(clusters):
    """Issue 64, F1: once keys find no room, each key called is looked for in its row under a
    lock held to the transaction's end. One transaction of a role with EXECUTE alone called
    13,000 such keys and filled the cluster's lock table. Now it locks at most
    rate_limiter.max_memory_key_locks_per_transaction (32) of them and is refused with 53400
    past that, while a key that finds its entry holds no lock; other sessions go on."""
    small = small_cluster(clusters, 64)
    with small.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(f"ALTER DATABASE postgres SET rate_limiter.fake_now = '{NOW}'")
    with small.connect() as c:
        define(c, "m", "fixed window", rate=5, period="1 hour", start=NOW, durable=False)
        c.execute("SET synchronous_commit = off")
        for i in range(100):
            c.execute("SELECT rate_limiter.rate_limit('m', %s)", (f"filler {i}",))
        in_memory = c.execute("SELECT key FROM rate_limiter.state WHERE name = 'm'").fetchall()
        assert len(in_memory) >= 100 - 64, "the table is full: keys are counted in rows"
        # The memory keys' locks: advisory tags whose field 4, objsubid here, is 0x524d ("RM").
        key_locks = """SELECT count(*) FROM pg_locks
                       WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND objsubid = 21069"""
        c.execute("BEGIN")
        # A filler in shared memory (no row) holds no lock; one in its row holds one.
        in_entries = c.execute("""SELECT 'filler ' || g FROM generate_series(0, 99) g
                                  WHERE NOT EXISTS (SELECT FROM rate_limiter.state WHERE key = 'filler ' || g)
                                  LIMIT 3""").fetchall()
        for (key,) in in_entries:
            c.execute("SELECT rate_limiter.rate_limit('m', %s)", (key,))
        assert c.execute(key_locks).fetchone() == (0,)
        admitted = 0
        with pytest.raises(errors.ConfigurationLimitExceeded, match="max_memory_key_locks_per_transaction") as refused:
            for i in range(1000):
                c.execute("SELECT rate_limiter.rate_limit('m', %s)", (f"new {i}",))
                admitted += 1
        assert admitted == 32, admitted
        assert refused.value.diag.message_hint.startswith("A key of a memory limit that finds no room")
        c.execute("ROLLBACK")
        # In a savepoint rolled back, its keys' locks are released and no longer counted.
        c.execute("BEGIN")
        c.execute("SAVEPOINT s")
        for i in range(30):
            c.execute("SELECT rate_limiter.rate_limit('m', %s)", (f"again {i}",))
        c.execute("ROLLBACK TO SAVEPOINT s")
        assert c.execute(key_locks).fetchone() == (0,)
        for i in range(32):
            c.execute("SELECT rate_limiter.rate_limit('m', %s)", (f"again {i}",))
        assert c.execute(key_locks).fetchone() == (32,)
        with small.connect() as other:
            assert other.execute("SELECT ok FROM rate_limiter.rate_limit('m', 'another session')").fetchone() == (True,)
        c.execute("COMMIT")
    small.stop()


@every_version
def test_an_override_or_a_redefinition_with_overrides_pins_no_key_of_its_limit(clusters):
    """Issue 64, F6: any override or tier change of a memory limit, or a redefinition of one
    with overrides, kept every key of that limit in shared memory until it was called again
    (its expiry infinite): after one override() of an unrelated key, 40 keys whose windows had
    ended still held 40 of 64 entries, and new keys of another limit were counted in rows.
    Now each key is taken on under every config a key of the limit may have: two seconds on,
    the 40 equal absent keys and give their entries away."""
    small = small_cluster(clusters, 64)
    with small.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(WALK)
        for round, change in enumerate([
                "SELECT rate_limiter.override('{m}', 'someone else', rate => 2)",
                "SELECT rate_limiter.define_tier('{m}', 'pro', rate => 3)",
                "SELECT rate_limiter.define('{m}', 'fixed window', 1, '1 second', start => '{now}', durable => false)"]):
            m, n, now = f"m{round}", f"n{round}", f"2030-01-0{round + 1} 00:00:00+00"
            c.execute(f"SET rate_limiter.fake_now = '{now}'")
            define(c, m, "fixed window", rate=1, period="1 second", start=NOW, durable=False)
            if round == 2:
                c.execute(f"SELECT rate_limiter.override('{m}', 'someone else', rate => 2)")
            assert walk(c, m, 40, 1) == [40]
            c.execute(change.format(m=m, now=NOW))
            c.execute(f"SET rate_limiter.fake_now = '2030-01-0{round + 1} 00:00:02+00'")
            c.execute("SELECT rate_limiter.define(%s, 'fixed window', 1, '1 hour', start => %s, durable => false)", (n, NOW))
            assert walk(c, n, 60, 1) == [60]
            in_rows = c.execute("SELECT count(*) FROM rate_limiter.state WHERE name = %s", (n,)).fetchone()[0]
            assert in_rows < 36, f"{change}: {in_rows} of 60 new keys in rows: the limit's keys kept their entries"
            c.execute("DELETE FROM rate_limiter.limits")
            c.execute("DELETE FROM rate_limiter.state")
    small.stop()


@every_version
def test_a_database_on_0_6_0s_sql_keeps_its_keys_counted_in_rows_across_a_restart(clusters):
    """Issue 64, F3: under this library, a database not yet updated from 0.6.0 has no
    snapshot log to mark that keys were counted in rows; after a clean restart, once the
    entries that had crowded a key out were free again, its row was forgotten and the key
    counted afresh in memory (a window of 3 admitted 3 more). Without the log, its keys not in
    memory are looked for in their rows."""
    small = small_cluster(clusters, 64)
    with small.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter VERSION '0.6.0'")
        c.execute(f"ALTER DATABASE postgres SET rate_limiter.fake_now = '{NOW}'")
    with small.connect() as c:
        define(c, "fillers", "fixed window", rate=1, period="1 second", start=NOW, durable=False)
        for i in range(100):
            c.execute("SELECT rate_limiter.rate_limit('fillers', %s)", (f"f{i}",))
        define(c, "m", "fixed window", rate=3, period="1 hour", start=NOW, durable=False)
        assert [c.execute("SELECT ok FROM rate_limiter.rate_limit('m', 'victim')").fetchone()[0] for _ in range(4)] == \
            [True, True, True, False]
        assert c.execute("SELECT count(*) FROM rate_limiter.state WHERE key = 'victim'").fetchone() == (1,), "in its row"
    small.stop("fast")
    small.start()
    with small.connect() as c:
        # The fillers' windows ended: their entries are free for the taking.
        c.execute("SET rate_limiter.fake_now = '2030-01-01 00:00:05+00'")
        assert c.execute("SELECT ok FROM rate_limiter.rate_limit('m', 'victim')").fetchone() == (False,), "3 of 3 taken"
    small.stop()


@every_version
def test_entries_kept_for_rate_limit_all_are_given_back_when_it_fails(clusters):
    """rate_limit_all keeps its memory parts' entries from being given away while it decides;
    an error before it has (here 25006, a durable part in a read-only transaction) gave them
    back only when the same key was called again, so failed calls of fresh keys filled the
    database's share for good and every later key was counted in its row."""
    small = small_cluster(clusters, 64)
    with small.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(f"SET rate_limiter.fake_now = '{NOW}'")
        define(c, "m", "fixed window", rate=5, period="1 hour", start=NOW, durable=False)
        define(c, "rows", "fixed window", rate=5, period="1 hour", start=NOW)
        for n in range(10):  # 100 fresh keys, more than the table's 64 entries
            parts = [{"name": "m", "key": f"failed {n} {i}"} for i in range(10)] + [{"name": "rows", "key": "k"}]
            c.execute("BEGIN READ ONLY")
            with pytest.raises(errors.ReadOnlySqlTransaction):
                c.execute("SELECT rate_limiter.rate_limit_all(%s)", (json.dumps(parts),))
            c.execute("ROLLBACK")
        assert [c.execute("SELECT ok FROM rate_limiter.rate_limit('m', %s)", (f"later {i}",)).fetchone()[0]
                for i in range(20)] == [True] * 20
        assert c.execute("SELECT count(*) FROM rate_limiter.state").fetchone() == (0,), "later keys counted in rows"
    small.stop()
