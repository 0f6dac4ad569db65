"""A hot limit, and a memory limit, against its oracle: the same random single-session sequence of calls, checks,
reads, resets, redefinitions (capacity up and down, into and out of hot mode), overrides of
the key set and removed, transactions
(READ COMMITTED and REPEATABLE READ), savepoints, clock steps, evictions of the escrow and,
on a cluster of its own, crashes, run on a hot limit in one database and on the same limit,
never hot, in another, must give the same answers call by call and the same final state. The one
difference allowed is the documented refusal (0A000) of a hot call in the transaction that
reset or changed the limit; the call is then rolled back to its savepoint on both sides.
Hypothesis draws the sequences (a fixed seed, so a run can be repeated) and shrinks a
failure to a minimal one. Two databases, because a change of a hot limit waits for every
transaction with a call in flight in its database, the oracle's included."""

import uuid

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg import errors

from properties import drawn, examples_on
from clusters import PORTS, every_version

START_MS = 1_893_456_000_000  # 2030-01-01 00:00:00+00

OPS = st.one_of(
    # No take of 0: on a row-based limit it writes the key's state (full, at the capacity of
    # the moment), on a hot one nothing, which a raised capacity then shows (docs/hot-limits.md).
    st.tuples(st.just("take"), st.sampled_from([1, 1, 2, 3, 5])),
    st.tuples(st.just("check"), st.sampled_from([0, 1, 4])),
    st.tuples(st.just("value")),
    st.tuples(st.just("reset")),
    st.tuples(st.just("define"), st.sampled_from([3, 5, 8]), st.booleans()),
    # The key's own numbers (docs/api.md, Overrides): its log folded under the old ones.
    st.tuples(st.just("override"), st.sampled_from([1, 2, 4]), st.sampled_from([3, 8])),
    st.tuples(st.just("remove_override")),
    st.tuples(st.just("begin"), st.sampled_from(["", " ISOLATION LEVEL REPEATABLE READ"])),
    st.tuples(st.just("commit")),
    st.tuples(st.just("rollback")),
    st.tuples(st.just("savepoint")),
    st.tuples(st.just("rollback_to")),
    st.tuples(st.just("release")),
    st.tuples(st.just("tick"), st.sampled_from([0, 700, 6000])),
    # Other hot keys called from another session until the escrow of 'k' is given away, as
    # one that stays idle is: its next call loads it again from the base row and the log.
    st.tuples(st.just("evict")),
)
# A memory limit takes credits too (a hot one refuses them), each in a transaction of its
# own: within a transaction a memory limit's credit counts for no call until it commits, where
# a row-based one's counts for that transaction's next calls (docs/memory-limits.md).
MEMORY_OPS = st.one_of(OPS, st.tuples(st.just("credit"), st.sampled_from([1, 2, 4])))
# A crash of the cluster (immediate stop, then start): both sides lose their open transaction,
# and the escrow with shared memory.
OPS_WITH_CRASHES = st.one_of(OPS, st.tuples(st.just("crash")))
EVICTING = "evictor"


def set_clock(conn, ms):
    conn.execute("SELECT set_config('rate_limiter.fake_now', to_timestamp(%s::float8 / 1000)::text, false)", (ms,))


def rounded(row):
    return tuple(round(v, 6) if isinstance(v, float) else v for v in row)


class Side:
    """One database's session and its limit: `mode` says what define() makes it, "hot"
    (whenever a define op says so), "memory" (always) or None (a row-based limit)."""

    def __init__(self, conn, name, mode):
        self.conn, self.name, self.mode = conn, name, mode
        self.dbname = conn.info.dbname

    def execute(self, sql, args=()):
        return self.conn.execute(sql, args)

    def define(self, capacity, hot):
        self.execute("SELECT rate_limiter.define(%s, 'token bucket', 2, '10 seconds', capacity => %s, hot => %s, "
                     "durable => %s)", (self.name, capacity, hot and self.mode == "hot", self.mode != "memory"))

    def call(self, op):
        kind = op[0]
        if kind == "take":
            return rounded(self.execute("SELECT ok, retry_after, remaining, reset_after, granted, reason "
                                        "FROM rate_limiter.rate_limit(%s, 'k', %s)", (self.name, op[1])).fetchone())
        if kind == "check":
            return rounded(self.execute("SELECT ok, retry_after, remaining FROM rate_limiter.check_rate_limit(%s, 'k', %s)",
                                        (self.name, op[1])).fetchone())
        if kind == "value":
            # Clamped at the capacity: a row-based limit keeps a level above a lowered capacity
            # until its next call (which clamps it), where a hot key without a base row has none.
            return rounded(self.execute("SELECT least(value, (effective_config->>'capacity')::float8) "
                                        "FROM rate_limiter.rate_limit_value(%s, 'k')", (self.name,)).fetchone())
        if kind == "reset":
            return self.execute("SELECT rate_limiter.reset_rate_limit(%s, 'k')", (self.name,)).fetchone()
        if kind == "credit":
            return rounded(self.execute("SELECT ok, remaining, granted FROM rate_limiter.credit(%s, 'k', %s)",
                                        (self.name, op[1])).fetchone())
        if kind == "define":
            return self.define(op[1], op[2])
        if kind == "override":
            return self.execute("SELECT rate_limiter.override(%s, 'k', rate => %s, capacity => %s)",
                                (self.name, op[1], op[2])).fetchone()
        if kind == "remove_override":
            return self.execute("SELECT rate_limiter.remove_override(%s, 'k')", (self.name,)).fetchone()
        raise AssertionError(op)


def run(hot, oracle, ops, cluster):
    """Runs `ops` on both sides; returns what differed, or None. `cluster` evicts the hot
    side's escrows and crashes the server under both."""
    depth, savepoints, now = False, 0, START_MS
    for side in (hot, oracle):
        side.define(5, True)
    for step, op in enumerate(ops):
        kind = op[0]
        if kind == "crash":
            cluster.crash()
            depth, savepoints = False, 0
            for side in (hot, oracle):
                side.conn.close()
                side.conn = cluster.session(side.dbname)
                set_clock(side.conn, now)
            continue
        if kind == "evict":
            # Outside transactions only: after a reset in one, the evicting calls would wait.
            if not depth:
                cluster.evict()
            continue
        if kind == "credit" and depth:
            continue  # see MEMORY_OPS
        if kind == "tick":
            # Between transactions, so that no rollback takes a step back.
            if not depth:
                now += op[1]
                for side in (hot, oracle):
                    set_clock(side.conn, now)
            continue
        statements = {"begin": ("BEGIN" + (op[1] if kind == "begin" else ""), not depth), "commit": ("COMMIT", depth), "rollback": ("ROLLBACK", depth),
                      "savepoint": (f"SAVEPOINT s{savepoints}", depth),
                      "rollback_to": (f"ROLLBACK TO SAVEPOINT s{savepoints - 1}", savepoints > 0),
                      "release": (f"RELEASE SAVEPOINT s{savepoints - 1}", savepoints > 0)}
        if kind in statements:
            sql, possible = statements[kind]
            if not possible:
                continue
            for side in (hot, oracle):
                side.execute(sql)
            if kind == "begin":
                depth = True
            elif kind in ("commit", "rollback"):
                depth, savepoints = False, 0
            elif kind == "savepoint":
                savepoints += 1
            elif kind == "release":
                savepoints -= 1
            continue
        # Each call in a savepoint inside a transaction, so that an error (the same on both
        # sides, or the hot side's documented refusal) leaves the rest of it as it was.
        answers = []
        for side in (hot, oracle):
            if depth:
                side.execute("SAVEPOINT call")
            try:
                answers.append(side.call(op))
            except psycopg.Error as error:
                answers.append(("error", error.sqlstate))
                if depth:
                    side.execute("ROLLBACK TO SAVEPOINT call")
        refused = answers[0] == ("error", "0A000") and answers[1][0] != "error"
        if refused:
            # The documented refusal: a hot call after a reset or change in this transaction.
            assert kind == "take" and depth, f"step {step}: {op} refused"
            oracle.execute("ROLLBACK TO SAVEPOINT call")
        if depth:
            for side in (hot, oracle):
                side.execute("RELEASE SAVEPOINT call")
        if refused:
            continue
        if answers[0] != answers[1]:
            return f"step {step}: {op}: hot {answers[0]}, oracle {answers[1]}"
    if depth:
        for side in (hot, oracle):
            side.execute("COMMIT")
    final = [(side.call(("check", 0)), side.call(("value",))) for side in (hot, oracle)]
    if final[0] != final[1]:
        return f"at the end: hot {final[0]}, oracle {final[1]}"
    return None


class Cluster:
    """The server both databases are on: sessions on it, the eviction of the hot side's
    escrows, and (on a cluster of the test's own) a crash."""

    def __init__(self, server, hot_db, crashes=False):
        self.server, self.hot_db, self.crashes = server, hot_db, crashes
        self.evicting = self.session(hot_db)
        self.evicting.execute(f"SELECT rate_limiter.define('{EVICTING}', 'token bucket', 1, '1 hour', hot => true)")

    def session(self, dbname):
        conn = self.server.connect(dbname)
        # Thousands of limit names: kept out of the statistics, whose room for names in
        # shared memory the other tests of this server need.
        conn.execute("SET rate_limiter.track_stats = off")
        return conn

    def evict(self):
        # More keys than every entry: each call of count 0 claims the entry used longest ago.
        for i in range(int(self.evicting.execute("SHOW rate_limiter.hot_keys").fetchone()[0])):
            self.evicting.execute("SELECT rate_limiter.rate_limit(%s, %s, 0)", (EVICTING, f"e{i}"))

    def crash(self):
        assert self.crashes, "crashes are drawn only on a cluster of the test's own"
        self.evicting.close()
        self.server.stop("immediate")
        self.server.start()
        self.evicting = self.session(self.hot_db)


def sequences_of(lists, examples, hot_conn, oracle_conn, cluster, mode="hot"):
    """Hypothesis's runs of the sequences `lists` draws, each against a fresh limit; a crash
    replaces the sessions, so the latest are kept in `sides`."""
    sides = {"hot": hot_conn, "oracle": oracle_conn}

    @drawn(examples)
    @given(lists)
    def sequences(ops):
        name = "o_" + uuid.uuid4().hex[:10]
        for conn in sides.values():
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")
            set_clock(conn, START_MS)
        hot, oracle = Side(sides["hot"], name, mode), Side(sides["oracle"], name, None)
        try:
            difference = run(hot, oracle, ops, cluster)
        finally:
            sides["hot"], sides["oracle"] = hot.conn, oracle.conn
        assert difference is None, difference

    sequences()


def with_oracle_database(server, database_name, body):
    oracle_db = database_name + "_oracle"
    with server.connect() as admin:
        admin.execute(f"CREATE DATABASE {oracle_db}")
    try:
        with server.connect(oracle_db) as c:
            c.execute("CREATE EXTENSION rate_limiter")
        body(oracle_db)
    finally:
        with server.connect() as admin:
            admin.execute(f"DROP DATABASE {oracle_db} WITH (FORCE)")


@every_version
def test_a_hot_limit_answers_as_its_row_based_oracle(test_cluster, database_name, pg):
    def body(oracle_db):
        cluster = Cluster(test_cluster, database_name)
        with cluster.session(database_name) as h, cluster.session(oracle_db) as o:
            sequences_of(st.lists(OPS, min_size=5, max_size=40), examples_on(pg, 3000), h, o, cluster)
        cluster.evicting.close()

    with_oracle_database(test_cluster, database_name, body)


@every_version
def test_a_memory_limit_answers_as_its_row_based_oracle(test_cluster, database_name, pg):
    """The same sequences on a memory limit (durable => false, docs/memory-limits.md), with
    credits, and its own documented refusal: a call after a reset or change of it in the
    transaction."""
    def body(oracle_db):
        cluster = Cluster(test_cluster, database_name)
        with cluster.session(database_name) as m, cluster.session(oracle_db) as o:
            sequences_of(st.lists(MEMORY_OPS, min_size=5, max_size=40), examples_on(pg, 1500), m, o, cluster,
                         mode="memory")
        cluster.evicting.close()

    with_oracle_database(test_cluster, database_name, body)


@every_version
def test_a_hot_limit_answers_as_its_oracle_across_crashes(clusters):
    """Fewer sequences, each with at least one crash: a crash takes about a second."""
    server = clusters("hot_oracle", PORTS["hot_oracle"], ["-c shared_preload_libraries=rate_limiter",
                                                           "-c rate_limiter.prune_interval=0"])
    server.init().start()
    with server.connect() as admin:
        admin.execute("CREATE DATABASE hot")
    with server.connect("hot") as c:
        c.execute("CREATE EXTENSION rate_limiter")

    def body(oracle_db):
        cluster = Cluster(server, "hot", crashes=True)
        crashing = st.lists(OPS_WITH_CRASHES, min_size=5, max_size=30).filter(
            lambda ops: any(op[0] == "crash" for op in ops))
        sequences_of(crashing, 12, cluster.session("hot"), cluster.session(oracle_db), cluster)
        cluster.evicting.close()

    with_oracle_database(server, "hot", body)
