"""What a DBA does to a database that holds rate_limiter: change the tables by mistake,
reindex and rewrite them under load, replicate them logically and physically, dump and
restore, crash the server, let rows expire. Each runs against real clusters."""

import os
import subprocess
import threading
import time
import uuid

import pytest
from psycopg import errors

from calls import amcheck_clean
from clusters import PG_BIN, PORTS, as_postgres, connect, every_version, kill_9_under_load, on_assert_server, rows_reach, wait_for

NOW = "2030-01-01 00:00:00+00"


SHAPE_CHANGES = [
    "ALTER TABLE rate_limiter.state ADD COLUMN note text",
    "ALTER TABLE rate_limiter.state ADD COLUMN n integer DEFAULT 7",
    "ALTER TABLE rate_limiter.state DROP COLUMN ts",
    "ALTER TABLE rate_limiter.state ALTER COLUMN value TYPE numeric",
    "ALTER TYPE rate_limiter.decision ADD ATTRIBUTE extra integer",
    "ALTER TYPE rate_limiter.decision DROP ATTRIBUTE granted",
    "ALTER TYPE rate_limiter.decision RENAME ATTRIBUTE granted TO taken",
    # limits and blocks, read column by column, as a determined DBA would change them: CHECK
    # constraints dropped first.
    "ALTER TABLE rate_limiter.limits DROP CONSTRAINT limits_period_check, ALTER COLUMN period TYPE text",
    "ALTER TABLE rate_limiter.limits DROP CONSTRAINT limits_rate_check, DROP CONSTRAINT limits_capacity_is_rate, "
    "ALTER COLUMN rate TYPE numeric",
    "ALTER TABLE rate_limiter.limits DROP COLUMN deny_cache CASCADE",
    "ALTER TABLE rate_limiter.limits DROP COLUMN mode CASCADE, ADD COLUMN mode text NOT NULL DEFAULT 'all'",
    "ALTER TABLE rate_limiter.limits RENAME COLUMN capacity TO burst",
    "ALTER TABLE rate_limiter.blocks ALTER COLUMN until TYPE text",
    "ALTER TABLE rate_limiter.blocks DROP COLUMN until, ADD COLUMN until timestamptz NOT NULL DEFAULT 'infinity'",
    # ... and their unique indexes, looked up by their names, on other columns.
    "ALTER TABLE rate_limiter.limits DROP CONSTRAINT limits_pkey, ADD CONSTRAINT limits_pkey PRIMARY KEY (kind, name)",
    "ALTER TABLE rate_limiter.blocks DROP CONSTRAINT blocks_key_name_key, "
    "ADD CONSTRAINT blocks_key_name_key UNIQUE NULLS NOT DISTINCT (name, key)",
    # ... or partial, and the state's on its columns in another order (a read compared the key
    # with the name), or a CHECK its direct writes would not run.
    "ALTER TABLE rate_limiter.limits DROP CONSTRAINT limits_pkey; "
    "CREATE UNIQUE INDEX limits_pkey ON rate_limiter.limits (name) WHERE rate > 1e9",
    "ALTER TABLE rate_limiter.state DROP CONSTRAINT state_key_name_shard_key, "
    "ADD CONSTRAINT state_key_name_shard_key UNIQUE NULLS NOT DISTINCT (name, key, shard)",
    "ALTER TABLE rate_limiter.state ADD CONSTRAINT small CHECK (value < 1e300)",
]


@pytest.mark.parametrize("ddl", SHAPE_CHANGES)
def test_a_shape_change_is_55000_with_a_hint_never_a_crash(database_name, ddl):
    with connect(dbname=database_name) as admin, connect(dbname=database_name) as app:
        admin.execute("SELECT rate_limiter.define('s', 'token bucket', 5, '1 hour')")
        call = "SELECT ok FROM rate_limiter.rate_limit('s', 'k')"
        assert app.execute(call).fetchone() == (True,)  # the row exists; app has cached everything
        admin.execute(ddl)
        for sql in (call, "SELECT ok FROM rate_limiter.rate_limit('s', 'new key')",
                    "SELECT ok FROM rate_limiter.check_rate_limit('s', 'k')"):
            with pytest.raises(errors.ObjectNotInPrerequisiteState) as raised:
                app.execute(sql)
            assert raised.value.diag.message_hint
        assert admin.execute("SELECT 1").fetchone() == (1,), "the server is still up"


@pytest.mark.parametrize("ddl", [d for d in SHAPE_CHANGES if "rate_limiter.decision" in d])
def test_a_memory_call_sees_its_row_type_changed(database_name, ddl):
    """A memory limit's call checks the decision type's descriptor once per cache generation
    (issue 66), not at each call: a change committed in another session still reaches the
    next call of a session that checked it before."""
    with connect(dbname=database_name) as admin, connect(dbname=database_name) as app:
        admin.execute("SELECT rate_limiter.define('m', 'token bucket', 5, '1 hour', durable => false)")
        call = "SELECT ok FROM rate_limiter.rate_limit('m', 'k')"
        assert app.execute(call).fetchone() == (True,)
        admin.execute(ddl)
        with pytest.raises(errors.ObjectNotInPrerequisiteState, match="rate_limiter.decision") as raised:
            app.execute(call)
        assert raised.value.diag.message_hint


def test_a_column_type_changed_under_sql_is_55000_never_a_crash(database_name):
    """A table read through SPI (the leases) with a column of another type than the one read
    by pointer: a uuid read from a bigint dereferenced the integer."""
    with connect(dbname=database_name) as admin:
        admin.execute("SELECT rate_limiter.define('c', 'concurrency', 3, '1 hour')")
        admin.execute("SELECT rate_limiter.acquire('c', 'k', lease => '1 hour')")
        admin.execute("ALTER TABLE rate_limiter.leases ALTER COLUMN lease_id TYPE bigint USING 1")
        with pytest.raises(errors.ObjectNotInPrerequisiteState, match="rate_limiter.leases"):
            admin.execute("SELECT rate_limiter.acquire('c', 'k', lease => '1 hour')")
        assert admin.execute("SELECT 1").fetchone() == (1,), "the server is still up"


def pg_repack(database_name, *args):
    return subprocess.run([f"{PG_BIN}/pg_repack", "-d", database_name, "--table", "rate_limiter.state", *args],
                          capture_output=True, text=True, check=True).stderr


class Load:
    """4 sessions calling rate_limit on 20 keys of one limit until stopped; `granted` is what
    each key was granted."""

    def __init__(self, cluster, database_name, limit):
        self.cluster, self.database, self.limit = cluster, database_name, limit
        self.keys = [f"k{i}" for i in range(20)]
        self.granted = {k: 0 for k in self.keys}
        self.lock, self.stop, self.failures = threading.Lock(), threading.Event(), []
        self.threads = [threading.Thread(target=self.work, args=(n,)) for n in range(4)]

    def work(self, n):
        try:
            with self.cluster.connect(self.database) as c:
                i = n
                while not self.stop.is_set():
                    key = self.keys[i % len(self.keys)]
                    i += 1
                    ok, got = c.execute("SELECT ok, granted FROM rate_limiter.rate_limit(%s, %s)",
                                        (self.limit, key)).fetchone()
                    assert ok
                    with self.lock:
                        self.granted[key] += got
        except Exception as e:  # noqa: BLE001 - reported by finish
            self.failures.append(e)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def check(self, admin, capacity):
        """Stop; the state shows exactly what was granted."""
        self.__exit__()
        assert not self.failures, self.failures
        assert sum(self.granted.values()) > 100, "the load ran"
        stored = dict(admin.execute("SELECT key, %s - value FROM rate_limiter.state WHERE name = %s",
                                    (capacity, self.limit)).fetchall())
        assert stored == {k: v for k, v in self.granted.items() if v}, "state shows exactly what was granted"


@every_version
def test_reindex_vacuum_full_and_cluster_under_load_keep_every_token(test_cluster, database_name):
    with test_cluster.connect(database_name) as admin:
        admin.execute(f"ALTER DATABASE {database_name} SET rate_limiter.fake_now = '{NOW}'")
        admin.execute("SELECT rate_limiter.define('m', 'token bucket', 1000000, '1 hour')")
        with Load(test_cluster, database_name, "m") as load:
            for sql in ("REINDEX INDEX CONCURRENTLY rate_limiter.state_key_name_shard_key",
                        "REINDEX TABLE rate_limiter.state",
                        "REINDEX TABLE CONCURRENTLY rate_limiter.state",
                        "VACUUM FULL rate_limiter.state",
                        "CLUSTER rate_limiter.state USING state_key_name_shard_key",
                        "VACUUM rate_limiter.state"):
                time.sleep(0.3)
                admin.execute(sql)
            time.sleep(0.3)
            load.check(admin, 1000000)
        assert admin.execute("SELECT count(*) FROM pg_index WHERE indrelid = 'rate_limiter.state'::regclass").fetchone() == (1,)
        amcheck_clean(admin)


def test_pg_repack_under_load_rebuilds_the_index_and_refuses_the_table(test_cluster, database_name):
    # pg_repack (Debian's package exists for 15 only) rebuilds the index beside the calls
    # (they keep its copy up to date) and refuses to repack the table itself, whose unique
    # key has a nullable column.
    with test_cluster.connect(database_name) as admin:
        admin.execute("CREATE EXTENSION pg_repack")
        admin.execute(f"ALTER DATABASE {database_name} SET rate_limiter.fake_now = '{NOW}'")
        admin.execute("SELECT rate_limiter.define('m', 'token bucket', 1000000, '1 hour')")
        with Load(test_cluster, database_name, "m") as load:
            time.sleep(0.3)
            assert 'repacking index "rate_limiter.state_key_name_shard_key"' in pg_repack(database_name, "--only-indexes")
            assert "must have a primary key or not-null unique keys" in pg_repack(database_name)
            time.sleep(0.3)
            load.check(admin, 1000000)
        amcheck_clean(admin)


def update_counts(conn):
    """(updates, HOT updates) of the state table so far, this session's flushed first."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return conn.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                        "WHERE relid = 'rate_limiter.state'::regclass").fetchone()


@every_version
def test_updates_are_hot_when_the_page_has_room_and_enter_the_index_when_not(clusters):
    """The update path does what the executor does on each version: a HOT update (15's
    heap-only flag, 16's TU_None) adds no index entry; one that had to move the row to another
    page (TU_All) adds one, or the row could no longer be found through the index. On a
    cluster of its own without autovacuum: whether a page has room depends on pruning, which
    any other session's snapshot (an autoanalyze, a backend starting up) can hold back."""
    keys = 200
    calls = f"SELECT count(*) FROM generate_series(1, {keys}) g, LATERAL rate_limiter.rate_limit('h', g::text)"
    cluster = clusters("hot_updates", PORTS["hot_updates"], ["-c autovacuum=off"]).init().start()
    with cluster.connect() as c, cluster.connect() as holder:
        c.execute("CREATE EXTENSION rate_limiter")

        def twenty_rounds():
            """(updates, HOT updates) of 20 calls on every key, once the statistics show them."""
            start = update_counts(c)
            for _ in range(20):
                c.execute(calls)
            wait_for(lambda: update_counts(c)[0] >= start[0] + 20 * keys, "the statistics", interval=0.5)
            return tuple(n - s for n, s in zip(update_counts(c), start))

        c.execute(f"SET rate_limiter.fake_now = '{NOW}'")
        c.execute("SELECT rate_limiter.define('h', 'token bucket', 1000000, '1 hour')")
        c.execute(calls)
        # An open snapshot keeps every dead version: pages fill, and updates must move rows.
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM rate_limiter.state")
        updates, hot = twenty_rounds()
        assert updates - hot > keys, f"only {updates - hot} of {updates} updates moved a row"
        holder.execute("COMMIT")
        c.execute("VACUUM rate_limiter.state")
        # With room on the page, nearly every update is HOT.
        updates, hot = twenty_rounds()
        assert hot / updates > 0.9, f"{hot} of {updates} updates were HOT"
        # Every row is found through the index and holds what was taken from it.
        remaining = c.execute("SELECT array_agg(DISTINCT remaining) FROM generate_series(1, %s) g, "
                              "LATERAL rate_limiter.check_rate_limit('h', g::text)", (keys,)).fetchone()[0]
        assert remaining == [1000000 - 41 - 1], "41 taken, and a check reports what one more would leave"
        amcheck_clean(c)


def test_the_cache_trigger_fires_under_session_replication_role_replica(database_name):
    with connect(dbname=database_name) as admin, connect(dbname=database_name) as app:
        admin.execute("SELECT rate_limiter.define('r', 'token bucket', 1, '1 hour')")
        call = "SELECT remaining FROM rate_limiter.check_rate_limit('r', 'k')"
        assert app.execute(call).fetchone() == (0,)  # cached: rate 1
        admin.execute("SET session_replication_role = replica")
        admin.execute("SELECT rate_limiter.define('r', 'token bucket', 5, '1 hour')")
        assert app.execute(call).fetchone() == (4,)


def test_a_call_waiting_for_a_row_lock_ends_at_statement_timeout(database_name):
    with connect(dbname=database_name) as admin:
        admin.execute("SELECT rate_limiter.define('w', 'token bucket', 10, '1 hour')")
        admin.execute("SELECT rate_limiter.rate_limit('w', 'k')")
    with connect(dbname=database_name, autocommit=False) as holder, connect(dbname=database_name) as waiter:
        holder.execute("SELECT rate_limiter.rate_limit('w', 'k')")  # holds the row until it ends
        waiter.execute("SET statement_timeout = '300ms'")
        started = time.time()
        with pytest.raises(errors.QueryCanceled):
            waiter.execute("SELECT rate_limiter.rate_limit('w', 'k')")
        assert time.time() - started < 5
        holder.rollback()


def test_a_parallel_safe_wrapper_in_a_parallel_query_gets_25000(database_name):
    with connect(dbname=database_name) as c:
        c.execute("SELECT rate_limiter.define('par', 'token bucket', 10, '1 hour')")
        c.execute("""CREATE FUNCTION public.wrongly_safe() RETURNS boolean LANGUAGE plpgsql PARALLEL SAFE
                     AS $$ BEGIN RETURN (rate_limiter.rate_limit('par')).ok; END $$""")
        c.execute("SET force_parallel_mode = on")
        with pytest.raises(errors.InvalidTransactionState):
            c.execute("SELECT public.wrongly_safe()")


def test_pg_dump_and_restore_bring_limits_back_and_start_state_full(database_name, tmp_path):
    with connect(dbname=database_name) as c:
        c.execute("SELECT rate_limiter.define('d1', 'token bucket', 3, '1 hour', capacity => 5)")
        c.execute("SELECT rate_limiter.define('d2', 'fixed window', 2, '1 minute', shards => 4, start => '2030-01-01')")
        c.execute("SELECT rate_limiter.rate_limit('d1', 'k', 5)")
        limits = c.execute("SELECT * FROM rate_limiter.limits ORDER BY name").fetchall()
    os.chmod(tmp_path, 0o777)
    for fmt, restore in (("c", [f"{PG_BIN}/pg_restore", "-d"]), ("p", ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f"])):
        dump = f"{tmp_path}/dump.{fmt}"
        subprocess.run(["pg_dump", "-F", fmt, "-f", dump, database_name], check=True)
        target = f"rl_restored_{uuid.uuid4().hex[:8]}"
        with connect() as admin:
            admin.execute(f"CREATE DATABASE {target}")
            try:
                if fmt == "c":
                    subprocess.run([*restore, target, dump], check=True)
                else:
                    subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", target, "-f", dump], check=True)
                with connect(dbname=target) as r:
                    assert r.execute("SELECT * FROM rate_limiter.limits ORDER BY name").fetchall() == limits
                    assert r.execute("SELECT count(*) FROM rate_limiter.state").fetchone() == (0,), "state is not dumped"
                    assert r.execute("SELECT remaining FROM rate_limiter.rate_limit('d1', 'k')").fetchone() == (4,)
            finally:
                admin.execute(f"DROP DATABASE {target} WITH (FORCE)")


@every_version
def test_logical_replication_publisher_keeps_working_and_subscriber_applies(clusters):
    publisher = clusters("pub", PORTS["publisher"], ["-c wal_level=logical"]).init().start()
    subscriber = clusters("sub", PORTS["subscriber"]).init().start()
    for cluster in (publisher, subscriber):
        with cluster.connect() as c:
            c.execute("CREATE DATABASE app")
        with cluster.connect("app") as c:
            c.execute("CREATE EXTENSION rate_limiter")
    with publisher.connect("app") as pub, subscriber.connect("app") as sub, subscriber.connect("app") as reader:
        pub.execute("CREATE PUBLICATION everything FOR ALL TABLES")
        sub.execute(f"CREATE SUBSCRIPTION s CONNECTION '{publisher.conninfo('app')}' PUBLICATION everything")
        for c in (pub, reader):
            c.execute(f"SET rate_limiter.fake_now = '{NOW}'")
        pub.execute("SELECT rate_limiter.define('l', 'token bucket', 10, '1 hour')")
        for key in ("a", "a", "b", "c"):
            assert pub.execute("SELECT ok FROM rate_limiter.rate_limit('l', %s)", (key,)).fetchone() == (True,)
        pub.execute("SELECT rate_limiter.reset_rate_limit('l', 'c')")
        state = "SELECT name, key, shard, value, ts, expires FROM rate_limiter.state ORDER BY key"
        expected = pub.execute(state).fetchall()
        # Each table is copied by a worker of its own: the state can arrive before the limit.
        limit_there = "SELECT count(*) FROM rate_limiter.limits WHERE name = 'l'"
        wait_for(lambda: sub.execute(state).fetchall() == expected and sub.execute(limit_there).fetchone() == (1,),
                 "the subscriber to apply the state and the limit")
        assert reader.execute("SELECT remaining FROM rate_limiter.check_rate_limit('l', 'a')").fetchone() == (7,)
        # A replicated define reaches a session that had cached the old config.
        fresh = "SELECT remaining FROM rate_limiter.check_rate_limit('l', 'unused')"
        assert reader.execute(fresh).fetchone() == (9,)
        pub.execute("SELECT rate_limiter.define('l', 'token bucket', 20, '1 hour')")
        wait_for(lambda: reader.execute(fresh).fetchone() == (19,), "the new config on the subscriber")
        errors_seen = sub.execute("SELECT apply_error_count + sync_error_count FROM pg_stat_subscription_stats").fetchone()
        assert errors_seen == (0,), subscriber.log()
        sub.execute("DROP SUBSCRIPTION s")


def slot_calls(lease):
    """Every call that takes or ends slots of concurrency limit 'c' for key 'k' (`lease` is one
    of its leases): what a standby or a subscriber of the leases refuses."""
    return ("SELECT rate_limiter.acquire('c', 'k')", "SELECT rate_limiter.rate_limit('c', 'k')",
            "SELECT rate_limiter.acquire('c', 'k', lease => '1 hour')",
            f"SELECT rate_limiter.release('c', 'k', '{lease}')",
            f"SELECT rate_limiter.renew('c', 'k', '{lease}', '2 hours')")


@every_version
def test_physical_standby_reads_refuses_writes_and_continues_after_promotion(clusters):
    primary = clusters("primary", PORTS["primary"]).init().start()
    standby = clusters("standby", PORTS["standby"])
    with primary.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(f"ALTER DATABASE postgres SET rate_limiter.fake_now = '{NOW}'")
        c.execute(f"SET rate_limiter.fake_now = '{NOW}'")
        c.execute("SELECT rate_limiter.define('l', 'token bucket', 10, '1 hour', shards => 1)")
        c.execute("SELECT rate_limiter.rate_limit('l', 'k', 3)")
        c.execute("SELECT rate_limiter.define('c', 'concurrency', 2, '1 minute')")
        lease = c.execute("SELECT lease_id FROM rate_limiter.acquire('c', 'k', lease => '1 hour')").fetchone()[0]
    standby.follow(primary)
    with primary.connect() as p, standby.connect() as s:
        p.execute("SELECT rate_limiter.rate_limit('l', 'k', 2)")
        lsn = p.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        wait_for(lambda: s.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)).fetchone()[0], "replay")
        for sql in ("SELECT ok, retry_after, remaining FROM rate_limiter.check_rate_limit('l', 'k')",
                    "SELECT value, ts, shard FROM rate_limiter.rate_limit_value('l', 'k')"):
            assert s.execute(sql).fetchone() == p.execute(sql).fetchone()
        for sql in ("SELECT rate_limiter.rate_limit('l', 'k')", "SELECT rate_limiter.reset_rate_limit('l', 'k')",
                    "SELECT rate_limiter.define('x', 'token bucket', 1, '1 hour')", "SELECT rate_limiter.prune()"):
            with pytest.raises(errors.ReadOnlySqlTransaction):
                s.execute(sql)
        # A concurrency limit: the standby sees the primary's leases, as of replay; a slot taken
        # there would be a lock the primary never sees (0.5.0 admitted it), and ending a lease
        # is a write.
        assert s.execute("SELECT remaining FROM rate_limiter.check_rate_limit('c', 'k', 0)").fetchone() == (1,)
        for sql in slot_calls(lease):
            with pytest.raises(errors.ReadOnlySqlTransaction):
                s.execute(sql)
    primary.stop()
    as_postgres(f"{standby.bin}/pg_ctl", "-D", standby.dir, "-w", "promote")
    with standby.connect() as s:
        assert s.execute("SELECT remaining FROM rate_limiter.rate_limit('l', 'k')").fetchone() == (4,), "10 - 3 - 2 - 1"


LOAD = """\\set k random(1, 40)
\\set r random(1, 4)
BEGIN;
INSERT INTO ledger SELECT :k, granted FROM rate_limiter.rate_limit('crash', :k::text);
\\if :r = 1
ROLLBACK;
\\else
COMMIT;
\\endif
"""


@every_version
def test_a_subscriber_of_the_leases_sees_the_publishers_and_takes_none_of_its_own(clusters):
    """A logical subscriber of every table receives the publisher's leases: its
    check_rate_limit sees them once applied, and a slot taken or ended there, which the
    publisher would never see (a lease written there could collide with a replicated one
    and stop replication), is refused with 0A000. A subscriber of the limits alone keeps
    slots of its own."""
    publisher = clusters("pub", PORTS["publisher"], ["-c wal_level=logical"]).init().start()
    subscriber = clusters("sub", PORTS["subscriber"]).init().start()
    for cluster, databases in ((publisher, ("app",)), (subscriber, ("app", "limits_only"))):
        for database_name in databases:
            with cluster.connect() as c:
                c.execute(f"CREATE DATABASE {database_name}")
            with cluster.connect(database_name) as c:
                c.execute("CREATE EXTENSION rate_limiter")
    with publisher.connect("app") as pub, subscriber.connect("app") as sub, \
            subscriber.connect("limits_only") as own:
        pub.execute("CREATE PUBLICATION everything FOR ALL TABLES")
        pub.execute("CREATE PUBLICATION limits FOR TABLE rate_limiter.limits")
        sub.execute(f"CREATE SUBSCRIPTION s CONNECTION '{publisher.conninfo('app')}' PUBLICATION everything")
        own.execute(f"CREATE SUBSCRIPTION s2 CONNECTION '{publisher.conninfo('app')}' PUBLICATION limits")
        pub.execute("SELECT rate_limiter.define('c', 'concurrency', 2, '1 minute')")
        lease = pub.execute("SELECT lease_id FROM rate_limiter.acquire('c', 'k', lease => '1 hour')").fetchone()[0]
        leased = "SELECT count(*) FROM rate_limiter.leases WHERE name = 'c'"
        limit_there = "SELECT count(*) FROM rate_limiter.limits WHERE name = 'c'"
        wait_for(lambda: sub.execute(leased).fetchone() == (1,) and sub.execute(limit_there).fetchone() == (1,),
                 "the subscriber to apply the lease and the limit")
        wait_for(lambda: own.execute(limit_there).fetchone() == (1,), "the limits-only subscriber to apply the limit")
        assert sub.execute("SELECT remaining FROM rate_limiter.check_rate_limit('c', 'k', 0)").fetchone() == (1,)
        for sql in slot_calls(lease):
            with pytest.raises(errors.FeatureNotSupported):
                sub.execute(sql)
        assert own.execute("SELECT ok FROM rate_limiter.acquire('c', 'k', 2, lease => '1 hour')").fetchone() == (True,), \
            "a subscriber of the limits alone has slots of its own"
        assert pub.execute("SELECT rate_limiter.release('c', 'k', %s)", (lease,)).fetchone() == (True,)
        wait_for(lambda: sub.execute("SELECT remaining FROM rate_limiter.check_rate_limit('c', 'k', 0)").fetchone() == (2,),
                 "the release to reach the subscriber")
        errors_seen = sub.execute("SELECT sum(apply_error_count + sync_error_count) FROM pg_stat_subscription_stats").fetchone()
        assert errors_seen == (0,), subscriber.log()
        sub.execute("DROP SUBSCRIPTION s")
        own.execute("DROP SUBSCRIPTION s2")


@every_version
def test_kill_9_under_load_three_times_loses_nothing(clusters):
    cluster = clusters("crash", PORTS["crash"]).init().start()
    with cluster.connect() as c:
        c.execute("CREATE EXTENSION rate_limiter")
        c.execute(f"ALTER DATABASE postgres SET rate_limiter.fake_now = '{NOW}'")
        c.execute("CREATE TABLE ledger (k int, granted float8)")
        c.execute("SELECT rate_limiter.define('crash', 'token bucket', 1000000000, '1 hour')")
    rows_before = 0
    for crash in range(3):
        # Killed mid-load, once this round's load has committed 300 rows (not at its start,
        # where the rows of the rounds before would already be enough).
        kill_9_under_load(cluster, LOAD, clients=4, seconds=20, until=lambda: rows_reach(cluster, "ledger", rows_before + 300))
        with cluster.connect() as c:
            mismatches = c.execute("""
                SELECT count(*) FROM (SELECT k::text AS key, sum(granted) AS granted FROM ledger GROUP BY k) l
                FULL JOIN (SELECT key, 1000000000 - value AS used FROM rate_limiter.state WHERE name = 'crash') s
                USING (key) WHERE l.granted IS DISTINCT FROM s.used""").fetchone()[0]
            rows = rows_before = c.execute("SELECT count(*) FROM ledger").fetchone()[0]
            assert rows > 100 * (crash + 1), "the load ran"
            assert mismatches == 0, f"crash {crash + 1}: {mismatches} keys disagree with the ledger"
            amcheck_clean(c)


def expired_rows(conn, n):
    """n rows that expired long ago: written at a fake 2020 clock."""
    conn.execute("SET rate_limiter.fake_now = '2020-01-01'")
    conn.execute("SELECT count(*) FROM generate_series(1, %s) g, "
                 "LATERAL rate_limiter.rate_limit('old', g::text, config => '{\"kind\":\"token bucket\",\"rate\":1,\"period\":1000}')",
                 (n,))
    conn.execute("RESET rate_limiter.fake_now")


@on_assert_server
def test_the_background_worker_prunes_and_vacuums_every_database_that_has_the_extension(clusters):
    cluster = clusters("worker", PORTS["worker"], ["-c shared_preload_libraries=rate_limiter",
                                        "-c rate_limiter.prune_interval=1s"]).init().start()
    with cluster.connect() as c:
        c.execute("CREATE DATABASE other")
        c.execute("CREATE DATABASE without_it")
    for test_conn in ("postgres", "other"):
        with cluster.connect(test_conn) as c:
            c.execute("CREATE EXTENSION rate_limiter")
            expired_rows(c, 25000)
            c.execute("SELECT rate_limiter.rate_limit('fresh', 'k', config => '{\"kind\":\"token bucket\",\"rate\":1,\"period\":\"1 day\"}')")
    for test_conn in ("postgres", "other"):
        with cluster.connect(test_conn) as c:
            wait_for(lambda: c.execute("SELECT count(*) FROM rate_limiter.state").fetchone() == (1,),
                     f"the worker to prune {test_conn}", timeout=60)
            assert c.execute("SELECT split_part(name, '#', 1) FROM rate_limiter.state").fetchone() == ("fresh",)
            # ... and vacuums it, so that the space of the pruned rows is reused at once.
            wait_for(lambda: c.execute("SELECT vacuum_count > 0 FROM pg_stat_user_tables "
                                       "WHERE relid = 'rate_limiter.state'::regclass").fetchone() == (True,),
                     f"the worker to vacuum {test_conn}", timeout=30)
    with cluster.connect() as c:
        assert c.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'rate_limiter prune launcher'").fetchone() == (1,)


@every_version
def test_no_database_owner_can_stop_or_slow_pruning_in_another_database(clusters):
    """Issue 31: in 0.4.0 one database's owner stopped the prune worker for every database by
    leaving `BEGIN; ANALYZE;` open (the worker's VACUUM waited for it, and the launcher for
    the worker, without a bound), or slowed it with `ALTER DATABASE ... SET
    vacuum_cost_delay`; `pg_terminate_backend` did not end a worker that waited."""
    cluster = clusters("worker", PORTS["worker"], ["-c shared_preload_libraries=rate_limiter",
                                                   "-c rate_limiter.prune_interval=2s"]).init().start()
    with cluster.connect() as c:
        c.execute("CREATE ROLE mallory LOGIN")
        c.execute("CREATE DATABASE a OWNER mallory")
        c.execute("CREATE DATABASE b")
    for test_conn in ("a", "b"):
        with cluster.connect(test_conn) as c:
            c.execute("CREATE EXTENSION rate_limiter")

    def pruned_in_b(within):
        with cluster.connect("b") as c:
            expired_rows(c, 2000)
            wait_for(lambda: c.execute("SELECT count(*) FROM rate_limiter.state").fetchone() == (0,),
                     "b to be pruned", timeout=within)

    def interval(setting):
        with cluster.connect() as c:
            c.execute(f"ALTER SYSTEM SET rate_limiter.prune_interval = '{setting}'")
            c.execute("SELECT pg_reload_conf()")

    # The owner's ANALYZE of every table of a, left open: a's vacuum skips the table.
    with cluster.connect("a") as c:
        expired_rows(c, 2000)
    with cluster.connect("a", user="mallory", autocommit=False) as held:
        held.execute("ANALYZE")
        pruned_in_b(within=20)
        held.rollback()
    # The owner's cost settings for a: the worker keeps its own.
    with cluster.connect("a", user="mallory") as c:
        c.execute("ALTER DATABASE a SET vacuum_cost_delay = 100")
        c.execute("ALTER DATABASE a SET vacuum_cost_limit = 1")
    with cluster.connect("a") as c:
        expired_rows(c, 20000)
    pruned_in_b(within=20)
    # A worker that waits in a longer than an interval (2 s, less than its 5 s lock_timeout)
    # is terminated by the launcher, which goes on to b.
    with cluster.connect("a") as c:
        expired_rows(c, 2000)
    with cluster.connect("a", autocommit=False) as held:
        held.execute("LOCK TABLE rate_limiter.state IN EXCLUSIVE MODE")
        wait_for(lambda: "ran past rate_limiter.prune_interval" in cluster.log(), "the launcher to end a's worker",
                 timeout=20)
        pruned_in_b(within=20)
        held.rollback()
    # With an interval longer than its lock_timeout, a worker waiting for a lock in a ends when
    # terminated, at once.
    interval("8s")
    with cluster.connect("a") as c:
        expired_rows(c, 2000)
    with cluster.connect("a", autocommit=False) as held, cluster.connect() as admin:
        held.execute("LOCK TABLE rate_limiter.state IN EXCLUSIVE MODE")
        waiting = "SELECT pid FROM pg_stat_activity WHERE backend_type = 'rate_limiter prune' " \
                  "AND datname = 'a' AND wait_event_type = 'Lock'"
        wait_for(lambda: admin.execute(waiting).fetchone(), "a's worker to wait for the lock", timeout=30)
        pid = admin.execute(waiting).fetchone()[0]
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
        wait_for(lambda: not admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone(),
                 "the terminated worker to end", timeout=10)
        held.rollback()
    # The launcher goes on with b (at the shorter interval again: not a wait of 8 s).
    interval("2s")
    pruned_in_b(within=30)


def test_the_pg_cron_recipe_prunes(clusters):
    cluster = clusters("cron", PORTS["cron"], ["-c shared_preload_libraries=pg_cron", "-c cron.database_name=postgres",
                                      "-c cron.host=/tmp"]).init().start()
    with cluster.connect() as c:
        c.execute("CREATE DATABASE app")
        c.execute("CREATE EXTENSION pg_cron")
    with cluster.connect("app") as app:
        app.execute("CREATE EXTENSION rate_limiter")
        expired_rows(app, 1000)
        with cluster.connect() as c:
            # The README's recipe.
            c.execute("SELECT cron.schedule_in_database('rate_limiter prune', '* * * * *', "
                      "'SELECT rate_limiter.prune(100000)', 'app')")
            wait_for(lambda: app.execute("SELECT count(*) FROM rate_limiter.state").fetchone() == (0,),
                     "pg_cron to run the prune", timeout=130, interval=1,
                     detail=lambda: c.execute("SELECT status, return_message FROM cron.job_run_details").fetchall())
            assert c.execute("SELECT status FROM cron.job_run_details ORDER BY runid DESC LIMIT 1").fetchone() == ("succeeded",)
