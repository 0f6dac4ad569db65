"""The extension with every catalog cache discarded at each chance (debug_discard_caches = 1)
on the assert-enabled server (scripts/servers.sh's ASSERT_MAJOR). A backend then throws away
every relcache, catcache and typcache entry whenever it takes invalidations (a catalog lookup,
a lock, SPI), so a pointer into one kept across those reads freed memory that assertions have
clobbered, and the backend crashes at once, not once in many runs: the planted-trigger guard
before 58a6e62 (a relation's trigger descriptor walked across catalog lookups) crashed the
server in 2 of 5 full runs and crashes here in every one. The cluster's log is judged when it
stops (clusters.py), so a crash in a worker fails the test as one in a session does."""

import json
import os
import threading

import pytest

from clusters import ASSERT_MAJOR, PORTS, ROOT, VERSIONS, wait_for

pytestmark = pytest.mark.skipif(ASSERT_MAJOR not in VERSIONS,
                                reason=f"the assert-enabled PostgreSQL {ASSERT_MAJOR} is not among the versions tested")

# A prune round under discarded caches takes tens of seconds, and the launcher ends a worker
# that runs past its interval; each worker's round is paid for in CPU, so a few rounds. No
# autovacuum: its workers would discard their caches too, for nothing the test looks at.
SETTINGS = ["-c shared_preload_libraries=rate_limiter", "-c rate_limiter.prune_interval=90s",
            "-c rate_limiter.memory_snapshot=10000", "-c debug_discard_caches=1", "-c autovacuum=off"]


def config(kind, **extra):
    return json.dumps({"kind": kind, "rate": 5, "period": "1 hour", **extra})


# Every SQL function of the extension, each called at least once, as a session of an
# application or an administrator would; the triggers of the five definition tables fire
# under define, block, allow, override and tier (each write checked by the guard), and their
# truncate triggers under TRUNCATE (the limits' at the end).
SURFACE = [
    "SELECT rate_limiter.define('durable', 'token bucket', 5, '1 hour')",
    "SELECT rate_limiter.define('memory', 'token bucket', 5, '1 hour', durable => false)",
    "SELECT rate_limiter.define('hot', 'token bucket', 5, '1 hour', hot => true)",
    "SELECT rate_limiter.define('slots', 'concurrency', 2, '1 hour')",
    "SELECT ok FROM rate_limiter.rate_limit('durable', 'k')",
    "SELECT ok FROM rate_limiter.rate_limit('memory', 'k', 2)",
    "SELECT ok FROM rate_limiter.rate_limit('hot', 'k')",
    "SELECT rate_limiter.rate_limit_ok('memory', 'ok') AND rate_limiter.rate_limit_ok('durable', 'ok')",
    f"SELECT ok FROM rate_limiter.rate_limit('sharded', 'k', 3, config => '{config('fixed window', rate=40, shards=4)}')",
    f"SELECT ok FROM rate_limiter.rate_limit('sliding', 'k', config => '{config('sliding window', durable=False)}')",
    f"SELECT ok FROM rate_limiter.rate_limit('calendar', 'k', config => '{config('fixed window', period='1 day', tz='Europe/Berlin')}')",
    "SELECT ok FROM rate_limiter.check_rate_limit('durable', 'k')",
    """SELECT ok FROM rate_limiter.rate_limit_all('[{"name": "durable", "key": "a"}, {"name": "memory", "key": "a"}]')""",
    """SELECT ok FROM rate_limiter.check_rate_limit_all('[{"name": "durable", "key": "a"}]')""",
    "SELECT granted FROM rate_limiter.credit('durable', 'k', 1)",
    "SELECT ok FROM rate_limiter.wait_rate_limit('durable', 'w', timeout => '1 second')",
    "SELECT count(*) FROM rate_limiter.rate_limit_value('memory', 'k')",
    "SELECT rate_limiter.renew('slots', 'k', lease_id, '1 minute') AND rate_limiter.release('slots', 'k', lease_id) "
    "FROM rate_limiter.acquire('slots', 'k', lease => '1 minute')",
    "SELECT rate_limiter.block('durable', 'bad', now() + interval '1 hour', 'test')",
    "SELECT rate_limiter.unblock('durable', 'bad')",
    "SELECT rate_limiter.allow(NULL, 'good')",
    "SELECT rate_limiter.disallow(NULL, 'good')",
    "SELECT rate_limiter.define_tier('durable', 'pro', rate => 50)",
    "SELECT rate_limiter.override('durable', 'vip', tier => 'pro')",
    "SELECT ok FROM rate_limiter.rate_limit('durable', 'vip')",
    "SELECT rate_limiter.remove_override('durable', 'vip')",
    "SELECT rate_limiter.remove_tier('durable', 'pro')",
    "SELECT rate_limiter.http_headers('durable', rate_limiter.rate_limit('durable', 'h'), key => 'h')",
    """SELECT rate_limiter.http_headers_all('[{"name": "durable", "key": "h"}]', rate_limiter.rate_limit('durable', 'h'))""",
    "SELECT rate_limiter.http_problem(rate_limiter.rate_limit('durable', 'h', 5))",
    "SELECT rate_limiter.ip_key('2001:db8::1')",
    "SELECT rate_limiter.reset_rate_limit('hot', 'k')",
    "SELECT rate_limiter.prune()",
    "SELECT count(*) FROM rate_limiter._stats()",
    "SELECT count(*) FROM rate_limiter._top_denied()",
    "SELECT count(*) FROM rate_limiter.stats_every_database()",
    "SELECT count(*) FROM rate_limiter.top_denied_every_database()",
    "SELECT rate_limiter.stats_reset()",
    "SELECT rate_limiter.limit_writes('written', 'durable', key => 'k')",
    "INSERT INTO written VALUES ('a'), ('b')  -- fires rate_limiter._write_limited()",
    "SELECT rate_limiter.unlimit_writes('written')",
    "TRUNCATE rate_limiter.blocks",
    "TRUNCATE rate_limiter.allows",
    "TRUNCATE rate_limiter.overrides, rate_limiter.tiers",
]


def test_every_function_trigger_and_worker_with_caches_discarded(clusters):
    cluster = clusters("discard", PORTS["discard"], SETTINGS, version=ASSERT_MAJOR).init().start()
    with cluster.connect() as admin:
        assert admin.execute("SHOW debug_assertions").fetchone() == ("on",), \
            f"PostgreSQL {ASSERT_MAJOR} was not built with assertions: see its first source in scripts/servers.sh"
        # The extension's script is long; it is installed with the caches kept (its own
        # pointers are not the extension's), and everything after runs with them discarded.
        admin.execute("SET debug_discard_caches = 0")
        admin.execute("CREATE EXTENSION rate_limiter")
        admin.execute("CREATE TABLE written (k text)")  # for a write limit, below
        # A row that expired long ago, for the prune worker's first round (90 s on) to
        # remove while the rest runs: written at a fake clock.
        admin.execute("SET rate_limiter.fake_now = '2020-01-01'")
        admin.execute(f"SELECT rate_limiter.rate_limit('old', 'k', config => '{config('token bucket')}')")

    contract = json.load(open(os.path.join(ROOT, "contract", "functions.json")))["functions"]
    called = {f["name"] for f in contract if any(f"rate_limiter.{f['name']}(" in s for s in SURFACE)}
    assert called == {f["name"] for f in contract}, "functions this test does not call"

    # A backend's first call: per-backend caches built under discarded catalogs.
    with cluster.connect() as first:
        assert first.execute("SHOW debug_discard_caches").fetchone() == ("1",)
        first.execute(f"SELECT rate_limiter.rate_limit('first', 'k', config => '{config('token bucket')}')")
    with cluster.connect() as c:
        for statement in SURFACE:
            c.execute(statement)

    # A define, an override and a tier change while another session's calls are in flight:
    # its row locks, escrows, memory entries and slots are held until it commits.
    with cluster.connect() as calls, cluster.connect() as admin:
        calls.execute("BEGIN")
        for name in ("durable", "memory", "hot"):
            calls.execute("SELECT rate_limiter.rate_limit(%s, 'flight')", (name,))
        calls.execute("SELECT rate_limiter.acquire('slots', 'flight')")
        failed = []

        def change():
            try:
                for statement in ("SELECT rate_limiter.define('hot', 'token bucket', 7, '1 hour', hot => true)",
                                  "SELECT rate_limiter.override('memory', 'flight', rate => 9)",
                                  "SELECT rate_limiter.define_tier('durable', 'gold', rate => 9)"):
                    admin.execute(statement)
            except Exception as e:  # noqa: BLE001 - reported by the test, not lost in the thread
                failed.append(e)

        changes = threading.Thread(target=change)
        changes.start()
        changes.join(2)  # some of them wait for the calls' transaction
        calls.execute("COMMIT")
        changes.join(120)
        assert not changes.is_alive(), "the changes did not end once the calls committed"
        assert not failed, failed
        assert calls.execute("SELECT granted FROM rate_limiter.rate_limit('durable', 'flight')").fetchone() == (1,)

    with cluster.connect() as c:
        c.execute("TRUNCATE rate_limiter.limits CASCADE")

    # A round of each worker: the snapshot worker copies the memory limits' counts out, the
    # prune worker removed the row that expired.
    with cluster.connect() as c:
        wait_for(lambda: c.execute("SELECT count(*) > 0 FROM rate_limiter.memory_snapshot").fetchone() == (True,),
                 "the snapshot worker's round", timeout=120, detail=cluster.log)
        wait_for(lambda: c.execute("SELECT count(*) FROM rate_limiter.state "
                                   "WHERE split_part(name, '#', 1) = 'old'").fetchone() == (0,),
                 "the prune worker's round", timeout=240, detail=cluster.log)
    cluster.stop()
