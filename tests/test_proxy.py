"""rate_limiter_proxy: a PL/Proxy router on the test command's cluster in front of 2 and 4
partition clusters of its own, each a separate PostgreSQL on a socket in /tmp."""

import json
import os
import re
import uuid

import psycopg
import pytest
from psycopg import errors

from calls import OF_NAME
from catalog import catalog_of, default_privileges, granted_to
from clusters import PORTS, Cluster
from together import in_sessions

# One worker runs them all: the routers are databases of fixed names on the test command's
# cluster, and the partitions a module's clusters.
pytestmark = pytest.mark.xdist_group("proxy")

PARTITION_PORTS = PORTS["partitions"]
PROXY_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "proxy")
HOUR_WINDOW = {"kind": "fixed window", "period": 3600000}


class Fleet:
    """A router database whose PL/Proxy cluster rate_limiter is the database `dbname` on the
    first `size` partition clusters."""

    def __init__(self, router, partitions, dbname):
        self.router, self.partitions, self.dbname = router, partitions, dbname

    def connect(self, user=None, **kwargs):
        if user is not None:
            kwargs["user"] = user
        return psycopg.connect(dbname=self.router, autocommit=True, **kwargs)

    def on_partition(self, i):
        return self.partitions[i].connect(self.dbname)


@pytest.fixture(scope="module")
def partition_clusters():
    # Preloaded for memory limits, with no prune worker to change the rows tests count.
    settings = ["-c shared_preload_libraries=rate_limiter", "-c rate_limiter.prune_interval=0"]
    made = [Cluster(f"partition{i}_{uuid.uuid4().hex[:6]}", port, settings).init().start()
            for i, port in enumerate(PARTITION_PORTS)]
    try:
        for cluster in made:
            with cluster.connect() as c:
                for test_conn in ("fleet2", "fleet4"):
                    c.execute(f"CREATE DATABASE {test_conn}")
                    with cluster.connect(test_conn) as d:
                        d.execute("CREATE EXTENSION rate_limiter")
        yield made
    finally:
        for cluster in made:
            cluster.destroy()


def make_fleet(partition_clusters, size, router=None, version=None, owner=None):
    """A router database made by a superuser; `owner` (a role that is not one) owns it and its
    schema public when given."""
    router, dbname = router or f"rl_router{size}", f"fleet{size}"
    partitions = partition_clusters[:size]
    options = ", ".join(f"p{i} '{p.conninfo(dbname)}'" for i, p in enumerate(partitions))
    with psycopg.connect(autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {router} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {router}" + (f" OWNER {owner}" if owner else ""))
    with psycopg.connect(dbname=router, autocommit=True) as c:
        if owner:
            c.execute(f"ALTER SCHEMA public OWNER TO {owner}")
        c.execute("CREATE EXTENSION rate_limiter_proxy" + (f" VERSION '{version}'" if version else "") + " CASCADE")
        c.execute(f"CREATE SERVER rate_limiter FOREIGN DATA WRAPPER plproxy OPTIONS ({options})")
        c.execute("CREATE USER MAPPING FOR PUBLIC SERVER rate_limiter")
    return Fleet(router, partitions, dbname)


@pytest.fixture(scope="module")
def fleet2(partition_clusters):
    return make_fleet(partition_clusters, 2)


@pytest.fixture(scope="module")
def fleet4(partition_clusters):
    return make_fleet(partition_clusters, 4)


@pytest.fixture(params=[2, 4])
def fleet(request, fleet2, fleet4):
    return {2: fleet2, 4: fleet4}[request.param]


def unique(prefix):
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def state_rows(fleet, name):
    """How many state rows of `name` each partition holds."""
    counts = []
    for i in range(len(fleet.partitions)):
        with fleet.on_partition(i) as c:
            counts.append(c.execute(f"SELECT count(*) FROM rate_limiter.state WHERE {OF_NAME}", (name,)).fetchone()[0])
    return counts


def hammer(fleet, sessions, calls, sql, args):
    """`sessions` router sessions each make `calls` calls of `sql` at once; how many were ok."""
    def session(_):
        with fleet.connect() as c:
            return sum(c.execute(sql, args).fetchone()[0] for _ in range(calls))

    return sum(in_sessions(sessions, session))


def test_keys_spread_evenly_and_land_where_partition_of_says(fleet):
    name = unique("spread")
    config = json.dumps({**HOUR_WINDOW, "rate": 5})
    with fleet.connect() as c:
        c.execute("SELECT count(*) FROM generate_series(1, 10000) i, "
                  "rate_limiter_proxy.rate_limit(%s, 'user-' || i, config => %s)", (name, config))
        expected_of = dict(c.execute("SELECT k, rate_limiter_proxy.partition_of(k) FROM "
                                     "(SELECT 'user-' || i AS k FROM generate_series(1, 40) i) s").fetchall())
    counts = state_rows(fleet, name)
    assert sum(counts) == 10000
    # Chi-square against an even spread; 16.27 and 10.83 are the 0.1% points for 3 and 1 degrees of freedom.
    expected = 10000 / len(counts)
    chi_square = sum((n - expected) ** 2 / expected for n in counts)
    assert chi_square < {2: 10.83, 4: 16.27}[len(counts)], counts
    for key, partition in expected_of.items():
        with fleet.on_partition(partition) as c:
            assert c.execute(f"SELECT count(*) FROM rate_limiter.state WHERE {OF_NAME} AND key = %s",
                             (name, key)).fetchone()[0] == 1


def test_per_key_bound_is_exact_under_concurrent_sessions(fleet4):
    name = unique("exact")
    with fleet4.connect() as c:
        c.execute("SELECT rate_limiter_proxy.define(%s, 'fixed window', 50, '1 hour')", (name,))
    allowed = hammer(fleet4, 8, 20, "SELECT (rate_limiter_proxy.rate_limit(%s, 'hot')).ok::int", (name,))
    assert allowed == 50
    assert sorted(state_rows(fleet4, name)) == [0, 0, 0, 1]


def test_a_spread_global_limit_stays_within_its_bound(fleet):
    name = unique("global")
    with fleet.connect() as c:
        c.execute("SELECT rate_limiter_proxy.define(%s, 'fixed window', 200, '1 hour', shards => 8)", (name,))
    allowed = hammer(fleet, 8, 50, "SELECT (rate_limiter_proxy.rate_limit(%s)).ok::int", (name,))
    # 400 tries for 200 tokens: every partition's share runs out, and none is exceeded.
    assert 190 <= allowed <= 200
    # Its rows are on every partition: the load spreads.
    assert all(n == 8 // len(fleet.partitions) for n in state_rows(fleet, name))


def test_an_inline_spread_limit_is_shared_out_too(fleet4):
    name = unique("inline")
    config = json.dumps({**HOUR_WINDOW, "rate": 40, "shards": 4})
    allowed = hammer(fleet4, 4, 25, "SELECT (rate_limiter_proxy.rate_limit(%s, config => %s)).ok::int", (name, config))
    assert 36 <= allowed <= 40
    with fleet4.connect() as c:
        value = c.execute("SELECT shard, effective_config FROM rate_limiter_proxy.rate_limit_value(%s, config => %s)",
                          (name, config)).fetchone()
        assert 0 <= value[0] < 4
        assert value[1]["rate"] == 40 and value[1]["shards"] == 4 and value[1]["capacity"] == 40
        with pytest.raises(errors.InvalidParameterValue) as refused:
            c.execute("SELECT rate_limiter_proxy.rate_limit(%s, config => %s)",
                      (unique("odd"), json.dumps({**HOUR_WINDOW, "rate": 40, "shards": 6})))
        assert "Use a multiple of 4 shards" in refused.value.diag.message_hint


def test_define_reaches_every_partition_with_its_share(fleet4):
    spread, single = unique("spread_def"), unique("single_def")
    with fleet4.connect() as c:
        c.execute("SELECT rate_limiter_proxy.define(%s, 'token bucket', 400, '1 minute', capacity => 800, shards => 8)",
                  (spread,))
        c.execute("SELECT rate_limiter_proxy.define(%s, 'sliding window', 10, '1 minute')", (single,))
        with pytest.raises(errors.InvalidParameterValue):
            c.execute("SELECT rate_limiter_proxy.define(%s, 'token bucket', 1, '1 minute', shards => 6)", (single,))
        assert c.execute("SELECT rate, capacity, shards, partitions FROM rate_limiter_proxy.limits WHERE name = %s",
                         (spread,)).fetchone() == (400, 800, 8, 4)
        assert c.execute("SELECT redefine_all >= 2 FROM rate_limiter_proxy.redefine_all()").fetchone()[0]
    for i in range(4):
        with fleet4.on_partition(i) as c:
            rows = dict((r[0], r[1:]) for r in c.execute(
                "SELECT name, kind, rate, capacity, shards FROM rate_limiter.limits WHERE name IN (%s, %s)",
                (spread, single)))
            assert rows == {spread: ("token bucket", 100, 200, 2), single: ("sliding window", 10, None, 1)}


def test_an_override_goes_to_the_keys_partition_and_a_tier_to_every_one(fleet2):
    """A key's override is set where its calls go, and applies to them through the router; a
    tier reaches every partition; a spread limit has neither (0A000)."""
    name, spread = unique("plan"), unique("plan_spread")
    with fleet2.connect() as c:
        c.execute("SELECT rate_limiter_proxy.define(%s, 'sliding window', 1, '1 hour')", (name,))
        c.execute("SELECT rate_limiter_proxy.override(%s, 'pro', rate => 3, note => 'plan: pro')", (name,))
        owner = c.execute("SELECT rate_limiter_proxy.partition_of('pro')").fetchone()[0]
        took = [c.execute("SELECT ok FROM rate_limiter_proxy.rate_limit(%s, 'pro')", (name,)).fetchone()[0] for _ in range(4)]
        assert took == [True, True, True, False]
        c.execute("SELECT rate_limiter_proxy.define_tier(%s, 'team', rate => 2)", (name,))
        c.execute("SELECT rate_limiter_proxy.override(%s, 'other', tier => 'team')", (name,))
        took = [c.execute("SELECT ok FROM rate_limiter_proxy.rate_limit(%s, 'other')", (name,)).fetchone()[0] for _ in range(3)]
        assert took == [True, True, False]
        c.execute("SELECT rate_limiter_proxy.define(%s, 'token bucket', 10, '1 minute', shards => 4)", (spread,))
        for sql in ["SELECT rate_limiter_proxy.override(%s, 'k', rate => 20)", "SELECT rate_limiter_proxy.define_tier(%s, 't', rate => 20)"]:
            with pytest.raises(errors.FeatureNotSupported):
                c.execute(sql, (spread,))
    for i in range(2):
        with fleet2.on_partition(i) as c:
            overrides = c.execute("SELECT key FROM rate_limiter.overrides WHERE name = %s AND key = 'pro'", (name,)).fetchall()
            assert overrides == ([("pro",)] if i == owner else []), i
            assert c.execute("SELECT rate FROM rate_limiter.tiers WHERE name = %s", (name,)).fetchall() == [(2.0,)], i
    with fleet2.connect() as c:
        assert c.execute("SELECT rate_limiter_proxy.remove_override(%s, 'pro')", (name,)).fetchone() == (True,)
        with pytest.raises(errors.ForeignKeyViolation):
            c.execute("SELECT rate_limiter_proxy.remove_tier(%s, 'team')", (name,))


def test_a_limit_with_overrides_or_tiers_is_not_spread_by_a_later_define(fleet2):
    """Issue 64, F5: the router refused overrides and tiers of a spread limit only when they
    were made. A later define(..., shards => N) spread the limit over the partitions and left
    each override and tier whole on every partition: a key in a tier of 4 got 4 on each, 8
    in all. Now that define is refused (0A000), and allowed once the plans are gone."""
    name = unique("plan_then_spread")
    with fleet2.connect() as c:
        c.execute("SELECT rate_limiter_proxy.define(%s, 'fixed window', 2, '1 hour')", (name,))
        c.execute("SELECT rate_limiter_proxy.define_tier(%s, 'team', rate => 4)", (name,))
        c.execute("SELECT rate_limiter_proxy.override(%s, 'k', tier => 'team')", (name,))
        with pytest.raises(errors.FeatureNotSupported, match="overrides or tiers"):
            c.execute("SELECT rate_limiter_proxy.define(%s, 'fixed window', 2, '1 hour', shards => 4)", (name,))
        took = sum(c.execute("SELECT ok FROM rate_limiter_proxy.rate_limit(%s, 'k')", (name,)).fetchone()[0] for _ in range(10))
        assert took == 4, "the tier's 4, once"
        c.execute("SELECT rate_limiter_proxy.define(%s, 'fixed window', 3, '1 hour')", (name,))  # not spread: allowed
        assert c.execute("SELECT rate_limiter_proxy.remove_override(%s, 'k')", (name,)).fetchone() == (True,)
        assert c.execute("SELECT rate_limiter_proxy.remove_tier(%s, 'team')", (name,)).fetchone() == (True,)
        c.execute("SELECT rate_limiter_proxy.define(%s, 'fixed window', 2, '1 hour', shards => 4)", (name,))
        assert c.execute("SELECT shards FROM rate_limiter_proxy.limits WHERE name = %s", (name,)).fetchone() == (4,)


def test_a_limit_defined_through_the_router_in_shadow_mode_is_so_on_every_partition(fleet2):
    name = unique("shadow")
    with fleet2.connect() as c:
        c.execute("SELECT rate_limiter_proxy.define(%s, 'fixed window', 1, '1 hour', enforce => false)", (name,))
        assert c.execute("SELECT enforce FROM rate_limiter_proxy.limits WHERE name = %s", (name,)).fetchone() == (False,)
        answers = [c.execute("SELECT ok, reason FROM rate_limiter_proxy.rate_limit(%s, 'k')", (name,)).fetchone()
                   for _ in range(2)]
        assert answers == [(True, None), (True, "shadow")]
        # redefine_all keeps it so; define again enforced.
        c.execute("SELECT rate_limiter_proxy.redefine_all()")
        assert c.execute("SELECT reason FROM rate_limiter_proxy.rate_limit(%s, 'k')", (name,)).fetchone() == ("shadow",)
        c.execute("SELECT rate_limiter_proxy.define(%s, 'fixed window', 1, '1 hour')", (name,))
        assert c.execute("SELECT ok, reason FROM rate_limiter_proxy.rate_limit(%s, 'k')", (name,)).fetchone() == (
            False, "exhausted")
    for i in range(2):
        with fleet2.on_partition(i) as c:
            assert c.execute("SELECT enforce FROM rate_limiter.limits WHERE name = %s", (name,)).fetchone() == (True,)


def test_a_memory_limit_through_the_router_counts_on_the_partition_of_the_key(fleet2):
    name = unique("memory")
    with fleet2.connect() as c:
        c.execute("SELECT rate_limiter_proxy.define(%s, 'fixed window', 2, '1 hour', durable => false)", (name,))
        assert c.execute("SELECT durable FROM rate_limiter_proxy.limits WHERE name = %s", (name,)).fetchone() == (False,)
        answers = [c.execute("SELECT ok FROM rate_limiter_proxy.rate_limit(%s, 'k')", (name,)).fetchone()[0]
                   for _ in range(3)]
        assert answers == [True, True, False]
        owner = c.execute("SELECT rate_limiter_proxy.partition_of('k')").fetchone()[0]
        c.execute("SELECT rate_limiter_proxy.redefine_all()")
        with pytest.raises(errors.FeatureNotSupported):
            c.execute("SELECT rate_limiter_proxy.define(%s, 'fixed window', 2, '1 hour', shards => 4, durable => false)",
                      (name,))
    for i in range(2):
        with fleet2.on_partition(i) as p:
            assert p.execute("SELECT durable FROM rate_limiter.limits WHERE name = %s", (name,)).fetchone() == (False,)
            assert p.execute("SELECT count(*) FROM rate_limiter.state WHERE name = %s", (name,)).fetchone() == (0,)
            left = p.execute("SELECT remaining FROM rate_limiter.check_rate_limit(%s, 'k', 0)", (name,)).fetchone()[0]
            assert left == (0 if i == owner else 2), "counted on the key's partition, in memory"


def test_a_concurrency_limit_through_the_router_holds_leases_on_the_partition_of_the_key(fleet2):
    name = unique("slots")
    with fleet2.connect() as c:
        c.execute("SELECT rate_limiter_proxy.define(%s, 'concurrency', 1, '1 second')", (name,))
        owner = c.execute("SELECT rate_limiter_proxy.partition_of('team')").fetchone()[0]
        ok, lease = c.execute("SELECT ok, lease_id FROM rate_limiter_proxy.acquire(%s, 'team', lease => '1 hour')",
                              (name,)).fetchone()
        assert ok and lease is not None
        assert c.execute("SELECT ok, reason FROM rate_limiter_proxy.acquire(%s, 'team', lease => '1 hour')",
                         (name,)).fetchone() == (False, "exhausted")
        assert c.execute("SELECT rate_limiter_proxy.renew(%s, 'team', %s, '2 hours')", (name, lease)).fetchone()[0]
        with fleet2.on_partition(owner) as p:
            assert p.execute("SELECT count(*) FROM rate_limiter.leases WHERE name = %s", (name,)).fetchone()[0] == 1
        assert c.execute("SELECT rate_limiter_proxy.release(%s, 'team', %s)", (name, lease)).fetchone()[0]
        assert c.execute("SELECT ok FROM rate_limiter_proxy.check_rate_limit(%s, 'team')", (name,)).fetchone()[0]
        # A slot for the partition's own transaction would end before the caller used it.
        for call in [f"rate_limiter_proxy.acquire('{name}', 'team')", f"rate_limiter_proxy.rate_limit('{name}', 'team')",
                     f"rate_limiter_proxy.wait_rate_limit('{name}', 'team')",
                     "rate_limiter_proxy.rate_limit('x', 'team', config => '{\"kind\": \"concurrency\", \"rate\": 1, \"period\": 1000}')"]:
            with pytest.raises(errors.FeatureNotSupported):
                c.execute(f"SELECT * FROM {call}")


def test_the_router_refuses_what_the_extension_refuses_of_a_concurrency_limit_and_takes_no_lease(fleet2):
    """Issue 41: 0.5.0's router sent an inline concurrency config with "shards" (which the
    extension refuses with 0A000) to a random partition as a spread limit, while release and
    renew go to the key's partition: 5 leases taken, 3 released, 2 held for their hour."""
    name = unique("spread_slots")
    sharded = '{"kind": "concurrency", "rate": 2, "period": 1000, "shards": 2}'
    with fleet2.connect() as c:
        for _ in range(5):
            with pytest.raises(errors.FeatureNotSupported):
                c.execute("SELECT * FROM rate_limiter_proxy.acquire(%s, 'team', lease => '1 hour', config => %s::jsonb)",
                          (name, sharded))
        with pytest.raises(errors.FeatureNotSupported):
            c.execute("SELECT * FROM rate_limiter_proxy.check_rate_limit(%s, 'team', config => %s::jsonb)", (name, sharded))
        with pytest.raises(errors.FeatureNotSupported):
            c.execute("SELECT rate_limiter_proxy.define(%s, 'concurrency', 2, '1 second', shards => 2)", (name,))
        assert c.execute("SELECT count(*) FROM rate_limiter_proxy.limits WHERE name = %s", (name,)).fetchone() == (0,)
    for partition in range(2):
        with fleet2.on_partition(partition) as p:
            assert p.execute("SELECT count(*) FROM rate_limiter.leases WHERE split_part(name, '#', 1) = %s",
                             (name,)).fetchone() == (0,), "no lease anywhere"


def test_a_spread_limit_waits_for_redefine_all_after_the_partitions_change(partition_clusters):
    grown = make_fleet(partition_clusters, 2, router="rl_router_grown")
    name = unique("grown")
    call = "SELECT ok FROM rate_limiter_proxy.rate_limit(%s)"
    with grown.connect() as c:
        c.execute("SELECT rate_limiter_proxy.define(%s, 'fixed window', 40, '36500 days', shards => 4)", (name,))
        assert c.execute(call, (name,)).fetchone()[0]
        # Partitions 2 and 3 join as copies would: still holding the shares of 2 partitions,
        # which over 4 would add up to twice the limit.
        for i in (2, 3):
            with partition_clusters[i].connect("fleet2") as p:
                p.execute("SELECT rate_limiter.define(%s, 'fixed window', 20, '36500 days', shards => 2)", (name,))
        added = ", ".join(f"ADD p{i} '{partition_clusters[i].conninfo('fleet2')}'" for i in (2, 3))
        c.execute(f"ALTER SERVER rate_limiter OPTIONS ({added})")
        assert c.execute("SELECT rate_limiter_proxy.partitions()").fetchone()[0] == 4
        with pytest.raises(errors.ObjectNotInPrerequisiteState) as stale:
            c.execute(call, (name,))
        assert "redefine_all()" in stale.value.diag.message_hint
        assert c.execute("SELECT rate_limiter_proxy.redefine_all()").fetchone()[0] == 1
        assert c.execute("SELECT partitions FROM rate_limiter_proxy.limits WHERE name = %s", (name,)).fetchone()[0] == 4
        allowed = sum(c.execute(call, (name,)).fetchone()[0] for _ in range(120))
    shares = []
    for i in range(4):
        with partition_clusters[i].connect("fleet2") as p:
            shares.append(p.execute("SELECT rate, shards FROM rate_limiter.limits WHERE name = %s", (name,)).fetchone())
    assert shares == [(10, 1)] * 4
    # Shares of 10 on each of the 4: 40 fit, or 39 when the call before the change was on a
    # shard 0, whose row still counts it (120 random calls give each partition its 10 all
    # but surely).
    assert allowed in (39, 40)


ROUTED = ("rate_limit", "rate_limit_ok", "check_rate_limit", "wait_rate_limit", "rate_limit_all", "check_rate_limit_all",
          "rate_limit_value", "reset_rate_limit", "define", "block", "unblock", "credit", "allow", "disallow",
          "acquire", "release", "renew", "override", "remove_override", "define_tier", "remove_tier")
# What docs/scaling-out.md says stays on each partition; anything new in rate_limiter must be
# routed or listed here.
PARTITION_ONLY = {"http_headers", "http_headers_all", "http_problem", "prune", "stats_reset",
                  "ip_key", "stats_every_database", "top_denied_every_database", "limit_writes", "unlimit_writes"}
SIGNATURES = """
SELECT p.proname, pg_get_function_arguments(p.oid),
       replace(pg_get_function_result(p.oid), %(schema)s || '.decision', 'decision'),
       p.provolatile, p.proparallel, p.proisstrict
  FROM pg_proc p WHERE p.pronamespace = %(schema)s::regnamespace AND p.proname = ANY(%(names)s)
 ORDER BY 1, 2
"""
DECISION_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
 WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum
"""


def test_the_router_has_the_signatures_and_results_of_rate_limiter(fleet2):
    with fleet2.on_partition(0) as c:
        direct = c.execute(SIGNATURES, {"schema": "rate_limiter", "names": list(ROUTED)}).fetchall()
        direct_decision = c.execute(DECISION_COLUMNS, ("rate_limiter.decision",)).fetchall()
        public = {r[0] for r in c.execute(
            "SELECT proname FROM pg_proc WHERE pronamespace = 'rate_limiter'::regnamespace AND proname !~ '^_'")}
    with fleet2.connect() as c:
        routed = c.execute(SIGNATURES, {"schema": "rate_limiter_proxy", "names": list(ROUTED)}).fetchall()
        routed_decision = c.execute(DECISION_COLUMNS, ("rate_limiter_proxy.decision",)).fetchall()
    assert sorted({r[0] for r in direct}) == sorted(ROUTED)
    assert public - set(ROUTED) == PARTITION_ONLY
    # Name, arguments with their defaults, result, volatility, parallel safety and strictness.
    assert routed == direct
    assert routed_decision == direct_decision


def test_results_and_errors_read_as_on_a_partition(fleet2):
    name = unique("same")
    config = json.dumps({**HOUR_WINDOW, "rate": 2})
    with fleet2.connect() as c:
        columns = lambda cur: [d.name for d in cur.description]
        through = c.execute("SELECT * FROM rate_limiter_proxy.rate_limit(%s, 'k', 2, config => %s)", (name, config))
        assert columns(through) == ["ok", "retry_after", "remaining", "reset_after", "granted", "reason", "limited_by"]
        assert through.fetchone()[:3] == (True, None, 0)
        assert c.execute("SELECT ok, reason FROM rate_limiter_proxy.check_rate_limit(%s, 'k', config => %s)",
                         (name, config)).fetchone() == (False, "exhausted")
        with pytest.raises(psycopg.Error) as denied:
            c.execute("SELECT rate_limiter_proxy.rate_limit(%s, 'k', throws => true, config => %s)", (name, config))
        diag = denied.value.diag
        assert diag.sqlstate == "RL429"
        assert diag.message_primary == f'rate limit "{name}" exceeded'
        detail = json.loads(diag.message_detail)
        assert detail["kind"] == "RateLimited" and detail["key"] == "k" and detail["retryAfter"] > 0
        # The same number as the detail's (compared as numbers: two shortest spellings of one
        # double may differ in their last digit).
        hint = re.fullmatch(r"Retry after ([0-9.e+-]+) ms\.", diag.message_hint)
        assert hint and float(hint.group(1)) == detail["retryAfter"]
        # rate_limit_ok: the same call's ok, and its RL429 with throws.
        assert c.execute("SELECT rate_limiter_proxy.rate_limit_ok(%s, 'k', config => %s)", (name, config)).fetchone() == (False,)
        with pytest.raises(psycopg.Error) as denied_ok:
            c.execute("SELECT rate_limiter_proxy.rate_limit_ok(%s, 'k', throws => true, config => %s)", (name, config))
        assert denied_ok.value.diag.sqlstate == "RL429" and json.loads(denied_ok.value.diag.message_detail)["key"] == "k"
        with pytest.raises(errors.InvalidParameterValue) as invalid:
            c.execute("SELECT rate_limiter_proxy.rate_limit(%s, 'k', config => '{\"kind\": \"leaky\"}')", (name,))
        assert invalid.value.diag.message_primary.startswith("invalid rate limit config")
        c.execute("SELECT rate_limiter_proxy.reset_rate_limit(%s, 'k')", (name,))
        assert c.execute("SELECT ok FROM rate_limiter_proxy.wait_rate_limit(%s, 'k', timeout => '1 second', config => %s)",
                         (name, config)).fetchone()[0]
        c.execute("SELECT rate_limiter_proxy.block(%s, 'blocked')", (name,))
        assert c.execute("SELECT ok, reason FROM rate_limiter_proxy.rate_limit(%s, 'blocked', config => %s)",
                         (name, config)).fetchone() == (False, "blocked")
        assert c.execute("SELECT rate_limiter_proxy.unblock(%s, 'blocked')", (name,)).fetchone()[0] is True
        # Credits go to the key's partition, allows to every partition.
        c.execute("SELECT rate_limiter_proxy.rate_limit(%s, 'spent', 2, config => %s)", (name, config))
        assert not c.execute("SELECT ok FROM rate_limiter_proxy.rate_limit(%s, 'spent', config => %s)",
                             (name, config)).fetchone()[0]
        assert c.execute("SELECT ok, granted FROM rate_limiter_proxy.credit(%s, 'spent', 1, config => %s)",
                         (name, config)).fetchone() == (True, -1)
        assert c.execute("SELECT ok FROM rate_limiter_proxy.rate_limit(%s, 'spent', config => %s)",
                         (name, config)).fetchone()[0]
        c.execute("SELECT rate_limiter_proxy.allow(%s, 'spent')", (name,))
        assert c.execute("SELECT ok, reason FROM rate_limiter_proxy.rate_limit(%s, 'spent', config => %s)",
                         (name, config)).fetchone() == (True, "allowed")
        assert c.execute("SELECT rate_limiter_proxy.disallow(%s, 'spent')", (name,)).fetchone()[0] is True


def test_rate_limit_all_takes_limits_of_one_partition(fleet2):
    spread, per_user = unique("all_spread"), unique("all_user")
    with fleet2.connect() as c:
        c.execute("SELECT rate_limiter_proxy.define(%s, 'fixed window', 100, '1 hour', shards => 2)", (spread,))
        c.execute("SELECT rate_limiter_proxy.define(%s, 'fixed window', 1, '1 hour')", (per_user,))
        keys = c.execute("SELECT k, rate_limiter_proxy.partition_of(k) FROM (SELECT 'user-' || i AS k "
                         "FROM generate_series(1, 20) i) s").fetchall()
        on_0 = [k for k, p in keys if p == 0][:2]
        on_1 = [k for k, p in keys if p == 1][0]
        both = lambda key: json.dumps([{"name": spread}, {"name": per_user, "key": key}])
        assert c.execute("SELECT ok FROM rate_limiter_proxy.rate_limit_all(%s)", (both(on_0[0]),)).fetchone()[0]
        # All or nothing on that partition: the per-user limit denies, the spread one keeps its token.
        assert c.execute("SELECT ok, limited_by FROM rate_limiter_proxy.rate_limit_all(%s)",
                         (both(on_0[0]),)).fetchone() == (False, per_user)
        # An inline spread config in a request is shared out like rate_limit's.
        inline = {**HOUR_WINDOW, "rate": 10, "shards": 2}
        assert c.execute("SELECT ok FROM rate_limiter_proxy.rate_limit_all(%s)", (json.dumps(
            [{"name": unique("all_inline"), "config": inline}, {"name": per_user, "key": on_0[1]}]),)).fetchone()[0]
        with pytest.raises(errors.FeatureNotSupported):
            c.execute("SELECT rate_limiter_proxy.rate_limit_all(%s)", (json.dumps(
                [{"name": per_user, "key": on_0[1]}, {"name": per_user, "key": on_1}]),))
    # Only the first call took from the spread limit: partition 0's share of 50 holds 49.
    held = []
    for i in range(2):
        with fleet2.on_partition(i) as c:
            held.append([v for (v,) in c.execute(f"SELECT value FROM rate_limiter.state WHERE {OF_NAME}", (spread,))])
    assert held == [[49], []]


PARTITION_APP = """
CREATE SCHEMA app;
CREATE TABLE app.messages (user_id text, body text);
-- The write and its limit in one transaction on the partition that owns user_id.
CREATE FUNCTION app.send_message(user_id text, body text) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    PERFORM rate_limiter.rate_limit('send_message', user_id, throws => true,
                                    config => '{"kind": "fixed window", "rate": 2, "period": 3600000}');
    IF body = '' THEN
        RAISE EXCEPTION 'empty message' USING ERRCODE = 'check_violation';
    END IF;
    INSERT INTO app.messages VALUES (user_id, body);
    RETURN (SELECT count(*) FROM app.messages m WHERE m.user_id = send_message.user_id);
END $$;
"""

ROUTER_APP = """
CREATE SCHEMA app;
CREATE FUNCTION app.send_message(user_id text, body text) RETURNS bigint LANGUAGE plproxy AS $$
    CLUSTER 'rate_limiter';
    RUN ON hashtext(user_id);
$$;
"""


def test_the_limit_rolls_back_with_the_work_only_on_the_partition(fleet2):
    for i in range(2):
        with fleet2.on_partition(i) as c:
            c.execute(PARTITION_APP)
    with fleet2.connect() as c:
        c.execute(ROUTER_APP)
        owner = c.execute("SELECT rate_limiter_proxy.partition_of('alice')").fetchone()[0]
        assert c.execute("SELECT app.send_message('alice', 'hi')").fetchone()[0] == 1
        with pytest.raises(errors.CheckViolation):
            c.execute("SELECT app.send_message('alice', '')")
        # The failed send gave its token back on the partition: the second one still fits.
        assert c.execute("SELECT app.send_message('alice', 'again')").fetchone()[0] == 2
        with pytest.raises(psycopg.Error) as over:
            c.execute("SELECT app.send_message('alice', 'third')")
        assert over.value.diag.sqlstate == "RL429"
        # A call through the router commits on the partition by itself: the router's rollback
        # does not give its token back.
        name, config = unique("caveat"), json.dumps({**HOUR_WINDOW, "rate": 1})
        c.execute("BEGIN")
        assert c.execute("SELECT ok FROM rate_limiter_proxy.rate_limit(%s, 'bob', config => %s)",
                         (name, config)).fetchone()[0]
        c.execute("ROLLBACK")
        assert c.execute("SELECT ok FROM rate_limiter_proxy.rate_limit(%s, 'bob', config => %s)",
                         (name, config)).fetchone()[0] is False
    with fleet2.on_partition(owner) as c:
        assert c.execute("SELECT body FROM app.messages WHERE user_id = 'alice' ORDER BY 1").fetchall() == [
            ("again",), ("hi",)]


def test_a_down_partition_fails_its_keys_with_a_connection_error_and_not_the_others(fleet2):
    name, config = unique("down"), json.dumps({**HOUR_WINDOW, "rate": 100})
    call = "SELECT ok FROM rate_limiter_proxy.rate_limit(%s, %s, config => %s)"
    with fleet2.connect() as c:
        keys = c.execute("SELECT k, rate_limiter_proxy.partition_of(k) FROM (SELECT 'user-' || i AS k "
                         "FROM generate_series(1, 20) i) s").fetchall()
        up_key = next(k for k, p in keys if p == 0)
        down_key = next(k for k, p in keys if p == 1)
        # PL/Proxy now holds a connection to partition 1, which goes stale below.
        assert c.execute(call, (name, down_key, config)).fetchone()[0]
        fleet2.partitions[1].stop()
        try:
            # The connection PL/Proxy held may first report the shutdown (08006, "lost ...
            # during the call"); then no new one can be made (08001). Partition 0 goes on.
            for attempt in range(3):
                with pytest.raises(psycopg.OperationalError) as failed:
                    c.execute(call, (name, down_key, config))
                diag = failed.value.diag
                assert diag.sqlstate.startswith("08") and "partition 1 of PL/Proxy cluster" in diag.message_primary
                assert c.execute(call, (name, up_key, config)).fetchone()[0]
            assert (diag.sqlstate, diag.message_primary) == (
                "08001", 'partition 1 of PL/Proxy cluster "rate_limiter" is unreachable')
            with pytest.raises(psycopg.OperationalError) as define_failed:
                c.execute("SELECT rate_limiter_proxy.define(%s, 'fixed window', 1, '1 hour')", (name,))
            assert define_failed.value.diag.sqlstate == "08001"
        finally:
            fleet2.partitions[1].start()
        assert c.execute(call, (name, down_key, config)).fetchone()[0]
    with fleet2.on_partition(1) as c:
        assert c.execute(f"SELECT count(*) FROM rate_limiter.state WHERE {OF_NAME} AND key = %s",
                         (name, down_key)).fetchone()[0] == 1


# The router from an attacker's side.

# What README's "Scaling out" tells an administrator to grant a role that calls through the
# router. Changing the partitions (define, block, ...) needs more, on rate_limiter_proxy.limits.
ROUTER_USER_GRANTS = """
GRANT USAGE ON SCHEMA rate_limiter_proxy TO {role};
GRANT USAGE ON FOREIGN SERVER rate_limiter TO {role};
GRANT SELECT ON rate_limiter_proxy.limits TO {role};
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA rate_limiter_proxy TO {role};
"""


@pytest.fixture
def new_role():
    """Makes roles that log in. After the test it drops them, with the databases they own and
    what they own or were granted in the other databases."""
    made = []

    def make(prefix="attacker"):
        made.append(unique(prefix))
        with psycopg.connect(autocommit=True) as admin:
            admin.execute(f"CREATE ROLE {made[-1]} LOGIN")
        return made[-1]

    yield make
    with psycopg.connect(autocommit=True) as admin:
        for role in made:
            for (test_conn,) in admin.execute("SELECT datname FROM pg_database WHERE datdba = %s::regrole", (role,)).fetchall():
                admin.execute(f"DROP DATABASE {test_conn} WITH (FORCE)")
        databases = [test_conn for (test_conn,) in admin.execute("SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate")]
    for test_conn in databases:
        try:
            with psycopg.connect(dbname=test_conn, autocommit=True) as c:
                for role in made:
                    c.execute(f"DROP OWNED BY {role}")
        except psycopg.OperationalError:
            pass  # dropped meanwhile by another test, with what the roles owned there
    with psycopg.connect(autocommit=True) as admin:
        for role in made:
            admin.execute(f"DROP ROLE {role}")


FUNCTIONS = """
SELECT p.oid::regprocedure::text, p.proname, p.proowner::regrole::text, p.proacl IS NULL,
       array(SELECT a.grantee::regrole::text FROM aclexplode(p.proacl) a ORDER BY 1),
       has_function_privilege(%(role)s, p.oid, 'EXECUTE'), has_function_privilege('public', p.oid, 'EXECUTE'),
       array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, i) ORDER BY i)
  FROM pg_proc p WHERE p.pronamespace = 'rate_limiter_proxy'::regnamespace ORDER BY 1
"""


def test_a_role_without_grants_can_execute_no_router_function(fleet2, new_role):
    role = new_role()
    with fleet2.connect() as admin:
        functions = admin.execute(FUNCTIONS, {"role": role}).fetchall()
        # What was enough to call everything in 0.3.0, whose functions PUBLIC could execute.
        admin.execute(f"GRANT USAGE ON SCHEMA rate_limiter_proxy TO {role}; GRANT USAGE ON FOREIGN SERVER rate_limiter "
                      f"TO {role}; GRANT SELECT ON rate_limiter_proxy.limits TO {role}")
    assert {f[1] for f in functions} >= set(ROUTED) | {"_define_everywhere", "_block_everywhere", "_gate"}
    for signature, _, owner, default_acl, grantees, role_may, public_may, _ in functions:
        # A NULL ACL would mean the default: EXECUTE for PUBLIC.
        assert (default_acl, grantees, role_may, public_may) == (False, [owner], False, False), signature
    with fleet2.connect(user=role) as c:
        for _, name, _, _, _, _, _, types in functions:
            # (SELECT NULL): a constant NULL would let the planner skip a STRICT function.
            with pytest.raises(errors.InsufficientPrivilege) as refused:
                c.execute(f"SELECT rate_limiter_proxy.{name}({', '.join(f'(SELECT NULL::{t})' for t in types)})")
            assert refused.value.diag.message_primary == f"permission denied for function {name}"


def partitions_state(fleet, name):
    """What each partition holds of `name`: its definition, blocks of it (or of every limit)
    and its state rows."""
    held = []
    for i in range(len(fleet.partitions)):
        with fleet.on_partition(i) as c:
            held.append((
                c.execute("SELECT * FROM rate_limiter.limits WHERE name = %s", (name,)).fetchall(),
                c.execute("SELECT name, key, until::text, note FROM rate_limiter.blocks WHERE name = %s OR name IS NULL "
                          "ORDER BY 1, 2", (name,)).fetchall(),
                c.execute(f"SELECT key, shard, value, ts FROM rate_limiter.state WHERE {OF_NAME} ORDER BY 1, 2",
                          (name,)).fetchall()))
    return held


DEFINE_HINT = "GRANT INSERT, UPDATE ON rate_limiter_proxy.limits TO "
UPDATE_HINT = "GRANT UPDATE ON rate_limiter_proxy.limits TO "
# Each function that changes every partition, and its hop called directly, with the GRANT its
# refusal names.
PARTITION_CHANGES = [
    ("SELECT rate_limiter_proxy.define(%(name)s, 'token bucket', 1000000, '1 second')", DEFINE_HINT),
    ("SELECT rate_limiter_proxy.define(%(name)s, 'token bucket', 1000000, '1 second', shards => 4)", DEFINE_HINT),
    ("SELECT rate_limiter_proxy.redefine_all()", DEFINE_HINT),
    ("SELECT rate_limiter_proxy.block(%(name)s, 'alice')", UPDATE_HINT),
    ("SELECT rate_limiter_proxy.block(NULL, 'alice')", UPDATE_HINT),
    ("SELECT rate_limiter_proxy.unblock(%(name)s, 'victim')", UPDATE_HINT),
    ("SELECT rate_limiter_proxy.allow(%(name)s, 'alice')", UPDATE_HINT),
    ("SELECT rate_limiter_proxy.disallow(%(name)s, 'victim')", UPDATE_HINT),
    ("SELECT rate_limiter_proxy.reset_rate_limit(%(name)s, 'used')", UPDATE_HINT),
    ("SELECT rate_limiter_proxy._define_everywhere(%(name)s, 'token bucket', 1000000, '1 second', NULL, NULL, 1, "
     "NULL, NULL, 'all', NULL, NULL, 'deny', NULL, true, NULL, true)", DEFINE_HINT),
    ("SELECT rate_limiter_proxy._block_everywhere(%(name)s, 'alice', 'infinity', 'mine now')", UPDATE_HINT),
    ("SELECT rate_limiter_proxy._block_everywhere(NULL, 'alice', 'infinity', 'mine now')", UPDATE_HINT),
    ("SELECT rate_limiter_proxy._unblock_everywhere(%(name)s, 'victim')", UPDATE_HINT),
    ("SELECT rate_limiter_proxy._allow_everywhere(NULL, 'alice', 'infinity', 'mine now')", UPDATE_HINT),
    ("SELECT rate_limiter_proxy._disallow_everywhere(%(name)s, 'victim')", UPDATE_HINT),
    ("SELECT rate_limiter_proxy._reset_everywhere(%(name)s, 'used')", UPDATE_HINT),
]


def test_a_router_user_cannot_change_the_partitions(fleet2, new_role):
    name, role = unique("guarded"), new_role()
    with fleet2.connect() as admin:
        admin.execute(ROUTER_USER_GRANTS.format(role=role))
        admin.execute("SELECT rate_limiter_proxy.define(%s, 'fixed window', 5, '1 hour')", (name,))
        admin.execute("SELECT rate_limiter_proxy.block(%s, 'victim', note => 'by the operator')", (name,))
        recorded = admin.execute("SELECT * FROM rate_limiter_proxy.limits WHERE name = %s", (name,)).fetchall()
    with fleet2.connect(user=role) as c:
        # The grants are real: the role reaches the partitions.
        assert c.execute("SELECT ok, remaining FROM rate_limiter_proxy.rate_limit(%s, 'used')", (name,)).fetchone() == (True, 4)
        before = partitions_state(fleet2, name)
        for sql, hint in PARTITION_CHANGES:
            with pytest.raises(errors.InsufficientPrivilege) as refused:
                c.execute(sql, {"name": name})
            assert refused.value.diag.message_hint == hint + role + ";", sql
            assert "Nothing was sent to a partition." in refused.value.diag.message_detail
    assert partitions_state(fleet2, name) == before
    with fleet2.connect() as admin:
        assert admin.execute("SELECT * FROM rate_limiter_proxy.limits WHERE name = %s", (name,)).fetchall() == recorded


def test_the_grants_on_limits_allow_what_the_router_says(fleet2, new_role):
    name, blocker, definer = unique("granted"), new_role("blocker"), new_role("definer")
    with fleet2.connect() as admin:
        admin.execute(ROUTER_USER_GRANTS.format(role=blocker) + ROUTER_USER_GRANTS.format(role=definer))
        admin.execute(f"GRANT UPDATE ON rate_limiter_proxy.limits TO {blocker}")
        admin.execute(f"GRANT INSERT, UPDATE ON rate_limiter_proxy.limits TO {definer}")
    with fleet2.connect(user=definer) as c:
        c.execute("SELECT rate_limiter_proxy.define(%s, 'fixed window', 4, '1 hour', shards => 2)", (name,))
        assert c.execute("SELECT rate_limiter_proxy.redefine_all() >= 1").fetchone()[0]
    with fleet2.connect(user=blocker) as c:
        c.execute("SELECT rate_limiter_proxy.block(%s, 'bob')", (name,))
        assert c.execute("SELECT reason FROM rate_limiter_proxy.rate_limit(%s, 'bob')", (name,)).fetchone() == ("blocked",)
        assert c.execute("SELECT rate_limiter_proxy.unblock(%s, 'bob')", (name,)).fetchone() == (True,)
        c.execute("SELECT rate_limiter_proxy.reset_rate_limit(%s)", (name,))
        with pytest.raises(errors.InsufficientPrivilege) as refused:
            c.execute("SELECT rate_limiter_proxy.define(%s, 'fixed window', 400, '1 hour')", (name,))
        assert refused.value.diag.message_hint == f"GRANT INSERT ON rate_limiter_proxy.limits TO {blocker};"
    for limits, blocks, _ in partitions_state(fleet2, name):
        assert [(r[1], r[2]) for r in limits] == [("fixed window", 2)] and [b for b in blocks if b[0] == name] == []


# What the owner of a router database (a role that is not a superuser) can plant for a
# superuser to run: in public, which it owns, a copy of every operator of pg_catalog; of its
# polymorphic ones at text and text[] (an exact match, which wins wherever it is in the path);
# of float8-integer arithmetic, which pg_catalog lacks, so that any such expression prefers
# it; and of every function of pg_catalog that the router's scripts name. Each notes that it
# ran, then does what the original does. The sequence keeps the note through a rollback.
PLANT = r"""
SET search_path = pg_catalog;
CREATE TABLE public.planted_ran (what text, by_role name DEFAULT current_user);
CREATE SEQUENCE public.planted_calls;
GRANT INSERT ON public.planted_ran TO PUBLIC;
GRANT USAGE ON SEQUENCE public.planted_calls TO PUBLIC;
CREATE FUNCTION public.planted(what text) RETURNS void LANGUAGE sql AS $$
    SELECT pg_catalog.nextval('public.planted_calls');
    INSERT INTO public.planted_ran (what) VALUES (what);
$$;
DO $plant$
DECLARE
    o record;
    n integer := 0;
BEGIN
    FOR o IN
        WITH generic(t, concrete) AS (
            VALUES ('anyarray'::regtype, 'text[]'::regtype), ('anycompatiblearray', 'text[]'), ('anyelement', 'text'),
                   ('anycompatible', 'text'), ('anynonarray', 'text'), ('anycompatiblenonarray', 'text')),
        ops(name, l, r, res) AS (
            SELECT oprname, oprleft::regtype, oprright::regtype, oprresult::regtype
              FROM pg_operator WHERE oprnamespace = 'pg_catalog'::regnamespace
            UNION
            SELECT op, t.l, t.r, 'float8'::regtype FROM unnest(ARRAY['*', '/', '+', '-']) op,
                   (VALUES ('float8'::regtype, 'int4'::regtype), ('int4', 'float8')) t(l, r))
        SELECT DISTINCT ON (ops.name, 2, 3) ops.name, coalesce(gl.concrete, ops.l) AS l,
               coalesce(gr.concrete, ops.r) AS r, coalesce(gres.concrete, ops.res) AS res
          FROM ops LEFT JOIN generic gl ON gl.t = ops.l LEFT JOIN generic gr ON gr.t = ops.r
               LEFT JOIN generic gres ON gres.t = ops.res
    LOOP
        CONTINUE WHEN EXISTS (SELECT FROM pg_type t WHERE t.oid IN (o.l, o.r, o.res) AND t.typtype = 'p');
        n := n + 1;
        IF o.l::oid = 0 THEN
            EXECUTE format('CREATE FUNCTION public.planted_op_%s(%s) RETURNS %s LANGUAGE plpgsql AS %L', n, o.r, o.res,
                format('BEGIN PERFORM public.planted(%L); RETURN OPERATOR(pg_catalog.%s) $1; END',
                       format('%s(%s)', o.name, o.r), o.name));
            EXECUTE format('CREATE OPERATOR public.%s (RIGHTARG = %s, FUNCTION = public.planted_op_%s)', o.name, o.r, n);
        ELSE
            EXECUTE format('CREATE FUNCTION public.planted_op_%s(%s, %s) RETURNS %s LANGUAGE plpgsql AS %L', n, o.l, o.r, o.res,
                format('BEGIN PERFORM public.planted(%L); RETURN $1 OPERATOR(pg_catalog.%s) $2; END',
                       format('%s(%s, %s)', o.name, o.l, o.r), o.name));
            EXECUTE format('CREATE OPERATOR public.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = public.planted_op_%s)',
                           o.name, o.l, o.r, n);
        END IF;
    END LOOP;
    FOR o IN
        SELECT p.proname, p.pronargs, p.proretset, pg_get_function_arguments(p.oid) AS args,
               pg_get_function_result(p.oid) AS result, p.oid::regprocedure::text AS signature
          FROM pg_proc p
         WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.prokind = 'f' AND p.proname = ANY(%(names)s)
           AND NOT EXISTS (SELECT FROM pg_type t WHERE t.typtype = 'p'
                           AND t.oid = ANY(array_append(coalesce(p.proallargtypes, p.proargtypes::oid[]), p.prorettype)))
           AND (p.proallargtypes IS NULL OR p.proretset)
    LOOP
        EXECUTE format('CREATE FUNCTION public.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L', o.proname, o.args, o.result,
            format('BEGIN PERFORM public.planted(%L); %s pg_catalog.%I(%s); END', o.signature,
                   CASE WHEN o.proretset THEN 'RETURN QUERY SELECT * FROM' ELSE 'RETURN' END, o.proname,
                   (SELECT string_agg('$' || i, ', ') FROM generate_series(1, o.pronargs) i)));
    END LOOP;
END
$plant$;
"""


def planted_runs(fleet):
    """How many times something planted ran (the sequence survives rollbacks), and what (the
    table; rolled back with a failed call)."""
    with fleet.connect(options="-c search_path=pg_catalog") as c:
        ran = [what for (what,) in c.execute("SELECT what FROM public.planted_ran")]
        count = c.execute("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM public.planted_calls").fetchone()[0]
        c.execute("TRUNCATE public.planted_ran; SELECT setval('public.planted_calls', 1, false)")
    return count, ran


def test_objects_the_database_owner_plants_never_run_in_a_superusers_call(partition_clusters, new_role):
    owner = new_role("dbowner")
    hostile = make_fleet(partition_clusters, 2, router=unique("rl_router_hostile"), version="0.3.0", owner=owner)
    names = sorted(set(re.findall(r"([a-z_][a-z_0-9]*)\s*\(", "\n".join(
        open(os.path.join(PROXY_DIR, f)).read() for f in ("rate_limiter_proxy--0.4.0.sql", "rate_limiter_proxy--0.3.0--0.4.0.sql",
                                                          "rate_limiter_proxy--0.4.0--0.5.0.sql",
                                                          "rate_limiter_proxy--0.5.0--0.6.0.sql",
                                                          "rate_limiter_proxy--0.6.0--0.7.0.sql",
                                                          "rate_limiter_proxy--0.7.0--0.8.0.sql")))))
    with hostile.connect(user=owner) as c:
        c.execute(PLANT.replace("%(names)s", "ARRAY[" + ", ".join(f"'{n}'" for n in names) + "]"))
        c.execute(f"ALTER DATABASE {hostile.router} SET search_path = public, pg_catalog")
    single, spread, inline = unique("single"), unique("spread"), unique("inline")
    with hostile.connect() as c:
        keys = c.execute("SELECT k, rate_limiter_proxy.partition_of(k) FROM (SELECT 'user-' || i AS k "
                         "FROM generate_series(1, 20) i) s").fetchall()
    apart = [next(k for k, p in keys if p == 0), next(k for k, p in keys if p == 1)]
    assert planted_runs(hostile)[0] > 0, "the plant works: 0.3.0's partition_of ran it"

    def calls(c):
        """Every router function, each path a superuser may take (the SQL names no operator)."""
        c.execute(f"SELECT rate_limiter_proxy.define('{single}', 'fixed window', 100, '1 hour')")
        c.execute(f"SELECT rate_limiter_proxy.define('{spread}', 'token bucket', 100, '1 hour', capacity => 50, shards => 4)")
        c.execute(f"SELECT * FROM rate_limiter_proxy.rate_limit('{spread}')")  # remaining * spread
        c.execute(f"SELECT * FROM rate_limiter_proxy.rate_limit('{single}', 'alice')")
        c.execute(f"SELECT * FROM rate_limiter_proxy.check_rate_limit('{spread}', 'bob')")
        c.execute(f"SELECT * FROM rate_limiter_proxy.wait_rate_limit('{single}', 'carol', timeout => '1 second')")
        config = json.dumps({**HOUR_WINDOW, "rate": 8, "shards": 2})
        c.execute(f"SELECT * FROM rate_limiter_proxy.rate_limit('{inline}', 'dave', config => '{config}')")
        requests = json.dumps([{"name": spread}, {"name": single, "key": "erin"}, {"name": inline, "config": json.loads(config)}])
        c.execute(f"SELECT * FROM rate_limiter_proxy.rate_limit_all('{requests}')")
        c.execute(f"SELECT * FROM rate_limiter_proxy.check_rate_limit_all('{requests}')")
        c.execute(f"SELECT * FROM rate_limiter_proxy.rate_limit_value('{spread}')")
        c.execute(f"SELECT * FROM rate_limiter_proxy.rate_limit_value('{inline}', config => '{config}')")
        c.execute(f"SELECT rate_limiter_proxy.block('{single}', 'frank')")
        assert c.execute(f"SELECT rate_limiter_proxy.unblock('{single}', 'frank')").fetchone() == (True,)
        c.execute(f"SELECT rate_limiter_proxy.reset_rate_limit('{single}', 'alice')")
        c.execute("SELECT rate_limiter_proxy.redefine_all()")
        c.execute("SELECT rate_limiter_proxy.partitions(), rate_limiter_proxy.partition_of('alice')")
        # The errors, raised again by _raise_again.
        once = json.dumps({**HOUR_WINDOW, "rate": 1})
        c.execute(f"SELECT * FROM rate_limiter_proxy.rate_limit('{inline}', 'gina', config => '{once}')")
        with pytest.raises(psycopg.Error) as denied:
            c.execute(f"SELECT rate_limiter_proxy.rate_limit('{inline}', 'gina', throws => true, config => '{once}')")
        assert denied.value.diag.sqlstate == "RL429"
        with pytest.raises(errors.InvalidParameterValue):
            c.execute(f"SELECT rate_limiter_proxy.define('{single}', 'fixed window', 1, '1 hour', shards => 3)")
        with pytest.raises(errors.FeatureNotSupported):
            c.execute("SELECT rate_limiter_proxy.rate_limit_all('" + json.dumps(
                [{"name": single, "key": apart[0]}, {"name": single, "key": apart[1]}]) + "')")

    def plans(c):
        """The router functions since 0.7.0: overrides and tiers, and their refusal of a spread
        limit."""
        c.execute(f"SELECT rate_limiter_proxy.define_tier('{single}', 'pro', rate => 200)")
        c.execute(f"SELECT rate_limiter_proxy.override('{single}', 'alice', tier => 'pro')")
        assert c.execute(f"SELECT rate_limiter_proxy.remove_override('{single}', 'alice')").fetchone() == (True,)
        assert c.execute(f"SELECT rate_limiter_proxy.remove_tier('{single}', 'pro')").fetchone() == (True,)
        with pytest.raises(errors.FeatureNotSupported):
            c.execute(f"SELECT rate_limiter_proxy.override('{spread}', 'alice', rate => 1)")

    with hostile.connect() as c:
        assert c.execute("SHOW search_path").fetchone() == ("public, pg_catalog",)
        calls(c)
        count, ran = planted_runs(hostile)
        assert count > 0 and "*(double precision, integer)" in ran, "0.3.0 ran them as the superuser"
        c.execute("ALTER EXTENSION rate_limiter_proxy UPDATE")
        assert planted_runs(hostile) == (0, []), "the update script ran them"
    with hostile.connect() as c:
        calls(c)
        plans(c)
        assert planted_runs(hostile) == (0, [])
        c.execute("DROP EXTENSION rate_limiter_proxy")
        c.execute("CREATE EXTENSION rate_limiter_proxy")
        assert planted_runs(hostile) == (0, []), "the install script ran them"
    with hostile.connect() as c:
        calls(c)
        assert planted_runs(hostile) == (0, [])


# Text of PL/Proxy's error prefixes, in names and keys.
MARKERS = [
    "x] REMOTE FATAL: y",
    "rate_limiter_proxy._rate_limit(7): [fleet2] REMOTE FATAL: z",
    "PL/Proxy function rate_limiter_proxy._rate_limit(7): [fleet2] PQconnectPoll: down",
    "server closed the connection unexpectedly] REMOTE PANIC: query timeout",
]


def test_names_and_keys_with_pl_proxy_markers_get_the_partitions_errors(fleet2):
    key = "k] REMOTE FATAL: Remote detail: PL/Proxy function x(1): query timeout"
    config = json.dumps({**HOUR_WINDOW, "rate": 1})
    call = "SELECT rate_limiter_proxy.rate_limit(%s, %s, throws => true, config => %s)"
    with fleet2.connect() as c:
        owner = c.execute("SELECT rate_limiter_proxy.partition_of(%s)", (key,)).fetchone()[0]
        for marker in MARKERS:
            name = f"{unique('m')} {marker}"
            c.execute(call, (name, key, config))
            with pytest.raises(psycopg.Error) as routed:
                c.execute(call, (name, key, config))
            with fleet2.on_partition(owner) as p, pytest.raises(psycopg.Error) as direct:
                p.execute(call.replace("rate_limiter_proxy.", "rate_limiter."), (name, key, config))
            for error in (routed, direct):
                diag = error.value.diag
                assert diag.sqlstate == "RL429", diag.message_primary
                assert diag.message_primary == f'rate limit "{name}" exceeded'
                assert re.fullmatch(r"Retry after [0-9.]+ ms\.", diag.message_hint)
            routed_detail, direct_detail = (json.loads(e.value.diag.message_detail) for e in (routed, direct))
            assert abs(routed_detail.pop("retryAfter") - direct_detail.pop("retryAfter")) < 5000
            assert routed_detail == direct_detail and (routed_detail["name"], routed_detail["key"]) == (name, key)
            # Another error of the partition whose message quotes the caller's text.
            bad = json.dumps({"kind": marker, "rate": 1, "period": 1000})
            with pytest.raises(errors.InvalidParameterValue) as routed:
                c.execute(call, (name, key, bad))
            with fleet2.on_partition(owner) as p, pytest.raises(errors.InvalidParameterValue) as direct:
                p.execute(call.replace("rate_limiter_proxy.", "rate_limiter."), (name, key, bad))
            assert ((routed.value.diag.message_primary, routed.value.diag.message_detail, routed.value.diag.message_hint)
                    == (direct.value.diag.message_primary, direct.value.diag.message_detail, direct.value.diag.message_hint))
            assert marker in routed.value.diag.message_primary


def test_updating_0_3_0_gives_the_catalog_of_a_fresh_install_and_keeps_limits_and_grants(new_role):
    fresh, updated, granted, app = (unique("rl_router_fresh"), unique("rl_router_updated"), unique("rl_router_granted"),
                                    new_role("app"))
    # Issue 41: objects an install or update creates get no grant from default privileges
    # (0.5.0 created define() again, and the lease calls, under them).
    intruder = new_role("intruder")
    everyone = ("SELECT bool_and(has_function_privilege('public', p.oid, 'EXECUTE')) FROM pg_proc p "
                "WHERE p.pronamespace = 'rate_limiter_proxy'::regnamespace")
    with psycopg.connect(autocommit=True) as admin:
        for test_conn in (fresh, updated, granted):
            admin.execute(f"CREATE DATABASE {test_conn}")
    try:
        with psycopg.connect(dbname=fresh, autocommit=True) as f, psycopg.connect(dbname=updated, autocommit=True) as u:
            f.execute("CREATE EXTENSION rate_limiter_proxy CASCADE")
            u.execute("CREATE EXTENSION rate_limiter_proxy VERSION '0.3.0' CASCADE")
            assert u.execute(everyone).fetchone() == (True,), "0.3.0 let PUBLIC execute everything"
            u.execute("INSERT INTO rate_limiter_proxy.limits (name, kind, rate, period, shards, partitions) "
                      "VALUES ('kept', 'token bucket', 10, '1 second', 4, 2)")
            u.execute("ALTER EXTENSION rate_limiter_proxy UPDATE")
            assert u.execute("SELECT name, rate, shards FROM rate_limiter_proxy.limits").fetchall() == [("kept", 10, 4)]
            catalog = catalog_of(f, "rate_limiter_proxy")
            assert catalog_of(u, "rate_limiter_proxy") == catalog
            assert {row[0] for row in catalog} == {"function", "relation", "type", "column", "index", "constraint",
                                                  "member", "initial privileges", "extension"}
            assert ("extension", "rate_limiter_proxy") in {row[:2] for row in catalog}
            assert u.execute(everyone).fetchone() == (False,)
            f.execute("DROP EXTENSION rate_limiter_proxy")
            default_privileges(f, intruder)
            f.execute("CREATE EXTENSION rate_limiter_proxy")
            assert granted_to(f, "rate_limiter_proxy", intruder) == []
        with psycopg.connect(dbname=granted, autocommit=True) as g:
            g.execute("CREATE EXTENSION rate_limiter_proxy VERSION '0.3.0' CASCADE")
            g.execute(f"GRANT EXECUTE ON FUNCTION rate_limiter_proxy.rate_limit TO {app}")
            g.execute("ALTER EXTENSION rate_limiter_proxy UPDATE TO '0.4.0'")
            g.execute(f"GRANT EXECUTE ON FUNCTION rate_limiter_proxy.define TO {app}")
            default_privileges(g, intruder, schema="rate_limiter_proxy")
            g.execute("ALTER EXTENSION rate_limiter_proxy UPDATE")
            assert granted_to(g, "rate_limiter_proxy", intruder) == []
            assert g.execute(f"SELECT has_function_privilege('{app}', 'rate_limiter_proxy.define(text, text, float8, interval, "
                             "float8, float8, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, "
                             "boolean, text, boolean)', 'EXECUTE')").fetchone() == (True,), "define, created again in 0.6.0, kept its grant"
            assert g.execute(f"SELECT has_function_privilege('{app}', 'rate_limiter_proxy.rate_limit(text, text, float8, "
                             "boolean, boolean, jsonb)', 'EXECUTE')").fetchone() == (True,), "the update kept a grant"
            assert g.execute(everyone).fetchone() == (False,)
    finally:
        with psycopg.connect(autocommit=True) as admin:
            for test_conn in (fresh, updated, granted):
                admin.execute(f"DROP DATABASE IF EXISTS {test_conn} WITH (FORCE)")


def test_a_schema_made_before_create_extension_by_another_role_is_refused(new_role):
    owner = new_role("dbowner")
    router = unique("rl_router_squatted")
    with psycopg.connect(autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {router} OWNER {owner}")
    with psycopg.connect(dbname=router, user=owner, autocommit=True) as c:
        # Its owner could drop the router's functions and put its own in their place.
        c.execute("CREATE SCHEMA rate_limiter_proxy")
    with psycopg.connect(dbname=router, autocommit=True) as c:
        with pytest.raises(errors.InsufficientPrivilege) as refused:
            c.execute("CREATE EXTENSION rate_limiter_proxy CASCADE")
        assert "ALTER SCHEMA rate_limiter_proxy OWNER TO" in refused.value.diag.message_hint
        assert c.execute("SELECT count(*) FROM pg_proc WHERE pronamespace = 'rate_limiter_proxy'::regnamespace").fetchone() == (0,)
