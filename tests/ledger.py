"""The ledger the multi-session tests of escrowed limits (hot and memory) keep: each
transaction's call and a row of what it was granted, in one transaction, so that what
committed transactions were granted plus what the limit has left is what it had."""

import time

from properties import seeded
from clusters import connect
from together import in_sessions

NOW = "2030-01-01 00:00:00+00"


def ledger(conn):
    conn.execute("CREATE TABLE IF NOT EXISTS ledger (name text, k text, granted float8, at timestamptz)")


def remaining(conn, name, key):
    return conn.execute("SELECT remaining FROM rate_limiter.check_rate_limit(%s, %s, 0)", (name, key)).fetchone()[0]


def granted(conn, name, key, since=None):
    return conn.execute("SELECT coalesce(sum(granted), 0) FROM ledger WHERE name = %s AND k = %s AND at > %s",
                        (name, key, since or "-infinity")).fetchone()[0]


def session(dbname, fake_now=NOW, server=None, **kw):
    """A session on `dbname` of `server` (a Cluster; the test command's 15 when None)."""
    conn = server.connect(dbname, **kw) if server else connect(dbname=dbname, **kw)
    conn.execute(f"SET rate_limiter.fake_now = '{fake_now}'")
    return conn


def take(conn, name, key, count=1, rollback=False, savepoint=False, hold=0.0):
    """One transaction: a call and its ledger row, held open for `hold` s; rolled back whole,
    or only the call's savepoint."""
    with conn.transaction(force_rollback=rollback):
        if savepoint:
            with conn.transaction(force_rollback=True):
                conn.execute("INSERT INTO ledger SELECT %s, %s, granted, clock_timestamp() "
                             "FROM rate_limiter.rate_limit(%s, %s, %s)", (name, key, name, key, count))
        conn.execute("INSERT INTO ledger SELECT %s, %s, granted, clock_timestamp() "
                     "FROM rate_limiter.rate_limit(%s, %s, %s)", (name, key, name, key, count))
        if hold:
            time.sleep(hold)


def mixed_load(dbname, name, key, sessions, calls, stop=None, server=None):
    """`sessions` sessions each make `calls` transactions (or until `stop` is set): most
    commit, some roll back whole, some roll back a savepoint around a call, a few hold their
    transaction open a moment so that debits are in flight together."""
    def body(i):
        rng = seeded(i)
        with session(dbname, server=server) as conn:
            for _ in range(calls):
                if stop is not None and stop.is_set():
                    break
                r = rng.random()
                take(conn, name, key, count=rng.choice([1, 1, 2, 3]), rollback=r < 0.2, savepoint=0.2 <= r < 0.35,
                     hold=0.002 if r > 0.9 else 0.0)
    in_sessions(sessions, body)
