"""A SQL-level fuzzer of the extension: K sessions run random transactions of calls of every
function in contract/functions.json (read at start, so a new function is fuzzed without a
change here), DML on the tables an administrator may write, SET LOCAL of the extension's
settings, savepoints and, rarely, DROP EXTENSION and CREATE EXTENSION under the others' feet.

An error is an answer, counted by SQLSTATE; a fault is not: SQLSTATE class XX (a Rust panic
surfaces as XX000) or a lost connection (a crash). A fault's transaction, as sent so far,
is kept as its reproducer. Statements come from the seed alone (session i draws from
seed + i), never from what the server answered, so `--replay SESSION:TRANSACTION` prints a
reproducer again; the interleaving of the sessions is not reproduced.

    python tests/fuzz.py --conninfo "host=/tmp port=5488 dbname=db" --seconds 60 --sessions 4 --seed 1
"""

import argparse
import calendar
import json
import os
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import psycopg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTRACT = os.path.join(ROOT, "contract", "functions.json")

# Every statement ends: a wait past statement_timeout is 57014, a lock queue past
# lock_timeout 55P03. hot_keys_per_database keeps this database's hot entries to a few of
# the cluster's, which other tests' databases share.
SESSION_SETTINGS = [
    "SET statement_timeout = '3s'",
    "SET lock_timeout = '1s'",
    "SET idle_in_transaction_session_timeout = '20s'",
    "SET rate_limiter.hot_keys_per_database = 4",
]


def load_functions(path=CONTRACT):
    """(name, IN arguments as [name, type, default]) of every function of the contract."""
    with open(path) as f:
        functions = json.load(f)["functions"]
    return [(fn["name"], [a[:3] for a in fn["args"] if a[3:] != ["out"]]) for fn in functions]


# --- literals -------------------------------------------------------------------------

def q(s):
    """A quoted SQL string literal (standard_conforming_strings), or NULL."""
    return "NULL" if s is None else "'" + s.replace("'", "''") + "'"


def num(x):
    if x is None:
        return "NULL"
    if isinstance(x, str):  # 'NaN', 'Infinity', '1e400': the float8 input function's
        return q(x)
    if isinstance(x, bool):
        return "true" if x else "false"
    return repr(x) if isinstance(x, float) else str(x)


def int_lit(x):
    """An integer argument: out-of-range and fractional values quoted, so that they reach
    int4's input (22003, 22P02) rather than function lookup (42883)."""
    if x is None:
        return "NULL"
    return str(x) if isinstance(x, int) and -2**31 <= x < 2**31 else q(str(x))


def ms_text(ms):
    """Milliseconds as interval text (which takes no exponent)."""
    return f"{int(ms) if float(ms).is_integer() else ms} milliseconds"


# --- the pools ------------------------------------------------------------------------

# Named limits of every profile, defined at start and again and again, so that sessions
# collide on them; each name keeps its profile most of the time (its overrides fit it).
PROFILES = {
    "tb": "token bucket", "fw": "fixed window", "sw": "sliding window", "rw": "rolling window",
    "cc": "concurrency", "hot": "hot", "mem": "memory", "cal": "calendar", "sh": "sharded", "opt": "options",
}
NAMES = list(PROFILES)
ALL_NAMES = ["tb", "fw", "sw", "rw", "mem", "cal", "sh"]
ODD_TEXT = [
    "", " ", "\t", "x" * 129, "n" * 300, "k" * 1025, "ключ", "名前", "🔥", "e\u0301", "\u202eevil",
    "O'Brien", '"quoted"', "back\\slash", "*other*", "tb#0123456789abcdef0123456789abcdef", "%s", "a\nb",
    " tb", "TB", "$$", "null",
]
KEYS = ["k1", "k2", "k3", None, "ключ", "203.0.113.7/32"]
TIERS = ["free", "pro", "team"]
KINDS = ["token bucket", "fixed window", "sliding window", "rolling window", "concurrency"]
CALENDAR = ["1 month", "3 months", "1 year", "1 day", "1 week"]
ZONES = [None, "UTC", "Europe/Berlin", "America/St_Johns", "Asia/Kathmandu", "Pacific/Kiritimati", "<+03>-3"]
ODD_ZONES = ["", "Nowhere/Land", "<+99>-99", "EST5EDT,M3.2.0,M11.1.0", "x" * 300]
INSTANTS = ["2030-01-01 00:00:00+00", "2030-01-01 00:00:00.5+00", "2030-06-15 12:34:56.789+00",
            "2029-12-31 23:59:59.999999+00", "2031-03-30 01:30:00+01"]
ODD_INSTANTS = ["1970-01-01 00:00:00+00", "294276-12-31 23:59:59+00", "4713-01-01 00:00:00+00 BC",
                "4000-01-01 00:00:00+00", "2000-02-29 00:00:00+00", "infinity", "-infinity", "epoch", "not a time"]
COUNTS = [1, 1, 1, 1, 2, 3, 5, 0, 0.5, 10, 100]
ODD_COUNTS = [-1, -0.0, 1e-300, 1e15, 1e15 + 1, 2**53, 2**53 + 1, 1e300, 1e308, "NaN", "Infinity", "-Infinity",
              "1e400", None, 1000, 1e6]
INTERVALS = ["1 millisecond", "10 milliseconds", "1 second", "1 minute", "1 hour", "1 day"]
ODD_INTERVALS = ["0", "-1 second", "0.1 microsecond", "1 microsecond", "100 years", "101 years",
                 "178000000 years", "1 month 2 days", "2147483647 milliseconds", "2147483648 milliseconds",
                 "infinity", "-infinity", "banana", "P1Y2M3DT4H5M6S", "1000000000 days"]
INTS = [0, 1, -1, 2, 10, 64, 65, 1024, 1025, 2**31 - 1, 2**31, -2**31, 0.5]
ADDRESSES = ["203.0.113.7", "::ffff:203.0.113.7", "::ffff:cb00:7107", "64:ff9b::198.51.100.23", "2002:c000:204::1",
             "2001:0:4136:e378:8000:63bf:3fff:fdd2", "2001:db8:1234:5678::1", "::", "::1", "0.0.0.0/0",
             "255.255.255.255/32", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "64:ff9b:1::1", "10.0.0.1/8", None,
             "not an address"]


class Gen:
    """Draws statements from one random.Random: the same seed, the same statements."""

    def __init__(self, rng, functions):
        self.r = rng
        self.functions = functions
        self.weights = [CALL_WEIGHTS.get(name, 2) for name, _ in functions]

    def chance(self, p):
        return self.r.random() < p

    def pick(self, xs):
        return self.r.choice(xs)

    # --- values by meaning ---

    def text(self):
        return self.pick(ODD_TEXT)

    def name(self):
        return self.pick(NAMES) if self.chance(0.9) else self.text()

    def key(self):
        return self.pick(KEYS) if self.chance(0.9) else self.text()

    def count(self):
        return self.pick(COUNTS) if self.chance(0.9) else self.pick(ODD_COUNTS)

    def interval(self, common=INTERVALS):
        return self.pick(common) if self.chance(0.85) else self.pick(ODD_INTERVALS)

    def instant(self):
        if self.chance(0.5):
            return self.pick(["now()", "now() + interval '1 hour'", "now() - interval '1 second'",
                              "now() + interval '50 milliseconds'", "'infinity'"])
        return q(self.pick(INSTANTS + ODD_INSTANTS))

    # --- configs ---

    def limit_config(self, profile=None, inline=False):
        """A config the docs call valid for the profile (a random one if None), as a dict of
        define()'s argument names."""
        r = self.r
        profile = profile or self.pick(list(PROFILES.values()))
        kind = profile if profile in KINDS else {
            "hot": self.pick(KINDS[:4]), "memory": self.pick(KINDS[:3]), "calendar": "fixed window",
            "sharded": self.pick(KINDS[:4]), "options": self.pick(KINDS[:4])}[profile]
        c = {"kind": kind}
        if kind == "concurrency":
            c["rate"] = self.pick([1, 2, 3, 5, 32, 1000])
            c["period"] = self.pick([1000, 100, 60000])
            if self.chance(0.1):
                c["enforce"] = False
            return c
        c["rate"] = self.pick([1, 2, 3, 5, 10, 100, 1000, 1e6]) if self.chance(0.95) else self.pick([0.5, 1e15, 1e-3])
        c["period"] = self.pick([1000, 60000, 3600000, 250, 86400000]) if self.chance(0.95) else \
            self.pick([1, 64, 3155695200000])  # 1 ms to 100 years
        if kind == "rolling window":
            c["period"] = max(c["period"], 64)
            if self.chance(0.5):
                c["buckets"] = self.pick([1, 2, 10, 64])
        if kind in ("token bucket", "fixed window"):
            if self.chance(0.3):
                c["capacity"] = self.pick([c["rate"], c["rate"] * 2, 1e6]) if self.chance(0.9) else self.pick([0, 1])
            if self.chance(0.2):
                c["max_reserved"] = self.pick([0, 1, 100, 1e12])
        elif self.chance(0.1):
            c["capacity"] = c["rate"]
        if kind != "token bucket" and self.chance(0.3):
            c["start"] = self.pick(INSTANTS)
        if profile == "calendar":
            c["period"] = self.pick(CALENDAR)
            if self.chance(0.7):
                c["tz"] = self.pick(ZONES)
        elif profile == "sharded":
            c["shards"] = self.pick([2, 3, 4, 16]) if self.chance(0.9) else 1024
        elif profile == "hot" and not inline:
            c["hot"] = True
        elif profile == "memory":
            c["durable"] = False
        elif profile == "options":
            if self.chance(0.5):
                c["min_gap"] = self.pick([0, 1, 100, 1000])
            if self.chance(0.4):
                c["mode"] = self.pick(["all", "partial", "penalize"])
            if self.chance(0.4):
                c["lock_timeout"] = self.pick([0, 1, 10, 100])
                if self.chance(0.5):
                    c["on_lock_timeout"] = self.pick(["deny", "allow"])
            if c.get("mode", "all") == "all" and self.chance(0.4):
                c["deny_cache"] = self.pick([0, 100, 1000, 60000])
        if profile in ("hot", "memory") and self.chance(0.2):
            c["deny_cache"] = 1000
        if self.chance(0.1):
            c["enforce"] = False
        if profile == "hot" and inline and self.chance(0.1):
            c["hot"] = True  # refused inline (0A000)
        return c

    def odd_config(self, c):
        """c made invalid one way: a field of the wrong type or out of range, an unknown or a
        missing field, a combination the docs refuse."""
        c = dict(c)
        field_ = self.pick(["kind", "rate", "period", "capacity", "max_reserved", "shards", "start", "min_gap",
                            "mode", "buckets", "lock_timeout", "deny_cache", "tz", "enforce", "durable",
                            "on_lock_timeout", "hot", "bogus", "drop"])
        if field_ == "drop":
            c.pop(self.pick(["kind", "rate", "period"]), None)
        elif field_ == "bogus":
            c[self.pick(["bogus", "Rate", "maxreserved", ""])] = 1
        else:
            c[field_] = self.pick([
                None, -1, 0, 1e-300, 1e300, 1e16, 2**31, -2**31, 1.5, "x", "", "NaN", True, [], {}, [1, 2],
                "178000000 years", "1 month 2 days", "-1 hour", "Infinity", 3155695200001, "294276-12-31",
                self.pick(ODD_ZONES), self.pick(KINDS), "leaky bucket", {"nested": {"deeper": [None]}}])
        if self.chance(0.2):  # a valid field beside one that needs shards = 1
            c["shards"] = 4
        return c

    def inline(self, c):
        """A config as jsonb text: Convex's camelCase or the snake_case aliases, durations as
        milliseconds or interval text."""
        camel = {"max_reserved": "maxReserved", "min_gap": "minGap", "lock_timeout": "lockTimeout",
                 "deny_cache": "denyCache", "on_lock_timeout": "onLockTimeout"}
        out = {}
        for k, v in c.items():
            if k in camel and self.chance(0.6):
                k = camel[k]
            if k in ("period", "minGap", "min_gap", "lockTimeout", "lock_timeout", "denyCache", "deny_cache") \
                    and isinstance(v, (int, float)) and not isinstance(v, bool) and self.chance(0.3):
                v = ms_text(v)
            if k == "start" and isinstance(v, str) and v in INSTANTS and self.chance(0.5):
                v = calendar.timegm(time.strptime(v[:19], "%Y-%m-%d %H:%M:%S")) * 1000
            out[k] = v
        return json.dumps(out, ensure_ascii=self.chance(0.5))

    def config(self, profile=None):
        """A jsonb literal for a config argument: NULL (the named limit) most often."""
        roll = self.r.random()
        if roll < 0.65:
            return "NULL"
        c = self.limit_config(profile, inline=True)
        if roll < 0.9:
            return q(self.inline(c))
        if roll < 0.98:
            return q(self.inline(self.odd_config(c)))
        return q(self.pick(["[]", "1", '"x"', "null", "true", "{}", '{"kind": "token bucket\\u0000"}',
                            '{"kind": "token bucket", "rate": NaN, "period": 1000}', "{", "[" * 200 + "]" * 200]))

    def requests(self):
        """rate_limit_all's array: a few (name, key) pairs, odd members now and then."""
        if self.chance(0.05):
            return q(self.pick(["{}", "1", "null", "[1]", '[{"key": "k1"}]', '[{"name": "tb", "extra": 1}]',
                                '[{"name": "tb"}, {"name": "tb"}]', json.dumps([{"name": "tb", "key": str(i)}
                                                                                for i in range(1001)])]))
        reqs, seen = [], set()
        for _ in range(self.r.randint(0 if self.chance(0.05) else 1, 4)):
            # Mostly limits rate_limit_all takes: not hot, concurrency, or in another mode.
            name = self.pick(ALL_NAMES) if self.chance(0.8) else self.name()
            key = self.key()
            if (name, key) in seen and self.chance(0.9):
                continue
            seen.add((name, key))
            req = {"name": name}
            if key is not None or self.chance(0.3):
                req["key"] = key
            if self.chance(0.5):
                req["count"] = self.count()  # 'NaN' and the like as JSON strings
            if self.chance(0.2):
                c = self.limit_config(inline=True)
                req["config"] = json.loads(self.inline(c if self.chance(0.8) else self.odd_config(c)))
            reqs.append(req)
        return q(json.dumps(reqs))

    def decision(self, name_sql, key_sql):
        """A decision argument: a call's own (mostly), a row of edge values, or NULL."""
        roll = self.r.random()
        if roll < 0.6:
            return (f"rate_limiter.{self.pick(['rate_limit', 'check_rate_limit'])}"
                    f"({name_sql}, {key_sql}, {num(self.count())})")
        if roll < 0.95:
            f = lambda: num(self.pick([None, 0, 1, -1, 1000, 1e308, "NaN", "Infinity", "-Infinity", 1e-300, 2**53]))
            return (f"ROW({self.pick(['true', 'false', 'NULL'])}, {f()}, {f()}, {f()}, {f()}, "
                    f"{q(self.pick([None, 'exhausted', 'blocked', 'allowed', 'shadow', 'x' * 300, '🔥']))}, "
                    f"{q(self.pick([None, 'tb', '', 'x' * 300, 'ключ']))})::rate_limiter.decision")
        return "NULL"

    # --- arguments by name, then by type ---

    def argument(self, fn, arg, typ, chosen):
        """The SQL of one argument; `chosen` holds the SQL of the arguments drawn before it."""
        if self.chance(0.01):
            return "NULL"
        name_sql = chosen.get("name", q("tb"))
        key_sql = chosen.get("key", "NULL")
        if fn in ("limit_writes", "unlimit_writes"):
            if arg == "table":
                return q(self.pick(["fuzz_written", "fuzz_written", "rate_limiter.limits", "pg_catalog.pg_class"]))
            if arg in ("key", "count"):
                return q(self.pick(["k", "n", None, "nope", "ctid"]))
            if arg == "events":
                return q(self.pick(["{INSERT}", "{INSERT,UPDATE,DELETE}", "{DELETE}", "{}", "{TRUNCATE}"]))
            if arg == "limit_name":
                return q(self.name())
        if arg == "name":
            if fn in ("acquire", "release", "renew") and self.chance(0.8):
                return q("cc")
            return q(self.name())
        if arg == "key":
            return q(self.key())
        if arg == "count":
            return num(self.count())
        if arg == "config":
            return self.config()
        if arg == "requests":
            return self.requests()
        if arg == "d":
            if fn == "http_headers_all" and "requests" in chosen and self.chance(0.6):
                return f"rate_limiter.check_rate_limit_all({chosen['requests']})"
            return self.decision(name_sql, key_sql)
        if arg == "lease":
            return q(self.pick(["1 second", "100 milliseconds", "1 hour", "1 day", None]) if self.chance(0.85)
                     else self.pick(["0", "-1 second", "2 days", "1 microsecond", "100 years", "infinity"]))
        if arg == "lease_id":
            if self.chance(0.7):
                return (f"(SELECT lease_id FROM rate_limiter.leases WHERE name = {name_sql} "
                        f"ORDER BY lease_id LIMIT 1 OFFSET {self.r.randint(0, 3)})")
            return q(self.pick(["00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff",
                                "6d1e7a3b-2c4f-4a8e-9b1d-3e5f7a9c0b2d", "not-a-uuid"]))
        if arg == "timeout":
            return q(self.pick(["0", "1 millisecond", "20 milliseconds", "200 milliseconds", None]) if self.chance(0.97)
                     else self.pick(["-1 second", "1 second", "5 seconds", "infinity"]))
        if arg == "until":
            return self.instant()
        if arg == "tier":
            return q(self.pick(TIERS) if self.chance(0.9) else self.text())
        if arg == "note":
            return q(self.pick(["plan: pro", None, "x" * 10000, "ключ 🔥"]))
        if arg == "draft":
            return int_lit(self.pick([11, 11, 9, 0, 10, 12, -1, 2**31]))
        if arg == "addr":
            return q(self.pick(ADDRESSES))
        if arg in ("v4_prefix", "v6_prefix"):
            return int_lit(self.pick([32, 24, 56, 64, 96, 128, 0, -1, 33, 129, 2**31]))
        if arg == "max_rows":
            return int_lit(self.pick([10000, 1, 100, 0, -1, 2**31 - 1]))
        if arg == "sample_shards":
            return int_lit(self.pick([1, 1, 2, 16, 1024, 0, -1, 1025, 2**31 - 1]))
        if arg in ("reserve", "throws", "partition_key", "exempt", "hot", "enforce", "durable"):
            return self.pick(["true", "false", "false", "false"]) if self.chance(0.97) else "NULL"
        if arg == "kind":
            return q(self.pick(KINDS) if self.chance(0.9) else self.pick(["", "leaky bucket", "TOKEN BUCKET", "hot"]))
        if arg in ("rate", "capacity", "max_reserved"):
            return num(self.pick([1, 5, 10, 100, 1000, 0.5]) if self.chance(0.85) else self.pick(ODD_COUNTS))
        if arg in ("period", "min_gap", "lock_timeout", "deny_cache"):
            return q(self.interval())
        return self.by_type(typ)

    def by_type(self, typ):
        """An argument the fuzzer knows only by its type (a function added to the contract)."""
        if typ == "text":
            return q(self.name())
        if typ == "double precision":
            return num(self.count())
        if typ in ("integer", "bigint", "smallint"):
            return int_lit(self.pick(INTS))
        if typ == "boolean":
            return self.pick(["true", "false"])
        if typ == "interval":
            return q(self.interval())
        if typ == "timestamp with time zone":
            return self.instant()
        if typ == "jsonb":
            return self.config()
        if typ == "uuid":
            return q("00000000-0000-0000-0000-000000000000")
        if typ == "inet":
            return q(self.pick(ADDRESSES))
        if typ == "rate_limiter.decision":
            return self.decision(q("tb"), "NULL")
        return "NULL"

    def define_args(self):
        """define()'s arguments: a valid config of a pool name's profile (mostly), or of another
        profile (a name changing kind under calls in flight), or one argument made odd."""
        name = self.pick(NAMES) if self.chance(0.95) else self.text()
        profile = PROFILES.get(name) if self.chance(0.9) else None
        c = self.limit_config(profile)
        args = {"name": q(name), "kind": q(c.pop("kind")), "rate": num(c.pop("rate"))}
        period = c.pop("period")
        args["period"] = q(period if isinstance(period, str) else ms_text(period))
        for k, v in c.items():
            if k in ("min_gap", "lock_timeout", "deny_cache"):
                args[k] = q(ms_text(v))
            elif k in ("start",):
                args[k] = q(v)
            elif k in ("tz", "mode", "on_lock_timeout"):
                args[k] = q(v)
            elif k in ("shards", "buckets"):
                args[k] = int_lit(v)
            else:
                args[k] = num(v)
        if self.chance(0.1):
            odd = self.pick(["rate", "period", "capacity", "max_reserved", "shards", "start", "min_gap", "mode",
                             "buckets", "lock_timeout", "deny_cache", "tz", "kind", "on_lock_timeout"])
            args[odd] = {
                "rate": lambda: num(self.pick(ODD_COUNTS)), "capacity": lambda: num(self.pick(ODD_COUNTS)),
                "max_reserved": lambda: num(self.pick(ODD_COUNTS)), "shards": lambda: int_lit(self.pick(INTS)),
                "buckets": lambda: int_lit(self.pick(INTS)), "start": lambda: q(self.pick(ODD_INSTANTS)),
                "tz": lambda: q(self.pick(ODD_ZONES + ZONES[1:])), "mode": lambda: q(self.pick(["", "some", "ALL"])),
                "kind": lambda: q(self.pick(["", "leaky bucket"] + KINDS)),
                "on_lock_timeout": lambda: q(self.pick(["", "maybe"])),
            }.get(odd, lambda: q(self.pick(ODD_INTERVALS)))()
        return args

    def numbers_args(self, fn):
        """override()'s and define_tier()'s numbers: a few, mostly ones every kind takes."""
        args = {}
        if fn == "override" and self.chance(0.3):
            args["tier"] = q(self.pick(TIERS))
            return args
        if self.chance(0.7):
            args["rate"] = num(self.pick([1, 2, 5, 10, 100, 1000]) if self.chance(0.9) else self.pick(ODD_COUNTS))
        if self.chance(0.3):
            args["period"] = q(self.interval(["1 second", "1 minute", "1 hour"]))
        if self.chance(0.15):
            args["capacity"] = num(self.pick([0, 1, 10, 1000, -1]))
        if self.chance(0.1):
            args["max_reserved"] = num(self.pick([0, 10, 1e12]))
        if self.chance(0.1):
            args["min_gap"] = q(self.pick(["0", "10 milliseconds", "1 second", "-1 second"]))
        if self.chance(0.1):
            args["exempt"] = "true"
        return args

    # --- statements ---

    def call(self):
        """One call of a contract function, in one of the forms an application writes."""
        fn, args = self.r.choices(self.functions, self.weights)[0]
        chosen = {}
        if fn == "define":
            chosen = self.define_args()
        elif fn in ("override", "define_tier"):
            chosen = {"name": q(self.name())}
            if fn == "override":
                chosen["key"] = q(self.key())
            else:
                chosen["tier"] = q(self.pick(TIERS) if self.chance(0.9) else self.text())
            chosen.update(self.numbers_args(fn))
            if fn == "override" and self.chance(0.15):
                chosen["until"] = self.instant()
        else:
            for arg, typ, default in args:
                # A wait's timeout always: its default, 30 s, would run into statement_timeout.
                if default is None or arg == "timeout" or self.chance(0.5):
                    chosen[arg] = self.argument(fn, arg, typ, chosen)
        if self.chance(0.03) and chosen:  # one argument NULL, whatever it is
            chosen[self.pick(list(chosen))] = "NULL"
        known = {a for a, _, _ in args}
        required = [a for a, _, d in args if d is None]
        # Positional where every argument up to the last is given, else named.
        if self.chance(0.2) and all(a in chosen for a in required) and \
                [a for a, _, _ in args[:len(chosen)]] == list(chosen):
            arglist = ", ".join(chosen.values())
        else:
            arglist = ", ".join(f"{a} => {v}" for a, v in chosen.items() if a in known)
        expr = f"rate_limiter.{fn}({arglist})"
        roll = self.r.random()
        if roll < 0.04 and "key" in known and "name" in chosen:
            # Many keys in one statement: room in shared memory, slots and locks per transaction.
            batched = ", ".join(f"{a} => {'g::text' if a == 'key' else v}" for a, v in chosen.items() if a in known)
            if "key" not in chosen:
                batched += ", key => g::text"
            return fn, (f"SELECT count(*) FROM generate_series(1, {self.pick([5, 20, 40, 100])}) g, "
                        f"LATERAL rate_limiter.{fn}({batched}) AS r")
        if roll < 0.08:
            # A PL/pgSQL block that swallows every error but an internal one: the error's
            # subtransaction aborts inside a function, not at a savepoint.
            return fn, (f"DO $fuzz$ BEGIN PERFORM * FROM {expr}; EXCEPTION WHEN OTHERS THEN "
                        f"IF SQLSTATE LIKE 'XX%' THEN RAISE; END IF; END $fuzz$")
        if roll < 0.2:
            return fn, f"SELECT {expr}"
        return fn, f"SELECT * FROM {expr}"

    def setting(self):
        return self.pick([
            lambda: f"SET LOCAL rate_limiter.fake_now = {q(self.pick(INSTANTS) if self.chance(0.9) else self.pick(ODD_INSTANTS))}",
            lambda: "SET LOCAL rate_limiter.fake_now = ''",
            lambda: f"SET LOCAL rate_limiter.shadow = {self.pick(['on', 'off'])}",
            lambda: f"SET LOCAL rate_limiter.track_stats = {self.pick(['on', 'off'])}",
            lambda: f"SET LOCAL rate_limiter.max_slots_per_transaction = {self.pick([0, 1, 2, 32, 1000])}",
            lambda: f"SET LOCAL rate_limiter.max_memory_key_locks_per_transaction = {self.pick([0, 1, 32])}",
            lambda: f"SET LOCAL rate_limiter.max_lease = {q(self.pick(['1s', '1d', '0', '100 years']))}",
            lambda: f"SET LOCAL timezone = {q(self.pick(['UTC', 'Asia/Kathmandu', 'America/St_Johns']))}",
        ])()

    def dml(self):
        """A write an administrator may make on the tables the docs say to manage with
        INSERT/UPDATE/DELETE, or a superuser's DELETE of state rows (a missing row is full)."""
        n, k = q(self.name()), q(self.key())
        return self.pick([
            lambda: f"DELETE FROM rate_limiter.limits WHERE name = {n}",
            lambda: (f"INSERT INTO fuzz_written SELECT {k}, {num(self.pick([1, 0.5, 3, -1, None]))} "
                     f"FROM generate_series(1, {self.pick([1, 2, 100])})"),
            lambda: f"UPDATE fuzz_written SET n = {num(self.pick([1, 2, None]))} WHERE k = {k}",
            lambda: f"UPDATE rate_limiter.limits SET rate = rate * {self.pick([2, 0.5, 1e10])} WHERE name = {n}",
            lambda: f"UPDATE rate_limiter.limits SET period = period * {self.pick([2, 0.5, 0.001])} WHERE name = {n}",
            lambda: f"UPDATE rate_limiter.limits SET hot = NOT hot WHERE name = {n}",
            lambda: f"UPDATE rate_limiter.limits SET durable = NOT durable WHERE name = {n}",
            lambda: f"UPDATE rate_limiter.limits SET enforce = NOT enforce WHERE name = {n}",
            lambda: f"UPDATE rate_limiter.limits SET kind = {q(self.pick(KINDS))} WHERE name = {n}",
            lambda: f"UPDATE rate_limiter.limits SET shards = {self.pick([1, 2, 8])} WHERE name = {n}",
            lambda: f"UPDATE rate_limiter.limits SET name = {q(self.name())} WHERE name = {n}",
            lambda: (f"INSERT INTO rate_limiter.limits (name, kind, rate, period) VALUES ({n}, {q(self.pick(KINDS))}, "
                     f"{self.pick([1, 10, 100])}, {q(self.pick(INTERVALS[2:]))}) "
                     f"ON CONFLICT (name) DO UPDATE SET rate = EXCLUDED.rate"),
            lambda: f"INSERT INTO rate_limiter.blocks (name, key, until) VALUES ({n}, {k}, now() + interval '1 second')",
            lambda: f"DELETE FROM rate_limiter.{self.pick(['blocks', 'allows'])} WHERE key = {k}",
            lambda: f"INSERT INTO rate_limiter.allows (name, key) VALUES ({n}, {k})",
            lambda: f"DELETE FROM rate_limiter.overrides WHERE name = {n}",
            lambda: f"UPDATE rate_limiter.overrides SET rate = {self.pick([1, 50])}, tier = NULL WHERE name = {n}",
            lambda: f"UPDATE rate_limiter.overrides SET tier = {q(self.pick(TIERS))}, rate = NULL WHERE name = {n}",
            lambda: f"DELETE FROM rate_limiter.tiers WHERE name = {n}",
            lambda: f"UPDATE rate_limiter.tiers SET rate = {self.pick([3, 300])} WHERE name = {n}",
            lambda: f"DELETE FROM rate_limiter.state WHERE split_part(name, '#', 1) = {n}",
            lambda: f"TRUNCATE rate_limiter.{self.pick(['blocks', 'allows', 'overrides', 'limits'])}"
            if self.chance(0.1) else f"DELETE FROM rate_limiter.blocks WHERE name = {n}",
        ])()

    def read(self):
        return self.pick([
            "SELECT * FROM rate_limiter.stats", "SELECT * FROM rate_limiter.top_denied",
            "SELECT count(*) FROM rate_limiter.state", "SELECT * FROM rate_limiter.limits",
            "SELECT count(*) FROM rate_limiter.leases", "SELECT count(*) FROM rate_limiter.debits",
            "SELECT pg_sleep(0.02)",
        ])

    def transaction(self, may_drop):
        """The statements of one transaction, as (what, SQL): BEGIN, calls and other
        statements with savepoints among them, COMMIT or ROLLBACK; or, when `may_drop`, now
        and then the extension dropped and created again."""
        if may_drop and self.chance(0.004):
            return self.drop_and_create()
        level = self.r.choices(["", " ISOLATION LEVEL REPEATABLE READ", " ISOLATION LEVEL SERIALIZABLE",
                                " READ ONLY"], [80, 10, 7, 3])[0]
        plan, savepoints, n = [("begin", "BEGIN" + level)], [], 0
        for _ in range(self.r.randint(1, 10)):
            if self.chance(0.35):
                n += 1
                savepoints.append(f"s{n}")
                plan.append(("savepoint", f"SAVEPOINT s{n}"))
            roll = self.r.random()
            if roll < 0.78:
                plan.append(("call",) + self.call())
            elif roll < 0.88:
                plan.append(("dml", self.dml()))
            elif roll < 0.95:
                plan.append(("set", self.setting()))
            else:
                plan.append(("read", self.read()))
            if savepoints and self.chance(0.25):
                target = self.pick(savepoints)
                verb = self.pick(["RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT"])
                plan.append(("savepoint", f"{verb} {target}"))
                # RELEASE ends the savepoint and those after it; ROLLBACK TO, those after it.
                del savepoints[savepoints.index(target) + (verb != "RELEASE SAVEPOINT"):]
        plan.append(("end", "COMMIT" if self.chance(0.8) else "ROLLBACK"))
        return plan

    def drop_and_create(self):
        """DROP EXTENSION and CREATE EXTENSION, in one transaction or in two (the others then
        find it gone for a while), and the pool's limits defined again. Outside a transaction
        a failed statement stops nothing: the extension is there again at the end."""
        if self.chance(0.5):
            plan = [("begin", "BEGIN"), ("set", "SET LOCAL lock_timeout = '3s'"),
                    ("set", "SET LOCAL statement_timeout = '10s'"), ("ddl", "DROP EXTENSION rate_limiter CASCADE"),
                    ("ddl", "CREATE EXTENSION rate_limiter"), ("end", "COMMIT")]
        else:
            plan = [("set", "SET lock_timeout = '3s'"), ("set", "SET statement_timeout = '10s'"),
                    ("ddl", "DROP EXTENSION rate_limiter CASCADE"), ("read", "SELECT pg_sleep(0.05)"),
                    ("ddl", "CREATE EXTENSION IF NOT EXISTS rate_limiter"),
                    ("set", "SET lock_timeout = '1s'"), ("set", "SET statement_timeout = '3s'")]
        plan.append(("ddl", "CREATE EXTENSION IF NOT EXISTS rate_limiter"))
        return plan + [("call", "define", sql) for sql in pool_definitions(self)]


def pool_definitions(gen):
    """define() of every pool name with a valid config of its profile."""
    statements = []
    for name, profile in PROFILES.items():
        c = gen.limit_config(profile)
        args = {"name": q(name), "kind": q(c.pop("kind")), "rate": num(c.pop("rate"))}
        period = c.pop("period")
        args["period"] = q(period if isinstance(period, str) else ms_text(period))
        for k, v in c.items():
            args[k] = q(ms_text(v)) if k in ("min_gap", "lock_timeout", "deny_cache") else \
                q(v) if isinstance(v, str) else num(v)
        statements.append("SELECT rate_limiter.define(" + ", ".join(f"{k} => {v}" for k, v in args.items()) + ")")
    return statements


CALL_WEIGHTS = {
    "rate_limit": 16, "rate_limit_ok": 6, "check_rate_limit": 6, "credit": 4, "rate_limit_value": 4, "rate_limit_all": 5,
    "check_rate_limit_all": 2, "wait_rate_limit": 3, "acquire": 5, "release": 2, "renew": 2, "define": 8,
    "define_tier": 3, "override": 4, "remove_override": 2, "remove_tier": 2, "block": 2, "unblock": 2, "allow": 2,
    "disallow": 2, "reset_rate_limit": 3, "prune": 2, "http_headers": 3, "http_headers_all": 2, "http_problem": 2,
    "ip_key": 2, "_stats": 1, "_top_denied": 1, "stats_every_database": 1, "top_denied_every_database": 1,
    "stats_reset": 1, "limit_writes": 2, "unlimit_writes": 1, "_write_limited": 1,
}


# --- running --------------------------------------------------------------------------

@dataclass
class Report:
    seconds: float = 0.0
    sessions: int = 0
    seed: int = 0
    transactions: int = 0
    statements: int = 0
    calls: int = 0
    call_successes: int = 0
    successes: int = 0
    errors: Counter = field(default_factory=Counter)
    by_function: dict = field(default_factory=dict)
    faults: list = field(default_factory=list)
    lost: bool = False
    # The first message and statement of each (function, SQLSTATE), to tune the generator by.
    examples: dict = field(default_factory=dict)

    def merge(self, other):
        for f in ("transactions", "statements", "calls", "call_successes", "successes"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.errors.update(other.errors)
        for fn, outcomes in other.by_function.items():
            self.by_function.setdefault(fn, Counter()).update(outcomes)
        self.faults += other.faults
        self.lost |= other.lost
        for k, v in other.examples.items():
            self.examples.setdefault(k, v)

    @property
    def call_share(self):
        return self.call_successes / self.calls if self.calls else 0.0

    def table(self, functions=False, examples=False, top=12):
        rate = self.statements / self.seconds if self.seconds else 0
        lines = [
            f"seed {self.seed}, {self.sessions} sessions, {self.seconds:.0f} s",
            f"{'transactions':<22}{self.transactions:>10}",
            f"{'statements':<22}{self.statements:>10}   ({rate:.0f}/s)",
            f"{'succeeded':<22}{self.successes:>10}",
            f"{'function calls':<22}{self.calls:>10}   ({100 * self.call_share:.1f}% succeeded)",
            f"{'faults':<22}{len(self.faults):>10}",
            "errors by SQLSTATE:",
        ]
        lines += [f"  {state:<20}{n:>10}" for state, n in self.errors.most_common(top)]
        if len(self.errors) > top:
            lines.append(f"  {'(' + str(len(self.errors) - top) + ' more)':<20}{sum(n for _, n in self.errors.most_common()[top:]):>10}")
        if functions:
            lines.append("calls by function (ok share, top SQLSTATEs):")
            for fn, outcomes in sorted(self.by_function.items()):
                total = sum(outcomes.values())
                tops = ", ".join(f"{s} {n}" for s, n in outcomes.most_common(4) if s != "ok")
                lines.append(f"  {fn:<28}{total:>7} {100 * outcomes['ok'] / total:5.1f}%  {tops}")
        if examples:
            lines.append("an example of each (function or statement, SQLSTATE):")
            for (what, state), (message, sql) in sorted(self.examples.items()):
                lines.append(f"  {what} {state}: {message[:150]}\n      {sql[:300]}")
        for fault in self.faults:
            lines.append(describe(fault))
        return "\n".join(lines)


def describe(fault):
    body = "\n".join(f"    {sql};" for sql in fault["statements"])
    return (f"FAULT {fault['sqlstate']} in session {fault['session']}, transaction {fault['transaction']} "
            f"(--replay {fault['session']}:{fault['transaction']})"
            f"{', while the extension was dropped and created' if fault.get('while_dropping') else ''}: "
            f"{fault['message']}\n"
            f"  reproducer (session settings, then the transaction as sent):\n{body}")


def fault_of(error, conn):
    """The fault an error is (a lost connection, or SQLSTATE class XX), else None."""
    if conn.broken or conn.closed or error.sqlstate in ("57P01", "57P02", "57P03"):
        return "lost connection"
    if error.sqlstate and error.sqlstate.startswith("XX"):
        return error.sqlstate
    return None


class Session:
    def __init__(self, index, conninfo, seed, functions, deadline, stop, dropping, drop_extension=True):
        self.index, self.conninfo, self.deadline, self.stop = index, conninfo, deadline, stop
        # Set while session 0 drops and creates the extension: a fault then says so.
        self.dropping = dropping
        self.may_drop = index == 0 and drop_extension
        self.gen = Gen(random.Random(seed + index), functions)
        self.report = Report()
        self.conn = None

    def connect(self):
        if self.conn is not None:
            self.conn.close()
        # Driver-level autocommit: the plan's own BEGIN (with its isolation level) and
        # COMMIT/ROLLBACK delimit each transaction, exactly as the reproducer shows them.
        self.conn = psycopg.connect(self.conninfo, autocommit=True, application_name=f"fuzz {self.index}")
        for sql in SESSION_SETTINGS:
            self.conn.execute(sql)

    def run(self):
        self.connect()
        number = 0
        try:
            while time.monotonic() < self.deadline and not self.stop.is_set():
                plan = self.gen.transaction(may_drop=self.may_drop)
                number += 1
                ddl = any(what == "ddl" for what, *_ in plan)
                if ddl:
                    self.dropping.set()
                try:
                    self.execute(number, plan)
                finally:
                    if ddl:
                        self.dropping.clear()
        finally:
            self.conn.close()
        return self.report

    def execute(self, number, plan):
        sent, savepoints, in_transaction = [], [], False
        r = self.report
        r.transactions += 1
        for what, *rest in plan:
            if time.monotonic() >= self.deadline or self.stop.is_set():
                if in_transaction:
                    self.quietly("ROLLBACK")
                return
            fn, sql = rest if what == "call" else (None, rest[0])
            sent.append(sql)
            r.statements += 1
            if what == "call":
                r.calls += 1
            try:
                self.conn.execute(sql)
                outcome = "ok"
            except psycopg.Error as e:
                outcome = e.sqlstate or type(e).__name__
                r.examples.setdefault((fn or what, outcome), (e.diag.message_primary or str(e), sql))
                fault = fault_of(e, self.conn)
                if fault:
                    r.errors[outcome] += 1
                    self.record(number, fault, e, sent)
                    if fault == "lost connection":
                        r.lost = True
                        self.stop.set()
                        return
                    self.connect()
                    return
            if fn:
                r.by_function.setdefault(fn, Counter())[outcome] += 1
            if outcome == "ok":
                r.successes += 1
                r.call_successes += what == "call"
            else:
                r.errors[outcome] += 1
            # Savepoints as the server has them, to recover from an error.
            if what == "begin":
                in_transaction = outcome == "ok"
            elif what == "end":
                in_transaction = False
            elif what == "savepoint" and outcome == "ok":
                verb, target = sql.rsplit(" ", 1)[0], sql.rsplit(" ", 1)[1]
                if verb == "SAVEPOINT":
                    savepoints.append(target)
                elif target in savepoints:
                    del savepoints[savepoints.index(target) + (verb != "RELEASE SAVEPOINT"):]
            if outcome != "ok" and in_transaction and what != "end":
                if savepoints:
                    recover = f"ROLLBACK TO SAVEPOINT {savepoints[-1]}"
                    sent.append(recover)
                    if not self.quietly(recover):
                        sent.append("ROLLBACK")
                        self.quietly("ROLLBACK")
                        return
                else:
                    sent.append("ROLLBACK")
                    self.quietly("ROLLBACK")
                    return

    def quietly(self, sql):
        try:
            self.conn.execute(sql)
            return True
        except psycopg.Error:
            return False

    def record(self, number, fault, error, sent):
        diag = error.diag
        message = " ".join(filter(None, [diag.message_primary or str(error).strip(), diag.message_detail,
                                          diag.context and f"CONTEXT: {diag.context}"]))
        self.report.faults.append({"session": self.index, "transaction": number, "sqlstate": fault,
                                   "message": message, "statements": SESSION_SETTINGS + list(sent),
                                   "while_dropping": self.dropping.is_set()})


def seed_pool(conninfo, seed, functions):
    """The pool's limits defined once before the sessions start, so calls find them."""
    gen = Gen(random.Random(seed - 1), functions)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        # A table of the application's, for write limits to be declared on and its rows charged.
        conn.execute("CREATE TABLE IF NOT EXISTS fuzz_written (k text, n numeric)")
        for sql in pool_definitions(gen):
            try:
                conn.execute(sql)
            except psycopg.Error:
                pass


def run(conninfo, seconds, sessions, seed, drop_extension=True):
    """Fuzzes the database `conninfo` names for `seconds` with `sessions` sessions; the Report.
    Without `drop_extension`, session 0 never drops and creates the extension."""
    functions = load_functions()
    seed_pool(conninfo, seed, functions)
    stop, dropping = threading.Event(), threading.Event()
    started = time.monotonic()
    deadline = started + seconds
    workers = [Session(i, conninfo, seed, functions, deadline, stop, dropping, drop_extension) for i in range(sessions)]
    failures = []

    def body(s):
        try:
            s.run()
        except Exception as e:  # noqa: BLE001 - a fuzzer's own failure is reported, not lost
            failures.append(f"session {s.index}: {type(e).__name__}: {e}")
            stop.set()

    threads = [threading.Thread(target=body, args=(s,), daemon=True) for s in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report = Report(seconds=time.monotonic() - started, sessions=sessions, seed=seed)
    for s in workers:
        report.merge(s.report)
    if failures:
        raise RuntimeError("; ".join(failures))
    return report


def replay(seed, session, transaction, drop_extension=True):
    """The statements transaction `transaction` (from 1) of session `session` was given."""
    gen = Gen(random.Random(seed + session), load_functions())
    for _ in range(transaction):
        plan = gen.transaction(may_drop=session == 0 and drop_extension)
    return [p[-1] for p in plan]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conninfo", default="")
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--sessions", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--functions", action="store_true", help="also print each function's outcomes")
    p.add_argument("--examples", action="store_true", help="also print a statement of each (function, SQLSTATE)")
    p.add_argument("--no-drop", action="store_true", help="never drop and create the extension")
    p.add_argument("--replay", metavar="SESSION:TRANSACTION", help="print that transaction's statements and exit")
    a = p.parse_args()
    if a.replay:
        session, transaction = map(int, a.replay.split(":"))
        print("\n".join(f"{sql};" for sql in SESSION_SETTINGS + replay(a.seed, session, transaction, not a.no_drop)))
        return 0
    report = run(a.conninfo, a.seconds, a.sessions, a.seed, drop_extension=not a.no_drop)
    print(report.table(functions=a.functions, examples=a.examples))
    return 1 if report.faults else 0


if __name__ == "__main__":
    sys.exit(main())
