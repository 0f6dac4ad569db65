"""Extreme numbers from a caller's side (issue 31): inline configs and `define` arguments drawn
from the edges (0, tiny, huge, 1e300, negative, a period of 178 million years, a tenth of a
microsecond), each used by every call that takes a config, at instants near and far. A call
may be refused with any SQLSTATE but XX000: an internal error (0.4.0 reached a division by
zero, an index out of bounds and a float-to-Duration panic this way, and a hot limit of
178,000,000 years admitted calls whose fold then failed). A lost connection fails too."""

import json
import uuid

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from properties import drawn, examples_on
from clusters import every_version

EDGES = [0, 1e-300, 1e-4, 0.5, 1, 2, 3, 10, 64, 65, 1000, 60000, 1e9, 1e15, 1e15 + 1, 9.3e15, 1e300, -1, -1e300]
NUMBERS = st.one_of(st.sampled_from(EDGES), st.floats(min_value=-1e20, max_value=1e20, allow_nan=False))
INTERVALS = st.sampled_from(["1 microsecond", "0.1 microsecond", "1 ms", "1 second", "1 hour", "1 month",
                             "100 years", "101 years", "178000000 years", "-1 hour", "0"])
DURATIONS = st.one_of(NUMBERS, INTERVALS)
KINDS = st.sampled_from(["token bucket", "fixed window", "sliding window", "rolling window"])
OPTIONAL = {
    "capacity": NUMBERS, "maxReserved": NUMBERS, "shards": st.sampled_from([1, 2, 1024, 1025, 0]),
    "start": st.one_of(NUMBERS, st.sampled_from(["2030-01-01", "294276-12-31", "-infinity"])),
    "minGap": DURATIONS, "mode": st.sampled_from(["all", "partial", "penalize"]),
    "buckets": st.sampled_from([1, 10, 64, 65, 0]), "lockTimeout": DURATIONS, "denyCache": DURATIONS,
}
CONFIGS = st.fixed_dictionaries({"kind": KINDS, "rate": NUMBERS, "period": DURATIONS},
                                optional={k: v for k, v in OPTIONAL.items()})
NOWS = st.sampled_from(["2030-01-01 00:00:00+00", "1970-01-01 00:00:00+00", "4000-01-01 00:00:00+00",
                        "294276-12-31 00:00:00+00", "4713-01-01 00:00:00+00 BC"])
COUNTS = st.sampled_from([0, 1, 2.5, 1e6, 1e15, 1e15 + 1, 1e300])
CALLS = st.lists(st.tuples(st.sampled_from(["rate_limit", "reserve", "check", "value", "credit", "wait", "headers",
                                            "reset"]), COUNTS), min_size=1, max_size=6)

CALL_SQL = {
    "rate_limit": "SELECT * FROM rate_limiter.rate_limit(%(n)s, 'k', %(c)s, config => %(j)s)",
    "reserve": "SELECT * FROM rate_limiter.rate_limit(%(n)s, 'k', %(c)s, reserve => true, config => %(j)s)",
    "check": "SELECT * FROM rate_limiter.check_rate_limit(%(n)s, 'k', %(c)s, config => %(j)s)",
    "value": "SELECT * FROM rate_limiter.rate_limit_value(%(n)s, 'k', config => %(j)s)",
    "credit": "SELECT * FROM rate_limiter.credit(%(n)s, 'k', %(c)s, config => %(j)s)",
    "wait": "SELECT * FROM rate_limiter.wait_rate_limit(%(n)s, 'k', %(c)s, interval '1 ms', config => %(j)s)",
    "headers": "SELECT rate_limiter.http_headers(%(n)s, rate_limiter.check_rate_limit(%(n)s, 'k', %(c)s, "
               "config => %(j)s), %(j)s)",
    "reset": "SELECT rate_limiter.reset_rate_limit(%(n)s, 'k')",
}


def interval(v):
    return v if isinstance(v, str) else f"{v} milliseconds"


def attempt(conn, sql, args):
    """Runs one statement, a transaction of its own (autocommit: one round trip); fails on
    XX000. Returns the SQLSTATE, or None."""
    assert conn.autocommit
    try:
        conn.execute(sql, args)
        return None
    except psycopg.Error as e:
        assert not conn.broken, f"the connection was lost: {sql} {args}"
        assert e.sqlstate != "XX000", f"internal error from {sql} {args}: {e.diag.message_primary} {e.diag.message_detail}"
        return e.sqlstate


@every_version
def test_no_config_or_count_reaches_an_internal_error(test_cluster, database_name, pg):
    with test_cluster.connect(database_name) as conn:
        # Thousands of limit names: kept out of the statistics (other tests need their room).
        conn.execute("SET rate_limiter.track_stats = off")
        conn.execute("SET statement_timeout = '5s'")

        @drawn(examples_on(pg, 1500))
        @given(CONFIGS, CALLS, NOWS, st.booleans(), st.booleans())
        def calls(config, calls, now, named, hot):
            conn.execute("SELECT set_config('rate_limiter.fake_now', %s, false)", (now,))
            name = "f_" + uuid.uuid4().hex[:10]
            inline = json.dumps(config)
            if named:
                # The same numbers through define(), as a DBA would type them.
                args = {"n": name, "kind": config["kind"], "rate": config["rate"], "period": interval(config["period"]),
                        "capacity": config.get("capacity"), "max_reserved": config.get("maxReserved"),
                        "shards": config.get("shards", 1), "min_gap": config.get("minGap"),
                        "mode": config.get("mode", "all"), "buckets": config.get("buckets"),
                        "lock_timeout": config.get("lockTimeout"), "deny_cache": config.get("denyCache"), "hot": hot}
                for k in ("min_gap", "lock_timeout", "deny_cache"):
                    args[k] = None if args[k] is None else interval(args[k])
                refused = attempt(conn, "SELECT rate_limiter.define(%(n)s, %(kind)s, %(rate)s, %(period)s::interval, "
                                        "%(capacity)s, %(max_reserved)s, %(shards)s, NULL, %(min_gap)s::interval, "
                                        "%(mode)s, %(buckets)s, %(lock_timeout)s::interval, 'deny', "
                                        "%(deny_cache)s::interval, %(hot)s)", args)
                inline = None
                if refused:
                    return
            for what, count in calls:
                attempt(conn, CALL_SQL[what], {"n": name, "c": count, "j": inline})
            if named:
                # A limit that took calls can be changed and dropped (a hot one folds its log).
                attempt(conn, "DELETE FROM rate_limiter.limits WHERE name = %s", (name,))
                assert not conn.execute("SELECT 1 FROM rate_limiter.limits WHERE name = %s", (name,)).fetchone(), \
                    f"{name} could not be dropped"

        calls()


@pytest.mark.parametrize("config", [
    {"kind": "rolling window", "rate": 5, "period": 0.0001},
    {"kind": "rolling window", "rate": 5, "period": 9.3e15},
    {"kind": "token bucket", "rate": 5, "period": 1000, "lockTimeout": 1e300},
])
def test_the_configs_that_reached_internal_errors_are_refused_with_22023(database_name, config):
    with psycopg.connect(dbname=database_name, autocommit=True) as c:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
            c.execute("SELECT * FROM rate_limiter.rate_limit('x', 'k', 1, config => %s)", (json.dumps(config),))
        assert "between" in str(refused.value) and refused.value.diag.message_hint


def test_a_hot_rolling_window_of_178_million_years_is_refused_at_define(database_name):
    with psycopg.connect(dbname=database_name, autocommit=True) as c:
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            c.execute("SELECT rate_limiter.define('ages', 'rolling window', 5, '178000000 years', hot => true)")
