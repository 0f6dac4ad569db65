"""The SQL-only edition (sql-only/): installed by a database's owner who is not a superuser,
with one `psql -f`, on every version; its answers against the extension's, call by call and
bit for bit (random sequences on both, in two databases of one server); its clock closed to
a role that may only call it; its functions immune to the caller's search_path."""

import json
import struct
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from properties import drawn, examples_on, seeded
from clusters import PORTS, every_version, pg_bin
from traps import plant_trigger_traps, trap_runs
from editions import EDITION, edition, install  # noqa: F401 - a fixture

ROOT = Path(__file__).resolve().parent.parent
START = "2026-03-01 00:00:00+00"


def test_the_install_script_is_what_its_parts_build():
    result = subprocess.run(["python3", str(ROOT / "sql-only" / "build.py"), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def in_eight_sessions(session):
    """session(seed) for seeds 0 to 7, in threads at once; the exceptions they raised."""
    import threading
    errors = []

    def guarded(seed):
        try:
            session(seed)
        except Exception as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


@every_version
def test_a_database_owner_who_is_not_a_superuser_installs_it_with_one_psql_f(test_cluster, edition, pg):
    dbname, owner = edition
    with test_cluster.connect(dbname, user=owner) as c:
        assert c.execute("SELECT rate_limiter.edition()").fetchone() == ("sql-only 0.8.0",)
        assert c.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone() == (False,)
        # Nothing for PUBLIC, as the extension: the schema, its tables and functions.
        assert c.execute("SELECT nspacl FROM pg_namespace WHERE nspname = 'rate_limiter'").fetchone()[0] is None or \
            "=U/" not in str(c.execute("SELECT nspacl FROM pg_namespace WHERE nspname = 'rate_limiter'").fetchone()[0])
        assert c.execute("""SELECT count(*) FROM pg_proc p WHERE p.pronamespace = 'rate_limiter'::regnamespace
                            AND has_function_privilege('public', p.oid, 'EXECUTE')""").fetchone() == (0,)
        # Every function pins its search_path, but those with an SQL-standard body, whose names
        # were bound when it was created.
        assert c.execute("""SELECT array_agg(proname) FROM pg_proc WHERE pronamespace = 'rate_limiter'::regnamespace
                            AND prosqlbody IS NULL
                            AND NOT coalesce(proconfig::text LIKE '%search_path=pg_catalog, pg_temp%', false)""").fetchone() == (None,)
    # A superuser's install is refused (its functions would run as a superuser).
    with test_cluster.connect() as admin:
        admin.execute(f"CREATE DATABASE {dbname}_su")
    try:
        result = subprocess.run([f"{pg_bin(pg)}/psql", "-X", "-q", "-h", "/tmp", "-p", str(test_cluster.port), "-U", "postgres",
                                 "-d", f"{dbname}_su", "-f", str(EDITION)], capture_output=True, text=True)
        assert result.returncode != 0 and "not by a superuser" in result.stderr
    finally:
        with test_cluster.connect() as admin:
            admin.execute(f"DROP DATABASE {dbname}_su")
    # A second install, or one beside the extension, is refused before it creates anything.
    result = subprocess.run([f"{pg_bin(pg)}/psql", "-X", "-q", "-h", "/tmp", "-p", str(test_cluster.port), "-U", owner, "-d", dbname,
                             "-f", str(EDITION)], capture_output=True, text=True)
    assert result.returncode != 0 and "schema rate_limiter exists already" in result.stderr


def bits(v):
    """A float8 as its bits: bit for bit, -0.0 apart from 0.0."""
    return None if v is None else struct.pack(">d", v).hex()


def run(conn, sql, params=()):
    """A statement's rows, or its error as (SQLSTATE, message); floats as their bits. A
    statement of an idle autocommit session is a transaction of its own (one round trip);
    within a transaction, it runs in a savepoint."""
    try:
        if conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            rows = conn.execute(sql, params).fetchall()
        else:
            with conn.transaction():
                rows = conn.execute(sql, params).fetchall()
        return [tuple(bits(v) if isinstance(v, float) else v for v in row) for row in rows]
    except psycopg.Error as e:
        return ("error", e.sqlstate, e.diag.message_primary, e.diag.message_detail, e.diag.message_hint)


names = st.sampled_from(["tb", "fw"])
drafts = st.sampled_from([11, 9])
keys = st.sampled_from(["a", "b", None, "é"])
amounts = st.sampled_from([0, 0.5, 1, 1, 1, 1, 2, 3, 7, 11, 1e16, -1])
def define(name):
    return st.tuples(st.just("define"), st.just(name), st.sampled_from(["token bucket", "fixed window", "sliding window", "rolling window"]),
                     st.sampled_from([1, 2, 2.5, 3, 5, 100]), st.sampled_from([1, 500, 1000, 60000, 3600000]),
                     st.sampled_from([None, None, 0, 3, 20]), st.sampled_from([None, 0, 5]),
                     st.sampled_from([None, 0, 700, 5000]), st.sampled_from([None, "2026-02-28 23:59:59.5+00"]),
                     st.booleans(), st.sampled_from(["all", "all", "partial", "penalize"]))


call = st.tuples(st.just("call"), st.sampled_from(["rate_limit", "rate_limit_ok", "check_rate_limit"]), names, keys, amounts,
                 st.booleans(), st.booleans())
# Inline configs: kinds and options with a state of their own per config, and configs the
# extension refuses (the edition's refusals of what it lacks, such as calendars and shards,
# are tested apart).
configs = st.sampled_from([
    {"kind": "token bucket", "rate": 5, "period": 1000},
    {"kind": "fixed window", "rate": 3, "period": "1 minute", "start": "2026-02-28 23:59:59.5+00"},
    {"kind": "sliding window", "rate": 4, "period": 2000, "mode": "partial"},
    {"kind": "rolling window", "rate": 6, "period": "3 seconds", "buckets": 3, "enforce": False},
    {"kind": "token bucket", "rate": 2.5, "period": 500, "capacity": 5, "maxReserved": 3, "minGap": 100},
    {"kind": "fixed window", "rate": 2, "period": 1000, "mode": "penalize", "start": 1772323199000.5},
    {"kind": "token bucket", "rate": 5, "period": 1000, "capacity": None, "mode": None, "hot": False, "denyCache": "1 s"},
    {"kind": "fixed window", "rate": 2, "period": 1000, "mode": "penalize", "denyCache": "1 second"},
    {"kind": "token bucket", "rate": 5, "period": 1000, "unknown": 1},
    {"kind": "token bucket", "rate": "5", "period": 1000},
    {"rate": 5, "period": 1000},
    {"kind": "sliding window", "rate": 5, "period": "1 mon"},
    {"kind": "token bucket", "rate": 5, "period": 1000, "hot": True},
    {"kind": "token bucket", "rate": 5, "period": 1000, "shards": 1.5, "tz": "UTC"},
    {"kind": "token bucket", "rate": 5, "period": 1000, "tz": "UTC"},
    {"kind": "rolling window", "rate": 5, "period": 1000, "capacity": 4},
    {"kind": "fixed window", "rate": 3, "period": "1 month", "tz": "Europe/Berlin"},
    {"kind": "fixed window", "rate": 2, "period": "1 day", "tz": "america/new_york", "start": "2026-01-01 06:30:00+00"},
    {"kind": "fixed window", "rate": 2, "period": "1 week", "maxReserved": 4},
    {"kind": "fixed window", "rate": 2, "period": "1 day", "tz": "Nowhere/City"},
    [1, 2.5, {"b": None, "a": "x"}],
])
inline = st.tuples(st.just("inline"), st.sampled_from(["rate_limit", "check_rate_limit", "credit", "rate_limit_value",
                                                       "http_headers", "wait_rate_limit"]),
                   st.sampled_from(["tb", "in"]), keys, amounts, st.booleans(), configs)

# Several limits at once: one to three requests, with a (name, key) that may repeat (22023) and
# now and then a member the call refuses.
request = st.fixed_dictionaries({"name": names}, optional={"key": keys, "count": amounts, "config": configs})
requests = st.one_of(st.lists(request, min_size=1, max_size=3),
                     st.sampled_from([[], [{"name": "tb", "count": "1"}], [{"name": "tb", "cost": 1}], [3], {"name": "tb"}]))
call_all = st.one_of(st.tuples(st.just("all"), st.sampled_from(["rate_limit_all", "check_rate_limit_all"]), requests,
                               st.booleans(), st.booleans()),
                     st.tuples(st.just("headers_all"), requests, drafts, st.booleans()))
# A named calendar window: months, a week or a day, in a zone with summer time (which starts
# within the sequences' month in Europe and in the United States), from a start or not.
define_calendar = st.tuples(st.just("calendar"), names, st.sampled_from([1, 2, 3]),
                            st.sampled_from(["1 month", "3 months", "1 year", "1 week", "1 day"]),
                            st.sampled_from([None, "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]),
                            st.sampled_from([None, "2026-01-31 23:30:00+00"]), st.sampled_from([None, 2]))
steps = st.lists(st.one_of(
    call, call, call, call, call, call_all, call_all, inline, inline, inline,
    define("tb"), define("fw"), define_calendar,
    st.tuples(st.just("clock"), st.sampled_from([0, 1, 250, 999, 1000, 30000, 3600000, -5000, 86400000, 2592000000])),
    st.tuples(st.just("rolled back"), names, keys, amounts),
    st.tuples(st.just("block"), names, keys, st.sampled_from([None, 1500])),
    st.tuples(st.just("unblock"), names, keys),
    st.tuples(st.just("reset"), names, keys),
    st.tuples(st.just("credit"), names, keys, amounts),
    st.tuples(st.just("allow"), st.sampled_from(["tb", "fw", None]), keys, st.sampled_from([None, 700])),
    st.tuples(st.just("disallow"), st.sampled_from(["tb", "fw", None]), keys),
    st.tuples(st.just("headers"), names, keys, amounts, drafts, st.booleans()),
    # Overrides and tiers: a key's own numbers (some the limit's kind cannot have), exempt or
    # ending, a key put in a tier, a tier changed or removed while named.
    st.tuples(st.just("override"), names, keys, st.sampled_from([None, 1, 4, 50]), st.sampled_from([None, 3, 0.5]),
              st.booleans(), st.sampled_from([None, 900])),
    st.tuples(st.just("tier"), names, st.sampled_from(["free", "pro"]), st.sampled_from([None, 2, 40])),
    st.tuples(st.just("in tier"), names, keys, st.sampled_from(["free", "pro"])),
    st.tuples(st.just("remove override"), names, keys),
    st.tuples(st.just("remove tier"), names, st.sampled_from(["free", "pro"])),
    st.tuples(st.just("value"), names, keys),
    st.tuples(st.just("wait"), names, keys, amounts),
    st.tuples(st.just("prune"), st.sampled_from([0, 1, 10000])),
), min_size=10, max_size=40)


def step(conn, s, now_ms):
    kind = s[0]
    if kind == "define":
        _, name, k, rate, period, capacity, max_reserved, min_gap, start, enforce, mode = s
        return run(conn, "SELECT rate_limiter.define(%s, %s, %s, make_interval(secs => %s::float8 / 1000), %s, %s, "
                         "min_gap => make_interval(secs => %s::float8 / 1000), start => %s, enforce => %s, buckets => %s, "
                         "mode => %s)",
                   (name, k, rate, period, capacity, max_reserved, min_gap,
                    start if k != "token bucket" else None, enforce, 4 if k == "rolling window" and period > 1 else None, mode))
    if kind == "call":
        _, fn, name, key, count, reserve, throws = s
        return run(conn, f"SELECT * FROM rate_limiter.{fn}(%s, %s, %s, %s, %s)", (name, key, count, reserve, throws))
    if kind == "all":
        _, fn, reqs, reserve, throws = s
        return run(conn, f"SELECT * FROM rate_limiter.{fn}(%s::jsonb, %s, %s)", (json.dumps(reqs), reserve, throws))
    if kind == "headers_all":
        requests = json.dumps(s[1])
        draft, partition_key = (*s[2:], 11, False)[:2]
        return run(conn, "SELECT rate_limiter.http_headers_all(%s::jsonb, d, %s, %s), rate_limiter.http_problem(d) "
                         "FROM rate_limiter.check_rate_limit_all(%s::jsonb) d", (requests, draft, partition_key, requests))
    if kind == "calendar":
        _, name, rate, period, tz, start, max_reserved = s
        return run(conn, "SELECT rate_limiter.define(%s, 'fixed window', %s, %s::interval, max_reserved => %s, start => %s, tz => %s)",
                   (name, rate, period, max_reserved, start, tz))
    if kind == "inline":
        _, fn, name, key, count, reserve, config = s
        config = json.dumps(config)
        if fn in ("rate_limit", "check_rate_limit"):
            return run(conn, f"SELECT * FROM rate_limiter.{fn}(%s, %s, %s, %s, config => %s::jsonb)", (name, key, count, reserve, config))
        if fn == "credit":
            return run(conn, "SELECT * FROM rate_limiter.credit(%s, %s, %s, %s::jsonb)", (name, key, count, config))
        if fn == "rate_limit_value":
            return run(conn, "SELECT * FROM rate_limiter.rate_limit_value(%s, %s, %s::jsonb)", (name, key, config))
        if fn == "http_headers":
            return run(conn, "SELECT rate_limiter.http_headers(%s, d, %s::jsonb) FROM rate_limiter.check_rate_limit(%s, %s, %s, "
                             "config => %s::jsonb) d", (name, config, name, key, count, config))
        return run(conn, "SELECT * FROM rate_limiter.wait_rate_limit(%s, %s, %s, '0', %s::jsonb)", (name, key, count, config))
    if kind == "rolled back":
        _, name, key, count = s
        result = []
        with conn.transaction():
            result.append(run(conn, "SELECT * FROM rate_limiter.rate_limit(%s, %s, %s)", (name, key, count)))
            conn.execute("SAVEPOINT s")
            result.append(run(conn, "SELECT * FROM rate_limiter.rate_limit(%s, %s, %s)", (name, key, count)))
            conn.execute("ROLLBACK TO SAVEPOINT s")
            result.append(run(conn, "SELECT * FROM rate_limiter.check_rate_limit(%s, %s, %s)", (name, key, count)))
        return result
    if kind == "block":
        _, name, key, ms = s
        until = "infinity" if ms is None else f"{START}"
        return run(conn, "SELECT rate_limiter.block(%s, %s, %s::timestamptz + make_interval(secs => %s::float8 / 1000))",
                   (name, key, until, now_ms + (ms or 0)))
    if kind == "unblock":
        return run(conn, "SELECT rate_limiter.unblock(%s, %s)", s[1:])
    if kind == "allow":
        _, name, key, ms = s
        return run(conn, "SELECT rate_limiter.allow(%s, %s, %s::timestamptz + make_interval(secs => %s::float8 / 1000))",
                   (name, key, "infinity" if ms is None else START, now_ms + (ms or 0)))
    if kind == "disallow":
        return run(conn, "SELECT rate_limiter.disallow(%s, %s)", s[1:])
    if kind == "credit":
        return run(conn, "SELECT * FROM rate_limiter.credit(%s, %s, %s)", s[1:])
    if kind == "headers":
        _, name, key, count, draft, partition_key = s
        return run(conn, "SELECT rate_limiter.http_headers(%s, d, key => %s, draft => %s, partition_key => %s), "
                         "rate_limiter.http_problem(d) FROM rate_limiter.check_rate_limit(%s, %s, %s) d",
                   (name, key, draft, partition_key, name, key, count))
    if kind == "value":
        return run(conn, "SELECT * FROM rate_limiter.rate_limit_value(%s, %s)", s[1:])
    if kind == "override":
        _, name, key, rate, capacity, exempt, ms = s
        return run(conn, "SELECT rate_limiter.override(%s, %s, rate => %s, capacity => %s, exempt => %s, until => %s::timestamptz "
                         "+ make_interval(secs => %s::float8 / 1000))",
                   (name, key, rate, capacity, exempt, "infinity" if ms is None else START, now_ms + (ms or 0)))
    if kind == "tier":
        return run(conn, "SELECT rate_limiter.define_tier(%s, %s, rate => %s)", s[1:])
    if kind == "in tier":
        return run(conn, "SELECT rate_limiter.override(%s, %s, tier => %s)", s[1:])
    if kind == "remove override":
        return run(conn, "SELECT rate_limiter.remove_override(%s, %s)", s[1:])
    if kind == "remove tier":
        return run(conn, "SELECT rate_limiter.remove_tier(%s, %s)", s[1:])
    if kind == "wait":
        return run(conn, "SELECT * FROM rate_limiter.wait_rate_limit(%s, %s, %s, '0')", s[1:])
    if kind == "prune":
        return run(conn, "SELECT rate_limiter.prune(%s)", s[1:])
    if kind == "reset":
        return run(conn, "SELECT rate_limiter.reset_rate_limit(%s, %s)", s[1:])
    raise AssertionError(s)


@every_version
def test_the_edition_answers_as_the_extension_call_by_call_bit_for_bit(test_cluster, database_name, edition, pg):
    """Every example on 15, a tenth of the drawn ones on 16, 17 and 18 (contract/vectors.json
    holds the edition's arithmetic to the bucket's on every version in tier 1)."""
    dbname, _ = edition
    with test_cluster.connect(database_name) as ext, test_cluster.connect(dbname) as ed:
        @drawn(examples_on(pg, 100))
        @given(limits=st.tuples(define("tb"), define("fw")), sequence=steps)
        # A credit to a sliding window while the previous window still weighs (its remaining counts that weight).
        @example(limits=(("define", "tb", "sliding window", 10, 60000, None, None, None, "2026-02-28 23:59:59.5+00", True, "all"),
                         ("define", "fw", "rolling window", 5, 1000, None, None, None, None, True, "all")),
                 sequence=[("call", "rate_limit", "tb", "a", 10, False, False), ("clock", 90000), ("credit", "tb", "a", 3),
                           ("call", "rate_limit_ok", "tb", "a", 2, False, False), ("call", "rate_limit_ok", "tb", "a", 9, False, False),
                           ("call", "rate_limit", "fw", "a", 5, False, False), ("call", "rate_limit", "fw", "a", 1, False, False),
                           ("clock", 250), ("credit", "fw", "a", 2), ("call", "check_rate_limit", "fw", "a", 3, False, False)])
        # Modes: a partial grant of what a sliding window has left (whole tokens of a fraction, once
        # the previous window weighs), a penalized denial of a fixed window counted down to -capacity
        # (its row written although denied), a check and a wait.
        @example(limits=(("define", "tb", "sliding window", 5, 1000, None, None, None, None, True, "partial"),
                         ("define", "fw", "fixed window", 3, 1000, None, None, None, None, True, "penalize")),
                 sequence=[("call", "rate_limit", "tb", "a", 3, False, False), ("call", "rate_limit", "tb", "a", 3, False, True),
                           ("call", "rate_limit", "tb", "a", 0.5, False, False), ("call", "rate_limit", "fw", "a", 3, False, False),
                           ("call", "rate_limit", "fw", "a", 2, False, False), ("call", "check_rate_limit", "fw", "a", 2, False, False),
                           ("call", "rate_limit", "fw", "a", 3, True, False), ("clock", 250), ("call", "rate_limit", "tb", "a", 3, False, False),
                           ("clock", 250), ("call", "rate_limit", "tb", "a", 3, False, False), ("wait", "fw", "a", 1),
                           ("value", "fw", "a"), ("credit", "fw", "a", 2), ("call", "rate_limit", "fw", "a", 1, False, False)])
        # Several limits at once: a denial reports what a passing part would still have had (its
        # count not taken), and of two blocks for ever the last one named limits the call.
        @example(limits=(("define", "tb", "token bucket", 100, 60000, None, None, None, None, True, "all"),
                         ("define", "fw", "fixed window", 2, 60000, None, None, None, None, True, "all")),
                 sequence=[("call", "rate_limit", "tb", "a", 60, False, False),
                           ("all", "rate_limit_all", [{"name": "tb", "key": "a", "count": 50}, {"name": "fw", "key": "a"}], False, False),
                           ("all", "check_rate_limit_all", [{"name": "fw", "key": "a"}, {"name": "tb", "key": "a", "count": 50}], False, True),
                           ("block", "tb", "b", None), ("block", "fw", "b", None),
                           ("all", "rate_limit_all", [{"name": "tb", "key": "b"}, {"name": "fw", "key": "b"}], False, True),
                           ("allow", None, "c", None), ("all", "rate_limit_all", [{"name": "tb", "key": "c"}, {"name": "fw", "key": "c"}], False, False),
                           ("headers_all", [{"name": "fw", "key": "a"}, {"name": "tb", "key": "a", "count": 50}, {"name": "fw", "key": "z"}]),
                           ("headers", "fw", "a", 1, 11, True), ("headers", "tb", "é", 1, 9, True), ("headers", "tb", None, 3, 11, True),
                           ("all", "rate_limit_all", [{"name": "fw", "key": "a"}, {"name": "tb", "key": "a", "count": 40}], True, False)])
        # Inline configs: each config's own state (its rows named by the config's fingerprint),
        # shadow mode, a credit, a value, headers, a wait, and one as a part of several limits.
        @example(limits=(("define", "tb", "token bucket", 100, 60000, None, None, None, None, True, "all"),
                         ("define", "fw", "fixed window", 2, 60000, None, None, None, None, True, "all")),
                 sequence=[("inline", "rate_limit", "in", "a", 3, False, {"kind": "token bucket", "rate": 5, "period": 1000}),
                           ("inline", "rate_limit", "in", "a", 3, False, {"kind": "sliding window", "rate": 4, "period": 2000, "mode": "partial"}),
                           ("inline", "rate_limit", "in", "a", 3, False, {"kind": "token bucket", "rate": 5, "period": 1000}),
                           ("inline", "rate_limit", "in", "a", 9, False, {"kind": "rolling window", "rate": 6, "period": "3 seconds", "buckets": 3, "enforce": False}),
                           ("inline", "credit", "in", "a", 1, False, {"kind": "token bucket", "rate": 5, "period": 1000}),
                           ("inline", "rate_limit_value", "in", "a", 0, False, {"kind": "token bucket", "rate": 5, "period": 1000}),
                           ("inline", "http_headers", "in", "a", 1, False, {"kind": "fixed window", "rate": 3, "period": "1 minute", "start": "2026-02-28 23:59:59.5+00"}),
                           ("all", "rate_limit_all", [{"name": "tb", "key": "a"}, {"name": "in", "key": "a", "config": {"kind": "token bucket", "rate": 2.5, "period": 500, "capacity": 5, "maxReserved": 3, "minGap": 100}}], False, False),
                           ("clock", 250), ("inline", "wait_rate_limit", "in", "a", 1, False, {"kind": "token bucket", "rate": 5, "period": 1000}),
                           ("reset", "in", "b")])
        # Calendar windows: a month anchored on the 31st (February's window starts on the 28th), and
        # a day in Berlin whose boundary, 02:30, is shown twice the night summer time ends.
        @example(limits=(("define", "tb", "token bucket", 100, 60000, None, None, None, None, True, "all"),
                         ("define", "fw", "fixed window", 2, 60000, None, None, None, None, True, "all")),
                 sequence=[("calendar", "fw", 2, "1 month", None, "2026-01-31 23:30:00+00", None),
                           ("call", "rate_limit", "fw", "a", 1, False, False), ("value", "fw", "a"),
                           ("calendar", "tb", 2, "1 day", "Europe/Berlin", "2026-01-10 02:30:00+01", None),
                           ("clock", 238 * 86400000 + 3600000), ("call", "rate_limit", "tb", "a", 2, False, False),
                           ("call", "rate_limit", "tb", "a", 1, False, False)])
        # Overrides and tiers: a key moved up and back down with its count kept, a tier that is
        # named (and so stays), an exempt key, numbers the kind cannot have, an override ending.
        @example(limits=(("define", "tb", "token bucket", 2, 60000, None, None, None, None, True, "all"),
                         ("define", "fw", "sliding window", 3, 60000, None, None, None, None, True, "all")),
                 sequence=[("call", "rate_limit", "tb", "a", 2, False, False), ("call", "rate_limit", "tb", "a", 1, False, False),
                           ("override", "tb", "a", 50, None, False, None), ("call", "rate_limit", "tb", "a", 7, False, False),
                           ("tier", "tb", "pro", 40), ("in tier", "tb", "b", "pro"), ("call", "rate_limit", "tb", "b", 11, False, False),
                           ("headers", "tb", "b", 1, 11, True), ("remove tier", "tb", "pro"), ("in tier", "tb", "b", "free"),
                           ("override", "tb", "é", None, None, True, None), ("call", "rate_limit", "tb", "é", 11, False, False),
                           ("override", "fw", "a", None, 3, False, None), ("override", "fw", None, 4, None, False, 900),
                           ("call", "rate_limit", "fw", None, 4, False, False), ("clock", 1000), ("call", "check_rate_limit", "fw", None, 1, False, False),
                           ("remove override", "tb", "a"), ("call", "rate_limit", "tb", "a", 1, False, False),
                           ("all", "rate_limit_all", [{"name": "tb", "key": "é"}, {"name": "fw", "key": "b"}], False, False),
                           ("value", "tb", "b"), ("prune", 10000)])
        def sequences(limits, sequence):
            for conn in (ext, ed):
                for table in ("overrides", "tiers", "limits", "state", "blocks", "allows"):
                    conn.execute(f"DELETE FROM rate_limiter.{table}")
            now_ms = 0
            for n, s in enumerate([*limits, *sequence]):
                if s[0] == "clock":
                    now_ms = max(now_ms + s[1], 0) if s[1] >= 0 else now_ms + s[1]
                    continue
                answers = []
                for conn in (ext, ed):
                    conn.execute("SELECT set_config('rate_limiter.fake_now', (%s::timestamptz + make_interval(secs => %s::float8 / 1000))::text, false)",
                                 (START, now_ms))
                    answers.append(step(conn, s, now_ms))
                assert answers[0] == answers[1], f"step {n} {s}:\nextension {answers[0]}\nedition   {answers[1]}"
            state = "SELECT name, key, shard, value, ts, expires, granted_at FROM rate_limiter.state ORDER BY 1, 2"
            assert run(ext, state) == run(ed, state), "the same rows"
        sequences()


@every_version
def test_the_pg_tle_script_installs_as_an_extension_of_the_databases_owner(test_cluster, pg):
    """pg_tle is not packaged for Debian: the script pg_tle.sql hands it is installed here as
    an extension of PostgreSQL's own (a control file with superuser = false), created by a
    database's owner who is not a superuser, used, granted to an application, and dropped."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("build", ROOT / "sql-only" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    script = build.extension_script(EDITION.read_text())
    assert build.pg_tle(EDITION.read_text()) == (ROOT / "sql-only" / "pg_tle.sql").read_text()
    owner, app, dbname = "tle_owner_" + uuid.uuid4().hex[:6], "tle_app_" + uuid.uuid4().hex[:6], "tle_" + uuid.uuid4().hex[:8]
    with test_cluster.connect() as admin:
        share = Path(admin.execute("SELECT setting FROM pg_config WHERE name = 'SHAREDIR'").fetchone()[0]) / "extension"
        admin.execute(f"CREATE ROLE {owner} LOGIN NOSUPERUSER")
        admin.execute(f"CREATE ROLE {app} LOGIN NOSUPERUSER")
        admin.execute(f"CREATE DATABASE {dbname} OWNER {owner}")
    control, sql = share / f"{build.PG_TLE_NAME}.control", share / f"{build.PG_TLE_NAME}--{build.VERSION}.sql"
    control.write_text(f"default_version = '{build.VERSION}'\nrelocatable = false\nsuperuser = false\n")
    sql.write_text(script)
    try:
        with test_cluster.connect(dbname, user=owner) as c:
            c.execute(f"CREATE EXTENSION {build.PG_TLE_NAME}")
            assert c.execute("SELECT rate_limiter.edition()").fetchone() == (f"sql-only {build.VERSION}",)
            c.execute("SELECT rate_limiter.define('api', 'token bucket', 2, '1 minute')")
            c.execute(f"GRANT USAGE ON SCHEMA rate_limiter TO {app}")
            c.execute(f"GRANT EXECUTE ON FUNCTION rate_limiter.rate_limit TO {app}")
        with test_cluster.connect(dbname, user=app) as c:
            assert [c.execute("SELECT ok FROM rate_limiter.rate_limit('api', 'k')").fetchone()[0] for _ in range(3)] == [True, True, False]
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute("SELECT * FROM rate_limiter.state")
        with test_cluster.connect(dbname, user=owner) as c:
            c.execute(f"DROP EXTENSION {build.PG_TLE_NAME}")
            assert c.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'rate_limiter'").fetchone() == (0,)
    finally:
        control.unlink()
        sql.unlink()
        with test_cluster.connect() as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
            admin.execute(f"DROP ROLE {app}")
            admin.execute(f"DROP ROLE {owner}")


@every_version
def test_the_modes_refusals_answer_as_the_extension(test_cluster, database_name, edition, pg):
    """What a mode other than 'all' cannot have is refused with the extension's error, and
    other refusals and messages answer as the extension's."""
    dbname, _ = edition
    statements = [
        "SELECT rate_limiter.define('m', 'token bucket', 5, '1 second', mode => 'partial', deny_cache => '1 second')",
        "SELECT rate_limiter.define('m', 'token bucket', 5, '1 second', mode => 'partial')",
        "SELECT * FROM rate_limiter.rate_limit('m', 'k', 1, reserve => true)",
        "SELECT rate_limiter.define('m', 'fixed window', 5, '1 second', mode => 'penalize', max_reserved => 3)",
        "SELECT * FROM rate_limiter.check_rate_limit('m', 'k', 1, reserve => true)",
        "SELECT rate_limiter.define('m', 'token bucket', 5, '1 second', mode => 'some')",
        # What review found told apart: the order of refusals, messages printing values raw or
        # as Rust's Debug, a negative month, a start after 2255 (microseconds beyond 2^53).
        "SELECT rate_limiter.define('m', 'token bucket', 5, '1 second', mode => 'x\"y')",
        "SELECT rate_limiter.define('neg', 'fixed window', 1, '-1 month')",
        """SELECT * FROM rate_limiter.rate_limit_all('[{"name": "m", "key": "\u0001é\\\\q"}, {"name": "m", "key": "\u0001é\\\\q"}]')""",
        "SELECT rate_limiter.define('late', 'fixed window', 2, '1 hour', start => '2300-01-01 00:00:00.000001+00')",
        "SELECT effective_config FROM rate_limiter.rate_limit_value('late', 'k')",
        """SELECT effective_config FROM rate_limiter.rate_limit_value('x', 'k', '{"kind": "fixed window", "rate": 2, "period": "1 hour", "start": "2300-01-01 00:00:00.000001+00"}')""",
    ]
    with test_cluster.connect(database_name) as ext, test_cluster.connect(dbname) as ed:
        answers = [[run(conn, sql) for sql in statements] for conn in (ext, ed)]
    assert answers[0] == answers[1]
    assert [a[1] if a[0] == "error" else None for a in answers[1]][:6] == ["0A000", None, "0A000", None, "0A000", "22023"]
    # A memory limit is refused before its capacity is judged, as the extension refuses it
    # (each in its own words: the edition has no memory limits at all).
    sql = """SELECT * FROM rate_limiter.rate_limit('x', 'k', config => '{"kind": "rolling window", "rate": 10, "capacity": 5, "period": 1000, "durable": false}')"""
    with test_cluster.connect(database_name) as ext, test_cluster.connect(dbname) as ed:
        assert run(ext, sql)[1] == run(ed, sql)[1] == "0A000"


@every_version
def test_inline_configs_the_edition_cannot_keep_are_refused_naming_the_extension(test_cluster, edition, pg):
    """What an inline config may ask that needs the extension is refused (0A000), never
    approximated; the same config under another name or key reaches a state of its own."""
    dbname, _ = edition
    refused = [
        {"kind": "token bucket", "rate": 5, "period": 1000, "durable": False},
    ]
    with test_cluster.connect(dbname) as c:
        for config in refused:
            with pytest.raises(psycopg.errors.FeatureNotSupported) as e:
                c.execute("SELECT * FROM rate_limiter.rate_limit('x', 'k', config => %s::jsonb)", (json.dumps(config),))
            assert "SQL-only edition" in e.value.diag.message_primary and "CREATE EXTENSION rate_limiter" in e.value.diag.message_hint
        # A caller's inline config names a zone of the tz database: PostgreSQL would keep every
        # POSIX-style spec it loaded for the process's life (the extension counts them; the
        # edition has nowhere to), so none is loaded. A named limit's spec is its owner's.
        for spec in ["<X0_1>+1", "XYZ5", "<+03>-3"]:
            config = {"kind": "fixed window", "rate": 1, "period": "1 day", "tz": spec}
            with pytest.raises(psycopg.errors.FeatureNotSupported) as e:
                c.execute("SELECT * FROM rate_limiter.check_rate_limit('x', 'k', config => %s::jsonb)", (json.dumps(config),))
            assert "SQL-only edition" in e.value.diag.message_primary and "CREATE EXTENSION rate_limiter" in e.value.diag.message_hint
        config = json.dumps({"kind": "token bucket", "rate": 1, "period": 60000})
        took = [c.execute("SELECT ok FROM rate_limiter.rate_limit(%s, %s, config => %s::jsonb)", (n, k, config)).fetchone()[0]
                for n, k in [("x", "k"), ("x", "k"), ("y", "k"), ("x", None)]]
        assert took == [True, False, True, True]
        c.execute("SELECT rate_limiter.reset_rate_limit('x', 'k')")
        assert c.execute("SELECT ok FROM rate_limiter.rate_limit('x', 'k', config => %s::jsonb)", (config,)).fetchone() == (True,)


@every_version
def test_a_lock_timeout_answers_as_the_extension_while_another_transaction_holds_the_row(test_cluster, database_name, edition, pg):
    """A limit with lock_timeout never queues behind a transaction holding its row: after
    lock_timeout it answers by its policy (deny, allow), as the extension does; once the
    holder ends, the call takes as usual. A check never waits."""
    import time
    dbname, _ = edition
    calls = [
        ("SELECT * FROM rate_limiter.rate_limit('lt', 'k')", "a named limit, denied"),
        ("SELECT * FROM rate_limiter.rate_limit('lt_allow', 'k')", "a named limit, let through"),
        ("SELECT * FROM rate_limiter.rate_limit('in', 'k', config => '{\"kind\": \"token bucket\", \"rate\": 5, "
         "\"period\": 60000, \"lockTimeout\": \"120 ms\"}'::jsonb)", "an inline config"),
    ]
    answers = {}
    for test_conn in (database_name, dbname):
        with test_cluster.connect(test_conn) as holder, test_cluster.connect(test_conn) as caller:
            for c in (holder, caller):
                c.execute("SET rate_limiter.fake_now = '2026-03-01 00:00:00+00'")
            holder.execute("SELECT rate_limiter.define('lt', 'token bucket', 5, '1 minute', lock_timeout => '150 ms')")
            holder.execute("SELECT rate_limiter.define('lt_allow', 'fixed window', 5, '1 minute', lock_timeout => '100 ms', "
                           "on_lock_timeout => 'allow')")
            for sql, _ in calls:
                holder.execute(sql)  # the rows exist
            holder.execute("BEGIN")
            for sql, _ in calls:
                holder.execute(sql)  # and are held
            got = []
            for sql, what in calls:
                started = time.monotonic()
                got.append((run(caller, sql), what))
                assert time.monotonic() - started >= 0.09, what
            got.append(run(caller, "SELECT * FROM rate_limiter.check_rate_limit('lt', 'k')"))
            holder.execute("COMMIT")
            got.append(run(caller, calls[0][0]))
            answers[test_conn] = got
    assert answers[database_name] == answers[dbname]
    reasons = [a[0][0][5] for a in answers[dbname][:3]]
    assert reasons == ["lock_timeout"] * 3 and [a[0][0][0] for a in answers[dbname][:3]] == [False, True, False]
    assert answers[dbname][4][0][0] is True and answers[dbname][4][0][4] == bits(1.0), "taken once the holder ended"


@every_version
def test_a_sharded_limit_answers_as_the_extension_where_its_random_shards_do_not_matter(test_cluster, database_name, edition, pg):
    """Which shards a call looks at is random in both editions, so a sharded limit is compared
    where that cannot matter: a key's first calls (every shard full), checks, credits and
    values of it, every refusal, and one call on a key whose every shard is drained."""
    dbname, _ = edition
    statements = ["SET rate_limiter.fake_now = '2026-03-01 00:00:00+00'"]
    limits = [("s2", "token bucket", 10, "1 minute", 2, None), ("s3", "fixed window", 9, "1 minute", 3, 3),
              ("s4", "token bucket", 40, "1 minute", 4, None), ("s8", "fixed window", 16, "1 hour", 8, 8)]
    for name, kind, rate, period, shards, max_reserved in limits:
        statements.append(f"SELECT rate_limiter.define('{name}', '{kind}', {rate}, '{period}', shards => {shards}, "
                          f"max_reserved => {max_reserved or 'NULL'})")
        for n, (count, reserve) in enumerate([(1, False), (3, False), (0, False), (5, True), (7, False), (100, True)]):
            statements.append(f"SELECT * FROM rate_limiter.check_rate_limit('{name}', 'c{n}', {count}, {reserve})")
            statements.append(f"SELECT * FROM rate_limiter.rate_limit('{name}', 'k{n}', {count}, {reserve})")
            statements.append(f"SELECT * FROM rate_limiter.credit('{name}', 'f{n}', {count})")
        statements.append(f"SELECT value, ts, shard >= 0, effective_config FROM rate_limiter.rate_limit_value('{name}', 'new', sample_shards => 99)")
        # Every shard drained (one at a time, checks keeping the calls apart), then one more.
        statements.append(f"SELECT count(*) FILTER (WHERE (d).ok), sum((d).granted) FROM (SELECT rate_limiter.rate_limit('{name}', 'dry', "
                          f"{rate // shards}) d FROM generate_series(1, 200)) calls")
        statements.append(f"SELECT * FROM rate_limiter.rate_limit('{name}', 'dry', 1)")
    statements += [
        "SELECT * FROM rate_limiter.rate_limit('s4', 'k', 25)",
        """SELECT * FROM rate_limiter.check_rate_limit_all('[{"name": "s4", "key": "all"}, {"name": "s3", "key": "all", "count": 5}]', true)""",
        """SELECT * FROM rate_limiter.rate_limit_all('[{"name": "s4", "key": "all"}, {"name": "s3", "key": "all", "count": 5}]', true)""",
        """SELECT * FROM rate_limiter.rate_limit_all('[{"name": "s2", "key": "all", "count": 6}, {"name": "s8", "key": "all"}]')""",
        "SELECT * FROM rate_limiter.rate_limit('s8', 'k', 11, reserve => true)",
        "SELECT rate_limiter.define('bad', 'token bucket', 40, '1 minute', shards => 4, min_gap => '1 second')",
        "SELECT rate_limiter.define('bad', 'token bucket', 40, '1 minute', shards => 4, mode => 'penalize')",
        "SELECT rate_limiter.define('bad', 'token bucket', 40, '1 minute', shards => 4, lock_timeout => '1 second')",
        "SELECT * FROM rate_limiter.rate_limit('in', 'k', 3, config => '{\"kind\": \"token bucket\", \"rate\": 8, \"period\": 1000, \"shards\": 4}')",
        "SELECT name, shard < 0, count(*) FROM rate_limiter.state WHERE key LIKE 'k%' OR name LIKE 'in#%' GROUP BY 1, 2, key ORDER BY 1, 2",
    ]
    with test_cluster.connect(database_name) as ext, test_cluster.connect(dbname) as ed:
        answers = [[run(conn, sql) for sql in statements[1:]] for conn in (ext, ed) if conn.execute(statements[0]) or True]
    for sql, a, b in zip(statements[1:], *answers):
        assert a == b, f"{sql}:\nextension {a}\nedition   {b}"
    assert any(a[0] == "error" and a[1] == "22023" and "per 4 shards" in a[2] for a in answers[1]), "an impossible count of 4 shards"


@every_version
def test_concurrency_limits_answer_as_the_extension(test_cluster, database_name, edition, pg):
    """Slots held by a transaction and by leases, checks, values, releases and renewals, the
    refusals of what a concurrency limit has not, as the extension answers them (lease ids
    apart, random in both)."""
    dbname, _ = edition
    inline = '{"kind": "concurrency", "rate": 2, "period": 1000}'
    script = [
        "SELECT rate_limiter.define('c', 'concurrency', 3, '10 seconds')",
        "ACQUIRE c k 1 5 seconds", "ACQUIRE c k 1 5 seconds",
        "SELECT * FROM rate_limiter.check_rate_limit('c', 'k', 1)",
        "SELECT * FROM rate_limiter.check_rate_limit('c', 'k', 2)",
        "SELECT * FROM rate_limiter.rate_limit('c', 'k', 2)",
        "SELECT * FROM rate_limiter.rate_limit('c', 'k', 1)",
        "SELECT value, shard, effective_config FROM rate_limiter.rate_limit_value('c', 'k')",
        "HOLD c k 1", "OTHER SELECT * FROM rate_limiter.check_rate_limit('c', 'k', 1)",
        "OTHER SELECT * FROM rate_limiter.rate_limit('c', 'k', 1)", "END HOLD",
        "RELEASE c k 0", "RELEASE c k 0", "RENEW c k 1 20 seconds",
        "CLOCK 6000", "SELECT * FROM rate_limiter.check_rate_limit('c', 'k', 3)", "RENEW c k 1 1 second",
        "CLOCK 15000", "SELECT * FROM rate_limiter.check_rate_limit('c', 'k', 3)",
        f"SELECT * FROM rate_limiter.rate_limit('c', 'k', 1, config => '{inline}')",
        f"SELECT ok, remaining FROM rate_limiter.acquire('c', 'k', 2, '1 minute', config => '{inline}')",
        f"SELECT * FROM rate_limiter.check_rate_limit('c', 'k', 1, config => '{inline}')",
        "SELECT rate_limiter.reset_rate_limit('c', 'k')",
        f"SELECT * FROM rate_limiter.check_rate_limit('c', 'k', 1, config => '{inline}')",
        "SELECT rate_limiter.prune()",
        "SELECT * FROM rate_limiter.acquire('c', 'k', 1.5)",
        "SELECT * FROM rate_limiter.acquire('c', 'k', 1, '2 days')",
        "SELECT * FROM rate_limiter.acquire('c', 'k', 1, '0 seconds')",
        "SELECT * FROM rate_limiter.acquire('c', 'k', 4)",
        "SELECT * FROM rate_limiter.rate_limit('c', 'k', 1, reserve => true)",
        "SELECT * FROM rate_limiter.credit('c', 'k', 1)",
        """SELECT * FROM rate_limiter.rate_limit_all('[{"name": "c", "key": "k"}]')""",
        "SELECT rate_limiter.define('t', 'token bucket', 3, '1 minute')",
        "SELECT * FROM rate_limiter.acquire('t', 'k')",
        "SELECT rate_limiter.define('c2', 'concurrency', 2.5, '1 second')",
        "SELECT rate_limiter.define('c2', 'concurrency', 2, '1 second', shards => 2)",
        "SELECT rate_limiter.define('c2', 'concurrency', 2, '1 second', min_gap => '1 second')",
        "SELECT rate_limiter.release('c', 'k', NULL)",
        "SELECT rate_limiter.renew('c', 'k', gen_random_uuid(), NULL)",
    ]
    answers = []
    for test_conn in (database_name, dbname):
        got, leases = [], []
        now_ms = 0
        with test_cluster.connect(test_conn) as c, test_cluster.connect(test_conn) as other, test_cluster.connect(test_conn, autocommit=False) as holder:
            def clock():
                for conn in (c, other, holder):
                    conn.execute("SELECT set_config('rate_limiter.fake_now', (%s::timestamptz + make_interval(secs => %s::float8 / 1000))::text, false)",
                                 (START, now_ms))
                holder.commit()
            clock()
            for step in script:
                words = step.split(" ", 4)
                if words[0] == "ACQUIRE":
                    row = run(c, "SELECT * FROM rate_limiter.acquire(%s, %s, %s, %s::interval)", (words[1], words[2], words[3], words[4]))
                    leases.append(row[0][7] if isinstance(row, list) else None)
                    got.append(row[0][:7] if isinstance(row, list) else row)
                elif words[0] == "HOLD":
                    got.append(holder.execute("SELECT ok, remaining FROM rate_limiter.rate_limit(%s, %s, %s)", words[1:4]).fetchone())
                elif step == "END HOLD":
                    holder.commit()
                elif words[0] == "OTHER":
                    got.append(run(other, step[6:]))
                elif words[0] == "RELEASE":
                    got.append(run(c, "SELECT rate_limiter.release(%s, %s, %s)", (words[1], words[2], leases[int(words[3])])))
                elif words[0] == "RENEW":
                    got.append(run(c, "SELECT rate_limiter.renew(%s, %s, %s, %s::interval)", (words[1], words[2], leases[int(words[3])], words[4])))
                elif words[0] == "CLOCK":
                    now_ms += int(words[1])
                    clock()
                else:
                    got.append(run(c, step))
        answers.append(got)
    for step, a, b in zip([s for s in script if s not in ("END HOLD",) and not s.startswith("CLOCK")], *answers):
        assert a == b, f"{step}:\nextension {a}\nedition   {b}"
    assert len(answers[0]) == len(answers[1])


@every_version
def test_a_change_of_a_limit_waits_for_the_transactions_holding_slots(test_cluster, database_name, edition, pg):
    """A rate lowered while transactions hold slots above it would be judged without them:
    define waits for every transaction that called a concurrency limit, as the extension's
    does; and a cancelled call leaves no lock of the edition's behind."""
    dbname, _ = edition
    for test_conn in (database_name, dbname):
        with test_cluster.connect(test_conn) as c, test_cluster.connect(test_conn, autocommit=False) as holder:
            c.execute("SELECT rate_limiter.define('pool', 'concurrency', 3, '1 second')")
            assert holder.execute("SELECT ok FROM rate_limiter.acquire('pool', 'k', 3)").fetchone() == (True,)
            c.execute("SET lock_timeout = '200ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                c.execute("SELECT rate_limiter.define('pool', 'concurrency', 1, '1 second')")
            holder.commit()
            c.execute("SELECT rate_limiter.define('pool', 'concurrency', 1, '1 second')")
            # The new rate holds: one slot, and nothing of a call is left held once it ends.
            holder.execute("SELECT ok FROM rate_limiter.acquire('pool', 'k', 1)")
            assert c.execute("SELECT ok FROM rate_limiter.acquire('pool', 'k', 1)").fetchone() == (False,)
            holder.commit()
            assert c.execute("SELECT ok FROM rate_limiter.acquire('pool', 'k', 1)").fetchone() == (True,)
            assert c.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()").fetchone() == (0,)
    # The edition's search of a key's slots holds a session-level lock while it runs: a call
    # cancelled while it waits for another's search (here, a lock taken by hand) leaves none.
    with test_cluster.connect(dbname) as c, test_cluster.connect(dbname) as searching:
        searching.execute("SELECT pg_advisory_lock(rate_limiter._slot_lock('pool', 'k', -1))")
        c.execute("SET statement_timeout = '150ms'")
        with pytest.raises(psycopg.errors.QueryCanceled):
            c.execute("SELECT * FROM rate_limiter.acquire('pool', 'k', 1)")
        assert c.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()").fetchone() == (0,)
        searching.execute("SELECT pg_advisory_unlock_all()")
        assert c.execute("SELECT ok FROM rate_limiter.acquire('pool', 'k', 1)").fetchone() == (True,)


@every_version
def test_the_editions_removals_see_an_override_committed_while_they_waited_or_are_refused(test_cluster, edition, pg):
    """As the extension's (test_overrides.py): override() holds its limit's row, so that a
    DELETE of the limit waits for it and then deletes the override too. Outside READ
    COMMITTED a statement cannot see what committed after its snapshot in SQL: remove_tier()
    and a DELETE of the limits are refused there (0A000), not left with an override naming
    nothing."""
    dbname, owner = edition
    with test_cluster.connect(dbname, user=owner) as c:
        c.execute("SELECT rate_limiter.define('plans', 'token bucket', 1, '1 hour')")
        c.execute("SELECT rate_limiter.define_tier('plans', 'pro', rate => 10)")
    with test_cluster.connect(dbname, user=owner, autocommit=False) as admin, \
         test_cluster.connect(dbname, user=owner, autocommit=False) as changer:
        admin.execute("SELECT rate_limiter.override('plans', 'k', tier => 'pro')")
        changer.execute("SET lock_timeout = '300ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            changer.execute("DELETE FROM rate_limiter.limits WHERE name = 'plans'")
        changer.rollback()
        admin.commit()
        for removal in ["SELECT rate_limiter.remove_tier('plans', 'pro')", "DELETE FROM rate_limiter.limits WHERE name = 'plans'",
                        "TRUNCATE rate_limiter.limits"]:
            changer.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            with pytest.raises(psycopg.errors.FeatureNotSupported, match="in a repeatable read transaction"):
                changer.execute(removal)
            changer.rollback()
        changer.execute("DELETE FROM rate_limiter.limits WHERE name = 'plans'")
        changer.commit()
        assert changer.execute("SELECT (SELECT count(*) FROM rate_limiter.overrides) + (SELECT count(*) FROM rate_limiter.tiers)").fetchone() == (0,)


@every_version
def test_a_concurrency_limit_never_lets_more_hold_its_slots_than_it_has(test_cluster, edition, pg):
    """8 sessions take a slot of a limit of 3, in transactions that hold it a moment, commit
    or roll back, and some by a lease released before the end: never more than 3 at once."""
    import threading
    import time

    dbname, _ = edition
    with test_cluster.connect(dbname) as c:
        c.execute("SELECT rate_limiter.define('pool', 'concurrency', 3, '1 second')")
    lock = threading.Lock()
    active, most, granted = [0], [0], [0]

    def session(seed):
        rnd = seeded(seed)
        with test_cluster.connect(dbname, autocommit=False) as c:
            for _ in range(25):
                lease = rnd.choice([None, None, "1 minute"])
                ok, lease_id = c.execute("SELECT ok, lease_id FROM rate_limiter.acquire('pool', 'k', 1, %s::interval)", (lease,)).fetchone()
                if ok:
                    with lock:
                        active[0] += 1
                        granted[0] += 1
                        most[0] = max(most[0], active[0])
                    time.sleep(0.003)
                    with lock:
                        active[0] -= 1
                    if lease_id is not None:
                        c.execute("SELECT rate_limiter.release('pool', 'k', %s)", (lease_id,))
                (c.rollback if rnd.random() < 0.3 else c.commit)()

    assert not in_eight_sessions(session)
    assert most[0] <= 3, most[0]
    assert granted[0] >= 25, granted[0]
    with test_cluster.connect(dbname) as c:
        assert c.execute("SELECT count(*) FROM rate_limiter.leases WHERE expires_at > now()").fetchone() == (0,), "every lease released or rolled back"


@every_version
def test_ip_key_and_the_waits_answer_as_the_extension(test_cluster, database_name, edition, pg):
    dbname, _ = edition
    addresses = ["::ffff:203.0.113.7", "2001:db8:1234:5678::1", "198.51.100.23/8", "64:ff9b::198.51.100.23",
                 "2002:c000:204::1", "2001:0:4136:e378:8000:63bf:3fff:fdd2", "::1", "10.1.2.3"]
    with test_cluster.connect(database_name) as ext, test_cluster.connect(dbname) as ed:
        for addr in addresses:
            for prefixes in [(32, 56), (24, 64), (0, 0), (33, 56), (32, 129)]:
                sql = "SELECT rate_limiter.ip_key(%s::inet, %s, %s)"
                assert run(ext, sql, (addr, *prefixes))[:1] == run(ed, sql, (addr, *prefixes))[:1]
        # A decision that is NULL, and one of NULLs, told apart as the extension tells them.
        for conn in (ext, ed):
            conn.execute("SELECT rate_limiter.define('h', 'token bucket', 1, '1 minute')")
        for d in ["NULL", "ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL)"]:
            sql = f"SELECT rate_limiter.http_headers('h', {d}::rate_limiter.decision)"
            assert run(ext, sql) == run(ed, sql)
        # A wait that sleeps once (the real clock), then gets its token; and one that times out.
        for conn in (ext, ed):
            conn.execute("SELECT rate_limiter.define('w', 'token bucket', 10, '1 second')")
            conn.execute("SELECT rate_limiter.rate_limit('w', 'k', 10)")
        for conn in (ext, ed):
            d = conn.execute("SELECT ok, reason FROM rate_limiter.wait_rate_limit('w', 'k', 2, '1 second')").fetchone()
            assert d == (True, None)
            conn.execute("SELECT rate_limiter.rate_limit('w', 'k', 10, reserve => true)")
            d = conn.execute("SELECT ok, reason FROM rate_limiter.wait_rate_limit('w', 'k', 1, '150 ms')").fetchone()
            assert d == (False, "exhausted")


@pytest.fixture
def bare(clusters):
    """A server without the extension's library, as a managed service is, where the settings
    rate_limiter.fake_now and rate_limiter.shadow are placeholders anyone may SET; the edition
    installed by the database's owner."""
    cluster = clusters("sql_only", PORTS["sql_only"]).init().start()
    with cluster.connect() as admin:
        admin.execute("CREATE ROLE ed_owner LOGIN NOSUPERUSER")
    install(cluster, "ed", "ed_owner")
    yield cluster, "ed", "ed_owner"


def test_the_clock_is_closed_to_a_role_that_may_only_call_and_a_hostile_search_path_changes_nothing(bare):
    test_cluster, dbname, owner = bare
    app = "ed_app_" + uuid.uuid4().hex[:6]
    with test_cluster.connect() as admin:
        admin.execute(f"CREATE ROLE {app} LOGIN")
    try:
        with test_cluster.connect(dbname, user=owner) as c:
            c.execute(f"GRANT USAGE ON SCHEMA rate_limiter TO {app}")
            c.execute(f"GRANT EXECUTE ON FUNCTION rate_limiter.rate_limit, rate_limiter.check_rate_limit, rate_limiter.wait_rate_limit TO {app}")
            c.execute("SELECT rate_limiter.define('api', 'token bucket', 2, '1 hour')")
        with test_cluster.connect(dbname, user=app) as c:
            # Without the library, the setting is a placeholder anyone may SET: the edition refuses it.
            c.execute("SET rate_limiter.fake_now = '2999-01-01'")
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="fake_now"):
                c.execute("SELECT * FROM rate_limiter.rate_limit('api', 'k')")
            c.execute("RESET rate_limiter.fake_now")
            assert c.execute("SELECT ok FROM rate_limiter.wait_rate_limit('api', 'w', 1, '0')").fetchone() == (True,), \
                "a role with EXECUTE on wait_rate_limit waits"
            c.execute("SET rate_limiter.shadow = on")
            with pytest.raises(psycopg.errors.FeatureNotSupported, match="rate_limiter.shadow"):
                c.execute("SELECT * FROM rate_limiter.rate_limit('api', 'k')")
            c.execute("RESET rate_limiter.shadow")
            c.execute("SET rate_limiter.shadow = 'no'")  # off, as PostgreSQL reads a boolean
            c.execute("SELECT * FROM rate_limiter.check_rate_limit('api', 'k')")
            c.execute("RESET rate_limiter.shadow")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute("SELECT * FROM rate_limiter.state")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute("SELECT rate_limiter.define('api', 'token bucket', 1e6, '1 second')")
        # The owner's login with SET ROLE to the application: the application's clock rules.
        with test_cluster.connect(dbname) as admin:
            admin.execute(f"GRANT {app} TO {owner}")
        with test_cluster.connect(dbname, user=owner) as c:
            c.execute(f"SET ROLE {app}")
            c.execute("SET rate_limiter.fake_now = '2999-01-01'")
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="fake_now"):
                c.execute("SELECT * FROM rate_limiter.rate_limit('api', 'k')")
        # Look-alikes of what the functions use, first on the caller's path.
        with test_cluster.connect(dbname) as admin:
            admin.execute("CREATE SCHEMA evil")
            admin.execute(f"GRANT USAGE ON SCHEMA evil TO {app}")
            admin.execute("CREATE FUNCTION evil.least(float8, float8) RETURNS float8 LANGUAGE sql AS 'SELECT 1e9::float8'")
            admin.execute("CREATE FUNCTION evil.gt(float8, float8) RETURNS boolean LANGUAGE sql AS 'SELECT true'")
            admin.execute("CREATE OPERATOR evil.> (LEFTARG = float8, RIGHTARG = float8, FUNCTION = evil.gt)")
            admin.execute("CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE sql AS 'SELECT ''1970-01-01''::timestamptz'")
        with test_cluster.connect(dbname, user=app) as c:
            c.execute("SET search_path = evil, pg_catalog, public")
            answers = [c.execute("SELECT ok, round(remaining) FROM rate_limiter.rate_limit('api', 'k')").fetchone() for _ in range(3)]
            assert answers == [(True, 1.0), (True, 0.0), (False, 0.0)]
    finally:
        with test_cluster.connect(dbname) as admin:
            admin.execute(f"DROP OWNED BY {app} CASCADE")  # its grants live in the edition's database
            admin.execute(f"REVOKE {app} FROM {owner}")
            admin.execute(f"DROP ROLE {app}")


@every_version
def test_the_edition_never_admits_more_than_the_limit_under_eight_sessions_and_counts_exactly(test_cluster, edition, pg):
    """8 sessions on one key and on a few, each call (of one pair, or of two at once through
    rate_limit_all, named in either order) committed, rolled back, or undone by a rolled-back
    savepoint, with the clock stopped (no refill): what the committed calls were granted is
    never more than the capacity, what is left is exactly the rest, and no two calls
    deadlock."""
    import threading

    dbname, _ = edition
    with test_cluster.connect(dbname) as c:
        c.execute("SELECT rate_limiter.define('ledger', 'token bucket', 40, '1 hour')")
        c.execute("SELECT rate_limiter.define('ledger_fw', 'fixed window', 25, '1 hour', start => '2026-01-01')")
        c.execute("SELECT rate_limiter.define('ledger_sharded', 'token bucket', 32, '1 hour', shards => 4)")
    kept = {("ledger", "one"): 0.0, ("ledger_fw", "one"): 0.0, ("ledger", "two"): 0.0, ("ledger_sharded", "one"): 0.0}
    lock = threading.Lock()

    def session(seed):
        rnd = seeded(seed)
        with test_cluster.connect(dbname, autocommit=False) as c:
            c.execute("SET rate_limiter.fake_now = '2026-03-01 00:00:00+00'")
            c.commit()
            for _ in range(40):
                # One pair, or two at once (rate_limit_all, named in either order).
                pairs = rnd.sample(list(kept), rnd.choice([1, 1, 2]))
                count = rnd.choice([1, 1, 2, 3])
                how = rnd.choice(["commit", "commit", "rollback", "savepoint"])
                if how == "savepoint":
                    c.execute("SAVEPOINT s")
                if len(pairs) == 1:
                    ok, granted = c.execute("SELECT ok, granted FROM rate_limiter.rate_limit(%s, %s, %s)",
                                            (*pairs[0], count)).fetchone()
                else:
                    requests = json.dumps([{"name": limit, "key": key, "count": count} for limit, key in pairs])
                    ok, granted = c.execute("SELECT ok, granted FROM rate_limiter.rate_limit_all(%s::jsonb)",
                                            (requests,)).fetchone()
                if how == "savepoint":
                    c.execute("ROLLBACK TO SAVEPOINT s")
                    c.commit()
                elif how == "rollback":
                    c.rollback()
                else:
                    c.commit()
                    with lock:
                        for pair in pairs:
                            kept[pair] += granted

    assert not in_eight_sessions(session)
    capacity = {"ledger": 40, "ledger_fw": 25, "ledger_sharded": 32}
    with test_cluster.connect(dbname) as c:
        c.execute("SET rate_limiter.fake_now = '2026-03-01 00:00:00+00'")
        for (limit, key), granted in kept.items():
            assert granted <= capacity[limit], (limit, key, granted)
            if limit == "ledger_sharded":
                # What is left is the shards' rows, a shard never written holding its share.
                rows = c.execute("SELECT count(*), coalesce(sum(value), 0) FROM rate_limiter.state WHERE name = %s AND key = %s",
                                 (limit, key)).fetchone()
                remaining = rows[1] + (4 - rows[0]) * 8
            else:
                remaining = c.execute("SELECT remaining FROM rate_limiter.check_rate_limit(%s, %s, 0)", (limit, key)).fetchone()[0]
            assert remaining == capacity[limit] - granted, (limit, key, granted, remaining)
    assert any(g == capacity[lim] for (lim, _), g in kept.items()), f"some key was drained: {kept}"


def test_a_database_moves_from_the_edition_to_the_extension_with_its_limits_and_state(test_cluster, edition):
    """sql-only/to_extension.sql: the edition used, then the extension created over its rows by
    the documented step; every key answers as it did, its state kept."""
    dbname, owner = edition
    with test_cluster.connect(dbname) as c:  # a superuser's session: where the library is loaded, fake_now is theirs to SET
        c.execute("SET rate_limiter.fake_now = '2026-03-01 00:00:00+00'")
        c.execute("SELECT rate_limiter.define('api', 'token bucket', 10, '1 minute')")
        c.execute("SELECT rate_limiter.define('daily', 'fixed window', 3, '2 days', max_reserved => 2)")
        c.execute("SELECT rate_limiter.rate_limit('api', 'alice', 4)")
        c.execute("SELECT rate_limiter.rate_limit('daily', 'bob', 5, reserve => true)")
        c.execute("SELECT rate_limiter.block('api', 'mallory')")
        c.execute("SELECT rate_limiter.rate_limit('express', 'carol', 2, config => %s::jsonb)", (INLINE,))
        c.execute("SELECT rate_limiter.define_tier('api', 'pro', rate => 100)")
        c.execute("SELECT rate_limiter.override('api', 'dave', tier => 'pro', note => 'plan')")
        c.execute("SELECT rate_limiter.rate_limit('api', 'dave', 30)")
        # A write limit moves too: its trigger made again on the extension's function.
        c.execute("CREATE TABLE public.posts (author text)")
        c.execute("ALTER TABLE public.posts OWNER TO " + owner)
        c.execute("SELECT rate_limiter.limit_writes('public.posts', 'daily', key => 'author')")
        c.execute("INSERT INTO public.posts VALUES ('erin'), ('erin')")
        before = [c.execute("SELECT * FROM rate_limiter.check_rate_limit(%s, %s, 1, config => %s::jsonb)", k).fetchone()
                  for k in CHECKED]
    move = [f"{pg_bin(test_cluster.version)}/psql", "-X", "-q", "-h", "/tmp", "-p", str(test_cluster.port), "-U", "postgres",
            "-d", dbname, "-f", str(ROOT / "sql-only" / "to_extension.sql")]
    # A view of the owner's over the edition stops the move (it would be dropped with it).
    with test_cluster.connect(dbname, user=owner) as c:
        c.execute("CREATE VIEW public.keys AS SELECT name, key FROM rate_limiter.state")
    result = subprocess.run(move, capture_output=True, text=True)
    assert result.returncode != 0 and "objects outside the edition use it: rule _RETURN on view public.keys" in result.stderr, result.stderr
    with test_cluster.connect(dbname, user=owner) as c:
        assert c.execute("SELECT rate_limiter.edition()").fetchone() == ("sql-only 0.8.0",), "the edition as it was"
        c.execute("DROP VIEW public.keys")
    result = subprocess.run(move, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    with test_cluster.connect(dbname) as c:
        assert c.execute("SELECT extversion FROM pg_extension WHERE extname = 'rate_limiter'").fetchone() == ("0.8.0",)
        assert c.execute("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'rate_limiter_sql%'").fetchone() == (0,)
        c.execute("SET rate_limiter.fake_now = '2026-03-01 00:00:00+00'")
        after = [c.execute("SELECT * FROM rate_limiter.check_rate_limit(%s, %s, 1, config => %s::jsonb)", k).fetchone()
                 for k in CHECKED]
        # Grants are the extension's: until the table's owner may call rate_limit again, the
        # write limit refuses rather than charge without it.
        with pytest.raises(psycopg.Error) as e:
            c.execute("INSERT INTO public.posts VALUES ('erin')")
        assert e.value.sqlstate == "42501"
        c.execute(f"GRANT USAGE ON SCHEMA rate_limiter TO {owner}")
        c.execute(f"GRANT EXECUTE ON FUNCTION rate_limiter.rate_limit TO {owner}")
        c.execute("INSERT INTO public.posts VALUES ('erin')")
        with pytest.raises(psycopg.Error) as e:
            c.execute("INSERT INTO public.posts VALUES ('erin')")
        assert e.value.sqlstate == "RL429"
        assert c.execute("SELECT \"table\"::text, limit_name FROM rate_limiter.write_limits").fetchall() == [("posts", "daily")]
    assert after == before
    assert before[0][2] == 5 and before[1][0] is False and before[2][5] == "blocked" and before[4][2] == 2, before
    assert before[5][2] == 69, "dave's tier: 100 less his 30 and this 1"


# An inline config (as the client packages pass them): its state moves too, under the same
# fingerprint.
INLINE = '{"kind": "fixed window", "rate": 5, "period": 60000}'
CHECKED = [("api", "alice", None), ("daily", "bob", None), ("api", "mallory", None), ("api", "new", None),
           ("express", "carol", INLINE), ("api", "dave", None)]


@every_version
def test_transactions_calling_one_sharded_key_twice_never_deadlock_and_never_over_admit(test_cluster, database_name, edition, pg):
    """Issue 52, F8: a call waits for a shard's row only above every shard of the key its
    transaction holds, earlier calls' included; waiting below one, two transactions that each
    took from the key could each wait for the other's shard (40P01). 8 sessions x 40
    transactions of one or two calls on one key of 4 shards, a moment apart, on each edition:
    a limit that admits every call, and one that runs out."""
    import time

    for dbname in (database_name, edition[0]):
        with test_cluster.connect(dbname) as c:
            c.execute("SELECT rate_limiter.define('wide', 'token bucket', 1, '1 hour', capacity => 4000, shards => 4)")
            c.execute("SELECT rate_limiter.define('narrow', 'token bucket', 1, '1 hour', capacity => 100, shards => 4)")
        for limit in ("wide", "narrow"):
            admitted, deadlocks = [], []

            def session(seed):
                rnd = seeded(seed)
                with test_cluster.connect(dbname, autocommit=False) as c:
                    for _ in range(40):
                        try:
                            oks = []
                            for call in range(rnd.choice([1, 2, 2])):
                                if call:
                                    time.sleep(0.002)
                                oks.append(c.execute("SELECT ok FROM rate_limiter.rate_limit(%s, 'k')", (limit,)).fetchone()[0])
                            c.commit()
                            admitted.append(sum(oks))
                        except psycopg.errors.DeadlockDetected:
                            deadlocks.append(seed)
                            c.rollback()

            assert not in_eight_sessions(session)
            assert deadlocks == [], f"{dbname} {limit}: {len(deadlocks)} transactions aborted by 40P01"
            capacity = 4000 if limit == "wide" else 100
            with test_cluster.connect(dbname) as c:
                rows, values = c.execute("SELECT count(*), coalesce(sum(value), 0) FROM rate_limiter.state WHERE name = %s AND key = 'k'",
                                         (limit,)).fetchone()
            left = values + (4 - rows) * capacity / 4  # a shard never written is full
            assert sum(admitted) <= capacity, f"{dbname} {limit}: {sum(admitted)} admitted"
            assert sum(admitted) == round(capacity - left), f"{dbname} {limit}: admitted and the rows disagree"
            if limit == "wide":
                assert sum(admitted) >= 8 * 40, f"{dbname}: every call admitted"


@every_version
def test_no_trigger_a_role_plants_on_the_editions_tables_runs_with_its_owners_rights(test_cluster, edition, pg):
    """Issue 52, F6 in the edition: its SECURITY DEFINER functions write as the database's
    owner. A role given ALL on the edition's tables plants on each a trigger that, run as
    anyone else, counts the run (tests/traps.py); every route that writes a table completes
    or refuses with 55000 and the trap never runs."""
    dbname, owner = edition
    role = "ed_planter_" + uuid.uuid4().hex[:6]
    with test_cluster.connect() as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
    try:
        with test_cluster.connect(dbname) as c:
            c.execute(f"CREATE SCHEMA {role} AUTHORIZATION {role}")
        with test_cluster.connect(dbname, user=owner) as c:
            c.execute(f"GRANT USAGE ON SCHEMA rate_limiter TO {role}")
            c.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA rate_limiter TO {role}")
            c.execute(f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA rate_limiter TO {role}")
            c.execute("SELECT rate_limiter.define('rows', 'token bucket', 10, '1 hour')")
            c.execute("SELECT rate_limiter.define('slots', 'concurrency', 2, '1 hour')")
        with test_cluster.connect(dbname, user=role) as planter:
            runs = plant_trigger_traps(planter, role)
            for table in ["limits", "blocks", "allows", "state", "leases", "overrides", "tiers"]:
                # A trigger of the planter's, or the edition's own function with a WHEN of its.
                how = [f"AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON rate_limiter.{table} FOR EACH STATEMENT "
                       f"EXECUTE FUNCTION {role}.trap()",
                       f"BEFORE INSERT OR UPDATE OR DELETE ON rate_limiter.{table} FOR EACH STATEMENT "
                       f"WHEN ({role}.when_trap()) EXECUTE FUNCTION rate_limiter._hold_slot_calls_off()"]
                planter.execute(f"CREATE TRIGGER planted {how[table in ('limits', 'leases')]}")
            refused = 0
            for route in ["SELECT rate_limiter.define('rows', 'token bucket', 20, '1 hour')",
                          "SELECT rate_limiter.rate_limit('rows', 'k')",
                          "SELECT rate_limiter.rate_limit_all('[{\"name\": \"rows\", \"key\": \"k\"}]')",
                          "SELECT rate_limiter.credit('rows', 'k')",
                          "SELECT rate_limiter.block('rows', 'b')", "SELECT rate_limiter.unblock('rows', 'b')",
                          "SELECT rate_limiter.allow('rows', 'a')", "SELECT rate_limiter.disallow('rows', 'a')",
                          "SELECT rate_limiter.acquire('slots', 'k', lease => '1 minute')",
                          "SELECT rate_limiter.reset_rate_limit('rows', 'k')", "SELECT rate_limiter.prune()",
                          "SELECT rate_limiter.override('rows', 'k', rate => 2)", "SELECT rate_limiter.remove_override('rows', 'k')",
                          "SELECT rate_limiter.define_tier('rows', 'pro', rate => 2)", "SELECT rate_limiter.remove_tier('rows', 'pro')",
                          # The edition's own trigger on the limits deletes their overrides and tiers as their owner.
                          "DELETE FROM rate_limiter.limits WHERE name = 'none'"]:
                try:
                    planter.execute(route)
                except psycopg.Error as error:
                    assert error.sqlstate == "55000" and 'it has trigger "planted"' in str(error), f"{route}: {error}"
                    refused += 1
            assert refused == 16, "every route writes a table with a planted trigger"
            assert trap_runs(planter, runs) == 0, "a trap ran with the owner's rights"
        with test_cluster.connect(dbname, user=owner) as c:
            for table in ["limits", "blocks", "allows", "state", "leases", "overrides", "tiers"]:
                c.execute(f"DROP TRIGGER planted ON rate_limiter.{table}")
        with test_cluster.connect(dbname, user=role) as app:
            assert app.execute("SELECT ok FROM rate_limiter.rate_limit('rows', 'k')").fetchone() == (True,)
            # A REPEATABLE READ snapshot taken before a trigger was planted would not show it:
            # refused while another role may plant one.
            app.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            with pytest.raises(psycopg.Error, match="in a repeatable read transaction: another role may create triggers") as refused:
                app.execute("SELECT rate_limiter.rate_limit('rows', 'k')")
            assert refused.value.sqlstate == "55000"
            app.execute("ROLLBACK")
    finally:
        with test_cluster.connect(dbname) as c:
            c.execute(f"DROP OWNED BY {role} CASCADE")
        with test_cluster.connect() as admin:
            admin.execute(f"DROP ROLE {role}")


@every_version
def test_the_editions_override_holds_off_a_define_it_no_longer_fits_and_takes_no_end_on_a_concurrency_limit(test_cluster, edition, pg):
    """Issue 64, F4: the edition's override() held its limit FOR KEY SHARE, which define()'s
    update does not wait for: a definition the pending override no longer fits went through,
    and the key's calls then failed. Now define() waits for it and refuses (as the extension
    does). F2: an override of a concurrency limit with an end is refused (0A000), as the
    extension refuses it: its end let new holders take slots the boost's holders still held."""
    dbname, owner = edition
    with test_cluster.connect(dbname, user=owner, autocommit=False) as admin, \
         test_cluster.connect(dbname, user=owner, autocommit=False) as changer:
        admin.execute("SELECT rate_limiter.define('plans', 'token bucket', 2, '1 hour')")
        admin.commit()
        admin.execute("SELECT rate_limiter.override('plans', 'k', capacity => 5)")
        changer.execute("SET lock_timeout = '300ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            changer.execute("SELECT rate_limiter.define('plans', 'sliding window', 2, '1 hour')")
        changer.rollback()
        admin.commit()
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="capacity"):
            changer.execute("SELECT rate_limiter.define('plans', 'sliding window', 2, '1 hour')")
        changer.rollback()
        assert changer.execute("SELECT ok FROM rate_limiter.rate_limit('plans', 'k')").fetchone() == (True,)
        changer.rollback()

        admin.execute("SELECT rate_limiter.define('pool', 'concurrency', 2, '1 minute')")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="concurrency limit .* with an end"):
            admin.execute("SELECT rate_limiter.override('pool', 'k', rate => 4, until => now() + interval '1 hour')")
        admin.rollback()
        admin.execute("SELECT rate_limiter.define('pool', 'token bucket', 2, '1 minute')")
        admin.execute("SELECT rate_limiter.override('pool', 'k', rate => 4, until => now() + interval '1 hour')")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="overrides with an end"):
            admin.execute("SELECT rate_limiter.define('pool', 'concurrency', 2, '1 minute')")
        admin.rollback()
