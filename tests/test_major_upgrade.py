"""A cluster holding the extension through pg_upgrade to a newer PostgreSQL major: limits,
blocks and every state row come through identical, and calls continue exactly where they were.

The start is 15-upstream, an upstream build of 15 (the machine's own 15 stamps columns with an
option no other build can restore, see docs/operations.md), 16 or 17; scripts/test.sh installs
the extension into each. Skipped where the test command did not install the versions."""

import os
import shutil

import pytest

from calls import amcheck_clean
from clusters import PORTS, VERSIONS, as_postgres

NOW = "2030-01-01 00:00:00+00"
LATER = "2030-01-01 00:00:30+00"

# (from, to, pg_upgrade's mode, the extension's version in the old cluster). The last two
# cases are a DBA who did not update the extension first: it is updated on the new cluster.
CURRENT = "0.8.0"
PATHS = [("15-upstream", "16", "--copy", CURRENT), ("15-upstream", "17", "--copy", CURRENT),
         ("15-upstream", "18", "--link", CURRENT), ("16", "17", "--copy", CURRENT), ("16", "18", "--link", CURRENT),
         ("17", "18", "--copy", CURRENT), ("15-upstream", "17", "--copy", "0.3.0"), ("16", "18", "--copy", "0.4.0")]

# Named limits of every kind, and what each key is left with before the upgrade.
SETUP = [
    "SELECT rate_limiter.define('bucket', 'token bucket', 10, '1 minute')",
    "SELECT rate_limiter.define('window', 'fixed window', 10, '1 minute', start => '2029-12-31 23:59:40+00')",
    "SELECT rate_limiter.define('sliding', 'sliding window', 10, '1 minute')",
    "SELECT rate_limiter.define('rolling', 'rolling window', 10, '1 minute', buckets => 6, min_gap => '1 second')",
    "SELECT rate_limiter.define('sharded', 'token bucket', 100, '1 minute', shards => 4)",
    "SELECT rate_limiter.define('owed', 'token bucket', 10, '1 minute', max_reserved => 50)",
    "SELECT rate_limiter.block('bucket', 'bad', 'infinity', 'abuse')",
    "SELECT rate_limiter.block(NULL, 'everywhere', '2031-01-01', NULL)",
]
CALLS = [
    "SELECT * FROM rate_limiter.rate_limit('bucket', 'k', 7)",             # 3 of 10 left
    "SELECT * FROM rate_limiter.rate_limit('window', 'k', 4)",
    "SELECT * FROM rate_limiter.rate_limit('sliding', 'k', 5)",
    "SELECT * FROM rate_limiter.rate_limit('rolling', 'k', 2)",
    "SELECT * FROM rate_limiter.rate_limit('sharded', 'k', 10)",
    "SELECT * FROM rate_limiter.rate_limit('owed', 'k', 25, reserve => true)",  # owes 15
    """SELECT * FROM rate_limiter.rate_limit('inline', 'k', 2,
         config => '{"kind": "token bucket", "rate": 5, "period": "1 hour"}')""",
]
# What a caller sees, read-only, for each limit: the same before and after.
CHECKS = [
    "SELECT * FROM rate_limiter.check_rate_limit('bucket', 'k')",
    "SELECT * FROM rate_limiter.check_rate_limit('window', 'k')",
    "SELECT * FROM rate_limiter.check_rate_limit('sliding', 'k')",
    "SELECT * FROM rate_limiter.check_rate_limit('rolling', 'k')",
    "SELECT * FROM rate_limiter.check_rate_limit('owed', 'k')",
    "SELECT * FROM rate_limiter.check_rate_limit('bucket', 'bad')",
    """SELECT * FROM rate_limiter.check_rate_limit('inline', 'k',
         config => '{"kind": "token bucket", "rate": 5, "period": "1 hour"}')""",
]
# Rows as PostgreSQL's own text, which every value (infinity too) has.
TABLES = {
    # The columns of every release (0.4.0 added hot, false for every limit that was there).
    "limits": "SELECT (name, kind, rate, period, capacity, max_reserved, shards, start, min_gap, mode, buckets, "
              "lock_timeout, on_lock_timeout, deny_cache)::text FROM rate_limiter.limits t ORDER BY name",
    "blocks": "SELECT t::text FROM rate_limiter.blocks t ORDER BY name, key",
    "state": "SELECT t::text FROM rate_limiter.state t ORDER BY name, key, shard",
    "extension": "SELECT extversion FROM pg_extension WHERE extname = 'rate_limiter'",
}


def snapshot(conn):
    conn.execute(f"SET rate_limiter.fake_now = '{NOW}'")
    seen = {name: conn.execute(sql).fetchall() for name, sql in TABLES.items()}
    seen["checks"] = [conn.execute(f"SELECT d::text FROM ({sql}) d").fetchall() for sql in CHECKS]
    return seen


@pytest.mark.parametrize("old,new,mode,extension", PATHS, ids=[f"{a}-to-{b}{m}-from-{e}" for a, b, m, e in PATHS])
def test_pg_upgrade_keeps_every_limit_block_and_state_row(clusters, old, new, mode, extension):
    # 15-upstream gets the library built for 15 (scripts/test.sh).
    if new not in VERSIONS or old.split("-")[0] not in VERSIONS:
        pytest.skip(f"the test command did not install PostgreSQL {old} and {new}")
    # One locale for both (pg_upgrade requires it); 18's initdb turns data checksums on by
    # default, which an older cluster without them cannot be upgraded to.
    locale = ["--locale=C", "--encoding=UTF8"]
    before = clusters("upgrade_old", PORTS["upgrade_old"], version=old).init(*locale).start()
    after = clusters("upgrade_new", PORTS["upgrade_new"], version=new)
    after.init(*locale, *(["--no-data-checksums"] if new == "18" else []))
    with before.connect() as c:
        c.execute("CREATE DATABASE app")
    with before.connect("app") as c:
        c.execute(f"CREATE EXTENSION rate_limiter VERSION '{extension}'")
        c.execute(f"SET rate_limiter.fake_now = '{NOW}'")
        for sql in SETUP + CALLS:
            c.execute(sql)
        expected = snapshot(c)
    assert expected["state"], "the calls wrote state rows"
    before.stop()

    # pg_upgrade writes its logs and scripts in the current directory, which postgres must
    # own: the test's own, beside its new cluster.
    work = f"{after.dir}_work"
    os.makedirs(work, exist_ok=True)
    shutil.chown(work, "postgres")
    try:
        result = as_postgres("env", "-C", work, f"{after.bin}/pg_upgrade", "-b", before.bin, "-B", after.bin,
                             "-d", before.dir, "-D", after.dir, "-p", str(before.port), "-P", str(after.port),
                             "--socketdir", "/tmp", "--no-sync", mode, check=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    after.start()

    with after.connect("app") as c:
        if extension != CURRENT:
            c.execute("ALTER EXTENSION rate_limiter UPDATE")
            expected["extension"] = [(CURRENT,)]
        assert snapshot(c) == expected, "limits, blocks, state rows and what callers see are unchanged"
        amcheck_clean(c)
        c.execute(f"SET rate_limiter.fake_now = '{NOW}'")
        # Calls continue where they were: 3 of 10 left, then 2; the debt is still owed.
        assert c.execute("SELECT ok, remaining FROM rate_limiter.rate_limit('bucket', 'k')").fetchone() == (True, 2)
        ok, retry_after = c.execute("SELECT ok, retry_after FROM rate_limiter.rate_limit('owed', 'k')").fetchone()
        assert not ok and retry_after == 96000, "15 owed and one more wanted: 16 tokens at 10 a minute"
        assert c.execute("SELECT ok, reason FROM rate_limiter.rate_limit('bucket', 'bad')").fetchone() == (False, "blocked")
        c.execute(f"SET rate_limiter.fake_now = '{LATER}'")
        assert c.execute("SELECT remaining FROM rate_limiter.rate_limit('bucket', 'k')").fetchone() == (6,), \
            "2 left, 5 refilled in 30 s, 1 taken"
