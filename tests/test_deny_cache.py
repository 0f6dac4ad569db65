"""The deny cache: denials answered from shared memory for at most a limit's deny_cache.

Runs on the test command's cluster, which preloads the library. A cached denial is told
apart from a read one by changing the state row behind the limiter's back (as superuser):
the cache keeps denying, a read sees the tokens.
"""

import psycopg
import pytest

from calls import define, limit
from clusters import every_version

NOW = "2030-01-01 00:00:00+00"

# Shared memory and the hooks that empty it differ by server version.
pytestmark = every_version


def refill(conn, name):
    conn.execute("UPDATE rate_limiter.state SET value = 1 WHERE name = %s", (name,))


def at(conn, instant):
    conn.execute(f"SET rate_limiter.fake_now = '{instant}'")


def test_a_denial_is_answered_from_the_cache_until_deny_cache_passes(test_conn, name):
    define(test_conn, name, rate=1, period="1 hour", deny_cache="10 seconds")
    define(test_conn, name + "_plain", rate=1, period="1 hour")
    at(test_conn, NOW)
    for n in (name, name + "_plain"):
        assert limit(test_conn, n, "k")[0]
        assert not limit(test_conn, n, "k")[0]  # read, and for `name` cached
        refill(test_conn, n)
    assert limit(test_conn, name + "_plain", "k")[0]  # without a cache the tokens are seen at once
    d = test_conn.execute("SELECT ok, retry_after, reason, limited_by FROM rate_limiter.rate_limit(%s, 'k')", (name,)).fetchone()
    assert d == (False, 3600000.0, "exhausted", name)
    at(test_conn, "2030-01-01 00:00:09.999+00")
    assert not limit(test_conn, name, "k")[0]
    assert test_conn.execute("SELECT retry_after FROM rate_limiter.rate_limit(%s, 'k')", (name,)).fetchone() == (3590001.0,)
    at(test_conn, "2030-01-01 00:00:10+00")
    assert limit(test_conn, name, "k")[0]  # the cache has expired: the state is read again


def test_other_keys_and_checks_are_not_answered_from_the_cache(test_conn, name):
    define(test_conn, name, rate=1, period="1 hour", deny_cache="1 hour")
    at(test_conn, NOW)
    limit(test_conn, name, "a")
    assert not limit(test_conn, name, "a")[0]
    refill(test_conn, name)
    assert limit(test_conn, name, "b")[0]
    assert test_conn.execute("SELECT ok FROM rate_limiter.check_rate_limit(%s, 'a')", (name,)).fetchone() == (True,)
    assert not limit(test_conn, name, "a")[0]


@pytest.mark.parametrize("change", [
    "SELECT rate_limiter.reset_rate_limit(%(n)s, 'k')",
    "SELECT rate_limiter.define(%(n)s, 'token bucket', 1, '1 hour', deny_cache => '1 hour')",
    "UPDATE rate_limiter.limits SET rate = 1 WHERE name = %(n)s",
    "SELECT rate_limiter.block(NULL, 'someone else')",
])
def test_reset_define_and_block_changes_empty_the_cache(test_conn, name, change):
    define(test_conn, name, rate=1, period="1 hour", deny_cache="1 hour")
    at(test_conn, NOW)
    limit(test_conn, name, "k")
    assert not limit(test_conn, name, "k")[0]
    refill(test_conn, name)
    assert not limit(test_conn, name, "k")[0]
    test_conn.execute(change, {"n": name})
    assert limit(test_conn, name, "k")[0]
    test_conn.execute("DELETE FROM rate_limiter.blocks")


def test_a_reset_or_credit_of_one_key_leaves_the_others_denials(test_conn, name):
    define(test_conn, name, rate=1, period="1 hour", deny_cache="1 hour")
    at(test_conn, NOW)
    for key in ("a", "b"):
        assert limit(test_conn, name, key)[0]
        assert not limit(test_conn, name, key)[0]  # cached
    refill(test_conn, name)
    assert test_conn.execute("SELECT granted FROM rate_limiter.credit(%s, 'a', 1)", (name,)).fetchone() == (0,), \
        "refilled behind the limiter's back: nothing to give"
    test_conn.execute("SELECT rate_limiter.reset_rate_limit(%s, 'a')", (name,))
    assert limit(test_conn, name, "a")[0], "a's denial is forgotten"
    assert not limit(test_conn, name, "b")[0], "b's stays"


def test_a_credit_that_gives_back_empties_the_cache(test_conn, name):
    define(test_conn, name, rate=1, period="1 hour", deny_cache="1 hour")
    at(test_conn, NOW)
    assert limit(test_conn, name, "k")[0]
    assert not limit(test_conn, name, "k")[0]  # cached for an hour
    assert test_conn.execute("SELECT granted FROM rate_limiter.credit(%s, 'k', 1)", (name,)).fetchone() == (-1,)
    assert limit(test_conn, name, "k")[0], "the token given back is seen at once"


def test_a_cached_denial_outlasts_a_rollback_refund_for_at_most_deny_cache(test_cluster, test_conn, name):
    # Denials read committed state, so only tokens taken and then rolled back by the
    # denied transaction itself come back under a cached denial: it stays fail-closed,
    # for at most deny_cache.
    define(test_conn, name, rate=1, period="1 hour", deny_cache="5 seconds")
    with test_cluster.connect(test_conn.info.dbname, autocommit=False) as c:
        at(c, NOW)
        assert limit(c, name, "k")[0]
        assert not limit(c, name, "k")[0]  # cached
        c.rollback()
    at(test_conn, NOW)
    assert test_conn.execute("SELECT ok FROM rate_limiter.check_rate_limit(%s, 'k')", (name,)).fetchone() == (True,)
    assert not limit(test_conn, name, "k")[0]
    at(test_conn, "2030-01-01 00:00:05+00")
    assert limit(test_conn, name, "k")[0]


def test_deny_cache_is_refused_where_it_would_skip_work(test_conn, name):
    for extra, message in ((dict(shards=2), "shards = 1"), (dict(mode="penalize"), "mode 'penalize'"),
                           (dict(mode="partial"), "mode 'partial'")):
        with pytest.raises(psycopg.errors.FeatureNotSupported, match=message):
            define(test_conn, name, rate=1, period="1 hour", deny_cache="1 second", **extra)
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        define(test_conn, name, rate=1, period="1 hour", deny_cache="-1 second")
    cfg = '{"kind": "token bucket", "rate": 1, "period": 1000, "denyCache": "250 ms"}'
    assert test_conn.execute("SELECT effective_config->'denyCache' FROM rate_limiter.rate_limit_value('x', config => %s)",
                      (cfg,)).fetchone() == (250,)


def test_each_database_has_its_own_cached_denials(test_cluster, test_conn, name):
    # The table in shared memory serves the whole cluster: a denial cached for (name, key)
    # in one database must not answer for the same (name, key) in another.
    other = "rl_deny_cache_" + name
    test_conn.execute(f"CREATE DATABASE {other}")
    try:
        with test_cluster.connect(other) as o:
            o.execute("CREATE EXTENSION rate_limiter")
            define(test_conn, name, rate=1, period="1 hour", deny_cache="1 hour")
            define(o, name, rate=1, period="1 hour", deny_cache="1 hour")
            at(test_conn, NOW)
            at(o, NOW)
            limit(test_conn, name, "k")
            assert not limit(test_conn, name, "k")[0]  # cached here
            assert limit(o, name, "k")[0]  # a fresh limit there
    finally:
        test_conn.execute(f"DROP DATABASE {other} WITH (FORCE)")


def test_a_cached_denial_never_outlasts_its_own_retry_after(test_conn, name):
    # deny_cache is an upper bound: a denial is kept only until the call could pass anyway.
    define(test_conn, name, rate=1, period="10 seconds", deny_cache="1 hour")
    at(test_conn, NOW)
    assert limit(test_conn, name, "k")[0]
    assert not limit(test_conn, name, "k")[0]  # cached, retry_after 10 s
    at(test_conn, "2030-01-01 00:00:09.999+00")
    assert not limit(test_conn, name, "k")[0]
    at(test_conn, "2030-01-01 00:00:10+00")
    assert limit(test_conn, name, "k")[0]


def test_a_database_whose_oid_collides_cannot_empty_another_databases_cache(test_cluster, test_conn, name):
    """0.4.0 kept a generation per database OID modulo 1,024: a role with CREATEDB could give
    a new database an OID 1,024 past another's (`CREATE DATABASE ... OID`), and each reset,
    define or credit there emptied the other's cache."""
    here = test_conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0]
    taken = {oid for (oid,) in test_conn.execute("SELECT oid FROM pg_database")}
    colliding = next(here + 1024 * k for k in range(1, 100) if here + 1024 * k not in taken)
    other = "rl_deny_cache_oid_" + name
    test_conn.execute(f"CREATE DATABASE {other} OID = {colliding}")
    try:
        define(test_conn, name, rate=1, period="1 hour", deny_cache="1 hour")
        at(test_conn, NOW)
        assert limit(test_conn, name, "k")[0]
        assert not limit(test_conn, name, "k")[0]  # cached
        refill(test_conn, name)
        with test_cluster.connect(other) as o:
            o.execute("CREATE EXTENSION rate_limiter")
            define(o, name, rate=1, period="1 hour", deny_cache="1 hour")
            o.execute("SELECT rate_limiter.reset_rate_limit(%s, 'k')", (name,))
            o.execute("SELECT rate_limiter.credit(%s, 'k', 1)", (name,))
        assert not limit(test_conn, name, "k")[0], "still answered from this database's cache"
        test_conn.execute("SELECT rate_limiter.define(%s, 'token bucket', 1, '1 hour', deny_cache => '1 hour')", (name,))
        assert limit(test_conn, name, "k")[0], "this database's own change empties it"
    finally:
        test_conn.execute(f"DROP DATABASE IF EXISTS {other} WITH (FORCE)")
