"""rate_limiter_proxy: a PL/Proxy router on the test command's cluster in front of 2 and 4
partition clusters of its own, each a separate PostgreSQL on a socket in /tmp."""

import json
import uuid

import psycopg
import pytest
from psycopg import errors

from clusters import Cluster
from together import in_sessions

PARTITION_PORTS = [5620, 5621, 5622, 5623]
HOUR_WINDOW = {"kind": "fixed window", "period": 3600000}


class Fleet:
    """A router database whose PL/Proxy cluster rate_limiter is the database `dbname` on the
    first `size` partition clusters."""

    def __init__(self, router, partitions, dbname):
        self.router, self.partitions, self.dbname = router, partitions, dbname

    def connect(self):
        return psycopg.connect(dbname=self.router, autocommit=True)

    def on_partition(self, i):
        return self.partitions[i].connect(self.dbname)


@pytest.fixture(scope="module")
def partition_clusters():
    made = [Cluster(f"partition{i}_{uuid.uuid4().hex[:6]}", port).init().start()
            for i, port in enumerate(PARTITION_PORTS)]
    try:
        for cluster in made:
            with cluster.connect() as c:
                for db in ("fleet2", "fleet4"):
                    c.execute(f"CREATE DATABASE {db}")
                    with cluster.connect(db) as d:
                        d.execute("CREATE EXTENSION rate_limiter")
        yield made
    finally:
        for cluster in made:
            cluster.destroy()


def make_fleet(partition_clusters, size, router=None):
    router, dbname = router or f"rl_router{size}", f"fleet{size}"
    partitions = partition_clusters[:size]
    options = ", ".join(f"p{i} '{p.conninfo(dbname)}'" for i, p in enumerate(partitions))
    with psycopg.connect(autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {router} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {router}")
    with psycopg.connect(dbname=router, autocommit=True) as c:
        c.execute("CREATE EXTENSION rate_limiter_proxy CASCADE")
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
            counts.append(c.execute("SELECT count(*) FROM rate_limiter.state WHERE name = %s", (name,)).fetchone()[0])
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
            assert c.execute("SELECT count(*) FROM rate_limiter.state WHERE name = %s AND key = %s",
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


def test_a_spread_limit_waits_for_redefine_all_after_the_partitions_change(partition_clusters):
    grown = make_fleet(partition_clusters, 2, router="rl_router_grown")
    name = unique("grown")
    call = "SELECT ok FROM rate_limiter_proxy.rate_limit(%s)"
    with grown.connect() as c:
        c.execute("SELECT rate_limiter_proxy.define(%s, 'fixed window', 40, '1 hour', shards => 4)", (name,))
        assert c.execute(call, (name,)).fetchone()[0]
        # Partitions 2 and 3 join as copies would: still holding the shares of 2 partitions,
        # which over 4 would add up to twice the limit.
        for i in (2, 3):
            with partition_clusters[i].connect("fleet2") as p:
                p.execute("SELECT rate_limiter.define(%s, 'fixed window', 20, '1 hour', shards => 2)", (name,))
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


ROUTED = ("rate_limit", "check_rate_limit", "wait_rate_limit", "rate_limit_all", "check_rate_limit_all",
          "rate_limit_value", "reset_rate_limit", "define", "block", "unblock")
# What the README says stays on each partition; anything new in rate_limiter must be routed
# or listed here.
PARTITION_ONLY = {"http_headers", "http_headers_all", "prune", "stats_reset"}
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
        assert diag.message_hint == f"Retry after {detail['retryAfter']} ms."
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
            held.append([v for (v,) in c.execute("SELECT value FROM rate_limiter.state WHERE name = %s", (spread,))])
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
        assert c.execute("SELECT count(*) FROM rate_limiter.state WHERE name = %s AND key = %s",
                         (name, down_key)).fetchone()[0] == 1
