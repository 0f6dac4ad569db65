"""The SQL-level fuzzer (tests/fuzz.py), a bounded slice of it: 4 sessions of random
transactions for about 24 s on a fresh database, with a fixed seed. No call of any function
in contract/functions.json, with any arguments, under savepoints, concurrent redefinitions,
table writes and a dropped and recreated extension, may reach an internal error (SQLSTATE
class XX: a Rust panic is XX000) or lose its connection (a crash; on 17, an assert-enabled
build, a failed assertion too). bench/fuzz.sh is the long run."""

import threading

import pytest
from psycopg import errors

import fuzz
from clusters import ASSERT_MAJOR, VERSIONS, connect

SECONDS = 24
SESSIONS = 4
SEED = 20240601


@pytest.mark.parametrize("pg", [v for v in ("15", ASSERT_MAJOR) if v in VERSIONS])
def test_random_transactions_reach_no_internal_error_and_no_crash(test_cluster, database_name, pg):
    report = fuzz.run(test_cluster.conninfo(database_name), SECONDS, SESSIONS, SEED)
    print(report.table())
    if report.faults:
        pytest.fail("\n\n".join(fuzz.describe(f) for f in report.faults), pytrace=False)
    # The generator must reach the code behind the argument checks: a fuzzer whose calls
    # all fail (a changed signature, a config it no longer writes right) tests nothing.
    assert report.calls > 1000, report.table()
    assert report.call_share > 0.2, f"only {100 * report.call_share:.1f}% of calls succeeded\n{report.table()}"
    # And the database is left usable: the extension answers a plain call.
    with test_cluster.connect(database_name) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS rate_limiter")
        # (A key of its own: the fuzzer may have left the NULL key of every limit blocked.)
        assert c.execute("SELECT ok FROM rate_limiter.rate_limit('after', 'after the run', "
                         """config => '{"kind": "token bucket", "rate": 1, "period": 1000}')""").fetchone() == (True,)


# What the fuzzer found, each a test of its own.

@pytest.mark.parametrize("call", [
    "SELECT rate_limiter.remove_override('tb', 'k')",
    "SELECT rate_limiter.block('tb', 'k')",
    "SELECT rate_limiter.prune()",
    """SELECT ok FROM rate_limiter.rate_limit('x', 'k', config => '{"kind": "token bucket", "rate": 1, "period": 1000}')""",
])
def test_a_call_waiting_while_the_extension_is_dropped_gets_a_clear_error_not_an_internal_one(database_name, call):
    """A call that found the extension's tables, then waited for a lock while DROP EXTENSION
    committed, opened a table by an OID that was gone: XX000 "could not open relation"."""
    with connect(dbname=database_name) as dropper, connect(dbname=database_name) as caller:
        caller.execute("SELECT rate_limiter.define('tb', 'token bucket', 5, '1 hour')")
        caller.execute("SELECT rate_limiter.rate_limit('tb', 'k')")  # every cache of the session filled
        dropper.execute("BEGIN")
        dropper.execute("DROP EXTENSION rate_limiter CASCADE")
        raised = []

        def run():
            try:
                caller.execute(call)
            except errors.Error as e:
                raised.append(e)

        waiting = threading.Thread(target=run)
        waiting.start()
        waiting.join(1)  # the call waits for the dropper's lock
        dropper.execute("COMMIT")
        waiting.join(30)
        # 42P01 with a hint where a table was gone, 42704 where the extension itself was.
        assert [e.sqlstate for e in raised] in (["42P01"], ["42704"]), raised
