"""Upgrading on a running server the way docs/operations.md says: the package is installed
under a preloading server while 8 sessions call rate_limit, then ALTER EXTENSION UPDATE runs
where the version moved, under the same load. No backend dies, no call fails, and every
granted token is in the state."""

import os
import threading
import time

import pytest

from clusters import PORTS
from packages import dpkg, in_place_of_cargo_pgrx

# dpkg moves the installed library aside and back: no other test may load it meanwhile.
pytestmark = pytest.mark.alone

LIBRARY = "/usr/lib/postgresql/15/lib/rate_limiter.so"
NOW = "2030-01-01 00:00:00+00"
KEYS = 50


def test_the_package_and_the_update_under_load_crash_nothing_and_lose_no_token(clusters, tmp_path):
    cluster = clusters("in_place", PORTS["in_place"], ["-c shared_preload_libraries=rate_limiter",
                                                       "-c rate_limiter.prune_interval=0"]).init().start()
    with cluster.connect() as c:
        # The database starts on the previous release's SQL, so that the update moves it.
        c.execute("CREATE EXTENSION rate_limiter VERSION '0.3.0'")
        c.execute("CREATE TABLE ledger (k int, granted float8)")
        c.execute(f"ALTER DATABASE postgres SET rate_limiter.fake_now = '{NOW}'")  # nothing refills
        c.execute("SELECT rate_limiter.define('load', 'token bucket', 1000000000, '1 hour')")
    stop, failures, calls = threading.Event(), [], [0] * 8

    def session(n):
        try:
            with cluster.connect(autocommit=False) as s:
                i = n
                while not stop.is_set():
                    s.execute("INSERT INTO ledger SELECT %s, granted FROM rate_limiter.rate_limit('load', %s)",
                              (i % KEYS, str(i % KEYS)))
                    s.commit()
                    calls[n] += 1
                    i += 8
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [threading.Thread(target=session, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    try:
        time.sleep(2)
        with in_place_of_cargo_pgrx("postgresql-15-rate-limiter", tmp_path) as (deb, _):
            before = os.stat(tmp_path / LIBRARY.lstrip("/")).st_ino
            dpkg("-i", str(deb))
            assert os.stat(LIBRARY).st_ino != before, "dpkg replaced the file by rename, a new inode"
            time.sleep(2)
            with cluster.connect() as c:
                c.execute("ALTER EXTENSION rate_limiter UPDATE")
                assert c.execute("SELECT extversion FROM pg_extension WHERE extname = 'rate_limiter'").fetchone() == (
                    deb.name.split("_")[1],)
            time.sleep(2)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failures == [], failures
    assert all(n > 20 for n in calls), f"every session kept calling: {calls}"
    with open(f"{cluster.dir}/server.log") as f:
        log = f.read()
    assert "terminated by signal" not in log and "was terminated" not in log, log[-4000:]
    with cluster.connect() as c:
        mismatches = c.execute("""
            SELECT count(*) FROM (SELECT k::text AS key, sum(granted) AS granted FROM ledger GROUP BY k) l
            FULL JOIN (SELECT key, 1000000000 - value AS used FROM rate_limiter.state WHERE name = 'load') s
            USING (key) WHERE l.granted IS DISTINCT FROM s.used""").fetchone()[0]
        assert mismatches == 0, f"{mismatches} keys disagree with the ledger"
        assert c.execute("SELECT sum(granted) FROM ledger").fetchone()[0] == sum(calls)
