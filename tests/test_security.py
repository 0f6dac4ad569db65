"""Attacks on the extension, written from the attacker's side (README: Security model).

Each attack that plants a function or operator plants traps: every trap bumps a sequence when
it runs as anyone but the attacker (nextval survives a rolled-back transaction) and tries to
make the attacker a superuser. A test fails if a trap ran or the attacker became superuser.
"""

import json
import time
import uuid

import psycopg
import pytest

from clusters import PORTS, Cluster, connect, every_version, wait_for
from traps import plant_trigger_traps, trap_body, trap_counter, trap_runs

INLINE = '{"kind": "token bucket", "rate": 1, "period": "1 hour"}'

# (operator, left, right, result): the ones SQL of the extension's could resolve if a schema
# on its path offered them. Exact-type ones also catch a search_path that lists pg_catalog
# after the attacker's schema; the others win even with pg_catalog first, as in extension
# scripts (float8 > int, float8 < numeric, float8 * int, oid = regprocedure, oid <> int).
TRAPS = [
    ("=", "name", "name", "boolean"), ("=", "text", "text", "boolean"), ("=", "oid", "oid", "boolean"),
    ("=", "integer", "integer", "boolean"), ("=", "tid", "tid", "boolean"), ("=", "smallint", "smallint", "boolean"),
    ("<>", "text", "text", "boolean"), ("<>", "oid", "integer", "boolean"), ("<>", "oid", "oid", "boolean"),
    ("=", "oid", "regprocedure", "boolean"), ("=", "double precision", "integer", "boolean"),
    ("<=", "timestamptz", "timestamptz", "boolean"), ("<", "timestamptz", "timestamptz", "boolean"),
    (">", "double precision", "integer", "boolean"), (">=", "double precision", "integer", "boolean"),
    ("<", "double precision", "numeric", "boolean"), ("<", "double precision", "double precision", "boolean"),
    (">", "interval", "interval", "boolean"), (">=", "interval", "interval", "boolean"),
    (">=", "integer", "integer", "boolean"), ("<=", "integer", "integer", "boolean"),
    ("<=", "integer", "bigint", "boolean"), (">=", "smallint", "integer", "boolean"),
    ("*", "double precision", "integer", "double precision"), ("-", "double precision", "double precision", "double precision"),
    ("+", "double precision", "double precision", "double precision"), ("/", "double precision", "double precision", "double precision"),
]


def plant(conn, schema, attacker):
    """The attacker (conn's role) plants TRAPS in `schema`; returns the sequence they bump."""
    counter = trap_counter(conn, schema, f"trap_runs_{uuid.uuid4().hex[:6]}")
    for i, (op, left, right, result) in enumerate(TRAPS):
        conn.execute(f"CREATE FUNCTION {schema}.trap_{i}(a {left}, b {right}) RETURNS {result} "
                     f"LANGUAGE plpgsql SET search_path = pg_catalog AS {trap_body(attacker, counter, 'NULL')}")
        conn.execute(f"GRANT EXECUTE ON FUNCTION {schema}.trap_{i}({left}, {right}) TO PUBLIC")
        conn.execute(f"CREATE OPERATOR {schema}.{op} (LEFTARG = {left}, RIGHTARG = {right}, FUNCTION = {schema}.trap_{i})")
    return counter


def is_superuser(conn, role):
    # Qualified: the attacker's operators may be on this session's path.
    return conn.execute("SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) %s",
                        (role,)).fetchone()[0]


@pytest.fixture
def attacker():
    """A role that may log in, nothing more; dropped with what it owns everywhere."""
    role = "attacker_" + uuid.uuid4().hex[:8]
    with connect(dbname="postgres") as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
    yield role
    with connect(dbname="postgres") as admin:
        for (test_conn,) in admin.execute("SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate").fetchall():
            try:
                with connect(dbname=test_conn) as c:
                    c.execute(f"DROP OWNED BY {role} CASCADE")
            except psycopg.OperationalError:
                pass  # dropped meanwhile by another test, with what the role owned there
        admin.execute(f"DROP ROLE {role}")


@pytest.fixture
def empty_database():
    """A fresh database on the test command's cluster, without the extension."""
    name = "rl_sec_" + uuid.uuid4().hex[:8]
    with connect(dbname="postgres") as admin:
        admin.execute(f"CREATE DATABASE {name}")
        try:
            yield name
        finally:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


# --- The prune worker: a superuser in every database ---------------------------------------

@pytest.fixture(scope="module")
def preloading():
    """A cluster that preloads the library: the prune worker every second, a small room for
    statistics names, and a deny cache."""
    cluster = Cluster(f"security_{uuid.uuid4().hex[:6]}", PORTS["security"], [
        "-c shared_preload_libraries=rate_limiter", "-c rate_limiter.prune_interval=1s",
        "-c rate_limiter.stats_max_names=30", "-c rate_limiter.stats_max_names_per_database=10"]).init().start()
    yield cluster
    cluster.destroy()


def as_role(cluster, role, dbname):
    return cluster.connect(dbname, user=role)


def expired_rows(conn, n, name="old"):
    conn.execute("SET rate_limiter.fake_now = '2020-01-01'")
    conn.execute("SELECT count(*) FROM generate_series(1, %s) g, LATERAL rate_limiter.rate_limit(%s, g::text, config => %s)",
                 (n, name, INLINE))
    conn.execute("RESET rate_limiter.fake_now")


def wait_three_prune_intervals():
    time.sleep(3.5)


def test_a_createdb_role_with_planted_operators_and_search_path_never_becomes_superuser_through_the_worker(preloading):
    tenant = "tenant_" + uuid.uuid4().hex[:6]
    with preloading.connect() as admin:
        admin.execute(f"CREATE ROLE {tenant} LOGIN CREATEDB")
    # The tenant's own databases: one with the extension (a superuser installed it there),
    # one without; the worker visits both.
    for test_conn, with_extension in ((f"{tenant}_db", True), (f"{tenant}_plain", False)):
        with as_role(preloading, tenant, "postgres") as t:
            t.execute(f"CREATE DATABASE {test_conn}")
        if with_extension:
            with preloading.connect(test_conn) as admin:
                admin.execute("CREATE EXTENSION rate_limiter")
                expired_rows(admin, 50)
        with as_role(preloading, tenant, test_conn) as t:
            t.execute("CREATE SCHEMA evil")
            counter = plant(t, "evil", tenant)
            t.execute(f"ALTER DATABASE {test_conn} SET search_path = evil, public, pg_catalog")
            t.execute(f"ALTER ROLE {tenant} IN DATABASE {test_conn} SET search_path = evil, pg_catalog")
        wait_three_prune_intervals()
        with preloading.connect(test_conn) as admin:
            admin.execute("SET search_path = pg_catalog")
            assert trap_runs(admin, counter) == 0, f"a planted operator ran as a superuser in {test_conn}"
            assert not is_superuser(admin, tenant)
            if with_extension:
                # The worker did visit: it pruned the expired rows under the hostile search_path.
                wait_for(lambda: admin.execute("SELECT count(*) FROM rate_limiter.state").fetchone() == (0,),
                         "the worker to prune", timeout=30, detail=preloading.log)
                assert trap_runs(admin, counter) == 0


def test_a_renamed_schema_and_its_look_alike_are_never_used(preloading):
    """A role given the extension's schema (as a trusted install would) renames it away and
    puts a look-alike in its place: the worker ignores it and calls refuse to run."""
    tenant = "tenant_" + uuid.uuid4().hex[:6]
    test_conn = f"{tenant}_db"
    with preloading.connect() as admin:
        admin.execute(f"CREATE ROLE {tenant} LOGIN")
        admin.execute(f"CREATE DATABASE {test_conn} OWNER {tenant}")
    with preloading.connect(test_conn) as admin:
        admin.execute("CREATE EXTENSION rate_limiter")
        admin.execute("SELECT rate_limiter.define('l', 'token bucket', 1, '1 hour')")
        admin.execute(f"ALTER SCHEMA rate_limiter OWNER TO {tenant}")
    with as_role(preloading, tenant, test_conn) as t:
        t.execute("ALTER SCHEMA rate_limiter RENAME TO real_rl")
        t.execute("CREATE SCHEMA rate_limiter")
        counter = plant(t, "rate_limiter", tenant)
        t.execute(f"""CREATE FUNCTION rate_limiter.prune(max_rows integer DEFAULT 10000) RETURNS bigint
                      LANGUAGE sql AS $$ SELECT pg_catalog.nextval('{counter}') $$""")
        t.execute("CREATE TABLE rate_limiter.state (name text COLLATE \"C\" NOT NULL, key text COLLATE \"C\", "
                  "shard smallint NOT NULL, value float8 NOT NULL, ts timestamptz NOT NULL, expires timestamptz NOT NULL, "
                  "counts float8[], granted_at timestamptz, "
                  "CONSTRAINT state_key_name_shard_key UNIQUE NULLS NOT DISTINCT (key, name, shard))")
        t.execute("CREATE TABLE rate_limiter.limits (name text PRIMARY KEY, kind text, rate float8)")
        t.execute("GRANT ALL ON ALL TABLES IN SCHEMA rate_limiter TO PUBLIC")
    wait_three_prune_intervals()
    with preloading.connect(test_conn) as admin:
        assert trap_runs(admin, counter) == 0
        assert not is_superuser(admin, tenant)
        # The real schema is the tenant's: the extension refuses to run until it is given back.
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f'owned by role "{tenant}"'):
            admin.execute("SELECT * FROM real_rl.rate_limit('l', 'k')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            admin.execute("SELECT real_rl.define('l', 'token bucket', 5, '1 hour')")
        admin.execute("ALTER SCHEMA real_rl OWNER TO postgres")
        # Found through pg_extension, not by name: the look-alike is never read or written.
        assert admin.execute("SELECT ok, remaining FROM real_rl.rate_limit('l', 'k')").fetchone() == (True, 0)
        admin.execute("SELECT real_rl.define('l2', 'token bucket', 5, '1 hour')")
        assert admin.execute("SELECT count(*) FROM real_rl.state").fetchone() == (1,)
        assert admin.execute("SELECT count(*) FROM rate_limiter.state").fetchone() == (0,)
        assert admin.execute("SELECT count(*) FROM rate_limiter.limits").fetchone() == (0,)
        assert admin.execute("SELECT real_rl.prune()").fetchone() == (0,)
        assert trap_runs(admin, counter) == 0
        # A table that is not a member of the extension is refused, 55000 (a new session:
        # membership is read when a session first looks the tables up).
        admin.execute("ALTER EXTENSION rate_limiter DROP TABLE real_rl.blocks")
        with preloading.connect(test_conn) as fresh:
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="not an object of the extension"):
                fresh.execute("SELECT * FROM real_rl.rate_limit('l', 'k')")
        admin.execute("ALTER EXTENSION rate_limiter ADD TABLE real_rl.blocks")


# --- Install and update scripts: run as a superuser in the extension's schema --------------

def test_create_extension_refuses_a_schema_another_role_owns_and_runs_none_of_its_operators(empty_database, attacker):
    with connect(dbname=empty_database) as admin:
        role = attacker
        admin.execute(f"GRANT CREATE ON DATABASE {empty_database} TO {role}")
        with connect(dbname=empty_database, user=role) as t:
            t.execute("CREATE SCHEMA rate_limiter")
            counter = plant(t, "rate_limiter", role)
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="schema rate_limiter is owned by role"):
            admin.execute("CREATE EXTENSION rate_limiter")
        assert trap_runs(admin, counter) == 0
        assert not is_superuser(admin, role)


def test_a_role_that_may_create_in_the_schema_takes_over_neither_the_install_nor_any_function(empty_database, attacker):
    with connect(dbname=empty_database) as admin:
        role = attacker
        admin.execute("CREATE SCHEMA rate_limiter")
        admin.execute(f"GRANT USAGE, CREATE ON SCHEMA rate_limiter TO {role}")
        with connect(dbname=empty_database, user=role) as t:
            counter = plant(t, "rate_limiter", role)
        admin.execute("CREATE EXTENSION rate_limiter")
        # Everything a superuser may call, under the schema's search_path.
        admin.execute("SET search_path = rate_limiter, public")
        admin.execute("SELECT rate_limiter.define('l', 'token bucket', 1, '1 hour', capacity => 2, max_reserved => 1)")
        admin.execute("UPDATE rate_limiter.limits SET rate = 2 WHERE name = 'l'")
        for call in ("rate_limiter.rate_limit('l', 'k')", "rate_limiter.check_rate_limit('l', 'k')",
                     "rate_limiter.rate_limit_all('[{\"name\": \"l\", \"key\": \"j\"}]')",
                     "rate_limiter.wait_rate_limit('l', 'k', timeout => '0')",
                     "rate_limiter.block('l', 'bad', 'infinity', 'x')", "rate_limiter.unblock('l', 'bad')",
                     "rate_limiter.block(NULL, 'gone', '2000-01-01')", "rate_limiter.reset_rate_limit('l', 'k')",
                     "rate_limiter.prune()", "rate_limiter.rate_limit_value('l', 'j')", "rate_limiter.stats_reset('l')"):
            admin.execute(f"SELECT * FROM {call}")
        assert trap_runs(admin, counter) == 0
        assert not is_superuser(admin, role)
        constraints = admin.execute("SELECT string_agg(pg_get_constraintdef(oid), ' ') FROM pg_constraint "
                                    "WHERE connamespace = 'rate_limiter'::regnamespace").fetchone()[0]
        assert "OPERATOR(rate_limiter." not in constraints


@pytest.mark.parametrize("released", ["0.1.0", "0.2.0", "0.3.0", "0.4.0"])
def test_updating_from_each_release_runs_none_of_the_operators_the_schemas_owner_planted(empty_database, attacker, released):
    with connect(dbname=empty_database) as admin:
        role = attacker
        admin.execute(f"CREATE EXTENSION rate_limiter VERSION '{released}'")
        admin.execute("INSERT INTO rate_limiter.limits (name, kind, rate, period) VALUES ('kept', 'token bucket', 10, '1 second')")
        if released in ("0.3.0", "0.4.0"):
            admin.execute("INSERT INTO rate_limiter.state VALUES ('kept', 'k', 0, 3, '2030-01-01', '2030-01-01 00:00:01.7')")
        else:
            admin.execute("INSERT INTO rate_limiter.state VALUES ('kept', 'k', 0, 3, '2030-01-01')")
        # A grantee on define(), so that the update's grant-keeping code runs too.
        admin.execute(f"GRANT EXECUTE ON FUNCTION rate_limiter.define TO {role}")
        # The schema is handed to a role that is not a superuser, as a trusted install would.
        admin.execute(f"ALTER SCHEMA rate_limiter OWNER TO {role}")
        with connect(dbname=empty_database, user=role) as t:
            counter = plant(t, "rate_limiter", role)
        admin.execute("ALTER EXTENSION rate_limiter UPDATE")
        assert trap_runs(admin, counter) == 0
        assert not is_superuser(admin, role)
        # Until the schema is given back, nothing of the extension runs.
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="schema rate_limiter is owned by role"):
            admin.execute("SELECT rate_limiter.define('new', 'token bucket', 1, '1 second')")
        admin.execute("ALTER SCHEMA rate_limiter OWNER TO postgres")
        admin.execute("SELECT rate_limiter.define('new', 'token bucket', 1, '1 second')")
        admin.execute("SET rate_limiter.fake_now = '2030-01-01'")
        assert admin.execute("SELECT ok, remaining FROM rate_limiter.rate_limit('kept', 'k')").fetchone() == (True, 2)
        assert trap_runs(admin, counter) == 0
        assert admin.execute("SELECT has_function_privilege(%s, 'rate_limiter.define(text, text, float8, interval, "
                             "float8, float8, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, boolean, text, boolean)', "
                             "'EXECUTE')", (role,)).fetchone() == (True,)


def test_updating_from_020_keeps_the_grants_of_a_role_whose_name_needs_quoting(empty_database):
    role = f"App-User-{uuid.uuid4().hex[:6]}"
    with connect(dbname=empty_database) as admin:
        admin.execute(f'CREATE ROLE "{role}"')
        try:
            admin.execute("CREATE EXTENSION rate_limiter VERSION '0.2.0'")
            admin.execute(f'GRANT EXECUTE ON FUNCTION rate_limiter.define TO "{role}"')
            admin.execute("ALTER EXTENSION rate_limiter UPDATE")
            assert admin.execute("SELECT extversion FROM pg_extension WHERE extname = 'rate_limiter'").fetchone() == ("0.8.0",)
            assert admin.execute("SELECT has_function_privilege(%s, 'rate_limiter.define(text, text, float8, interval, "
                                 "float8, float8, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, boolean, text, boolean)', "
                                 "'EXECUTE')", (role,)).fetchone() == (True,)
        finally:
            admin.execute(f'DROP OWNED BY "{role}"')
            admin.execute(f'DROP ROLE "{role}"')


# --- Bounds no caller can break -------------------------------------------------------------

def test_a_reservation_without_max_reserved_cannot_leave_a_debt_that_never_expires(empty_database):
    with connect(dbname=empty_database) as admin:
        admin.execute("CREATE EXTENSION rate_limiter")
        admin.execute("SELECT rate_limiter.define('b_only', 'token bucket', 10, '1 minute')")
        # The attack of the review: a key owed until infinity, which prune never frees. A
        # count of 1e300 is refused outright since 0.5.0 (counts are at most 1e15); 1e15
        # is more than refills before the last storable instant, so it is denied.
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            admin.execute("SELECT rate_limiter.rate_limit('b_only', 'alice', count => 1e300, reserve => true)")
        ok, retry_after = admin.execute("SELECT ok, retry_after FROM rate_limiter.rate_limit('b_only', 'alice', "
                                        "count => 1e15, reserve => true)").fetchone()
        assert not ok and retry_after < float("inf")
        assert admin.execute("SELECT ok FROM rate_limiter.rate_limit('b_only', 'alice')").fetchone() == (True,)
        # A large reservation still works, and its row expires at a storable instant.
        assert admin.execute("SELECT ok FROM rate_limiter.rate_limit('b_only', 'bob', count => 1e9, reserve => true)"
                             ).fetchone() == (True,)
        assert admin.execute("SELECT count(*) FROM rate_limiter.state WHERE NOT isfinite(expires)").fetchone() == (0,)


def test_rate_limit_all_takes_at_most_1000_limits_and_finds_a_duplicate_among_them(empty_database):
    with connect(dbname=empty_database) as admin:
        admin.execute("CREATE EXTENSION rate_limiter")
        admin.execute("SET statement_timeout = '10s'")
        requests = [{"name": f"n{i}", "key": "k", "config": {"kind": "token bucket", "rate": 1, "period": 1000}}
                    for i in range(1000)]
        assert admin.execute("SELECT ok FROM rate_limiter.check_rate_limit_all(%s)", (psycopg.types.json.Jsonb(requests),)
                             ).fetchone() == (True,)
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="appears twice"):
            admin.execute("SELECT rate_limiter.check_rate_limit_all(%s)",
                          (psycopg.types.json.Jsonb(requests[:-1] + [requests[0]]),))
        many = requests + [{"name": "one more", "config": requests[0]["config"]}]
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="1001 limits, more than 1000"):
            admin.execute("SELECT rate_limiter.rate_limit_all(%s)", (psycopg.types.json.Jsonb(many),))


def test_the_statistics_overflow_name_is_reserved(empty_database):
    with connect(dbname=empty_database) as admin:
        admin.execute("CREATE EXTENSION rate_limiter")
        for call in ("rate_limiter.rate_limit('*other*', 'k', config => %s)",
                     "rate_limiter.define('*other*', 'token bucket', 1, '1 hour')"):
            with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"the name \*other\* is reserved"):
                admin.execute(f"SELECT {call}", (INLINE,) if "%s" in call else ())


# --- Shared memory: one empty_database must not reach another's ----------------------------------

def test_another_database_can_neither_poison_nor_reset_nor_crowd_out_the_statistics(preloading):
    victim, other = (f"stats_{kind}_{uuid.uuid4().hex[:6]}" for kind in ("victim", "attacker"))
    with preloading.connect() as admin:
        for test_conn in (victim, other):
            admin.execute(f"CREATE DATABASE {test_conn}")
            with preloading.connect(test_conn) as c:
                c.execute("CREATE EXTENSION rate_limiter")
                c.execute("SELECT rate_limiter.define('login', 'token bucket', 1, '1 hour')")
    with preloading.connect(victim) as v, preloading.connect(other) as o:
        v.execute("SELECT rate_limiter.rate_limit('login', 'real attacker')")
        v.execute("SELECT rate_limiter.rate_limit('login', 'real attacker')")  # denied: counted
        # The other database denies a fake key under the same name many times ...
        o.execute("SELECT rate_limiter.rate_limit('login', 'fake key')")
        for _ in range(5):
            o.execute("SELECT rate_limiter.rate_limit('login', 'fake key')")
        assert v.execute("SELECT key, denied FROM rate_limiter.top_denied WHERE name = 'login'").fetchall() == [
            ("real attacker", 1)]
        # ... resets the name ...
        assert o.execute("SELECT rate_limiter.stats_reset('login')").fetchone() == (1,)
        assert v.execute("SELECT calls, denied FROM rate_limiter.stats WHERE name = 'login'").fetchone() == (2, 1)
        # ... and generates more names than its share of the room.
        for i in range(25):
            o.execute("SELECT rate_limiter.rate_limit(%s, 'k', config => %s)", (f"gen{i}", INLINE))
        assert o.execute("SELECT count(*) FROM rate_limiter.stats WHERE name <> '*other*'").fetchone() == (10,)
        assert o.execute("SELECT calls FROM rate_limiter.stats WHERE name = '*other*'").fetchone() == (16,)
        v.execute("SELECT rate_limiter.rate_limit('new limit', 'k', config => %s)", (INLINE,))
        assert v.execute("SELECT name, calls FROM rate_limiter.stats ORDER BY name").fetchall() == [
            ("login", 2), ("new limit", 1)]
        assert v.execute("SELECT count(*) FROM rate_limiter.top_denied WHERE key = 'fake key'").fetchone() == (0,)


def test_a_non_superuser_sees_only_its_databases_statistics_and_pg_monitor_sees_every_one(preloading):
    databases = [f"seen_{kind}_{uuid.uuid4().hex[:6]}" for kind in ("a", "b")]
    role, monitor = (f"{kind}_{uuid.uuid4().hex[:6]}" for kind in ("reader", "monitor"))
    with preloading.connect() as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"CREATE ROLE {monitor} LOGIN IN ROLE pg_monitor")
        for test_conn, secret in zip(databases, ("alice@a", "bob@b")):
            admin.execute(f"CREATE DATABASE {test_conn}")
            with preloading.connect(test_conn) as c:
                c.execute("CREATE EXTENSION rate_limiter")
                c.execute(f"SELECT rate_limiter.define('login_{test_conn}', 'token bucket', 1, '1 hour')")
                c.execute(f"SELECT rate_limiter.rate_limit('login_{test_conn}', '{secret}') FROM generate_series(1, 3)")
                c.execute(f"GRANT USAGE ON SCHEMA rate_limiter TO {role}, {monitor}")
                c.execute(f"GRANT SELECT ON rate_limiter.stats, rate_limiter.top_denied TO {role}, {monitor}")
                c.execute(f"GRANT EXECUTE ON FUNCTION rate_limiter._stats(), rate_limiter._top_denied(), "
                          f"rate_limiter.stats_every_database(), rate_limiter.top_denied_every_database() "
                          f"TO {role}, {monitor}")
    try:
        a, b = databases
        with preloading.connect(a, user=role) as c:
            # The views: this database's names and keys only.
            assert c.execute("SELECT name FROM rate_limiter.stats").fetchall() == [(f"login_{a}",)]
            assert c.execute("SELECT key FROM rate_limiter.top_denied").fetchall() == [("alice@a",)]
            # The every-database functions: not even with EXECUTE granted.
            for function in ("stats_every_database", "top_denied_every_database"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege, match="every database") as raised:
                    c.execute(f"SELECT * FROM rate_limiter.{function}()")
                assert "pg_monitor" in raised.value.diag.message_hint
        with preloading.connect(a, user=monitor) as c:
            rows = c.execute("SELECT database, name, calls, denied FROM rate_limiter.stats_every_database() "
                             "WHERE name LIKE 'login_seen_%' ORDER BY database").fetchall()
            assert rows == [(a, f"login_{a}", 3, 2), (b, f"login_{b}", 3, 2)]
            keys = c.execute("SELECT database, key, denied FROM rate_limiter.top_denied_every_database() "
                             "WHERE name LIKE 'login_seen_%' ORDER BY database").fetchall()
            assert keys == [(a, "alice@a", 2), (b, "bob@b", 2)]
    finally:
        with preloading.connect() as admin:
            for test_conn in databases:
                admin.execute(f"DROP DATABASE {test_conn} WITH (FORCE)")
            admin.execute(f"DROP ROLE {role}")
            admin.execute(f"DROP ROLE {monitor}")


def test_a_change_in_one_database_leaves_the_deny_cache_of_another_and_long_pairs_are_never_cached(preloading):
    databases = [f"deny_{kind}_{uuid.uuid4().hex[:6]}" for kind in ("a", "b")]
    with preloading.connect() as admin:
        for test_conn in databases:
            admin.execute(f"CREATE DATABASE {test_conn}")
            with preloading.connect(test_conn) as c:
                c.execute("CREATE EXTENSION rate_limiter")
                c.execute("SELECT rate_limiter.define('l', 'token bucket', 1, '1 hour', deny_cache => '1 hour')")
    long_key = "k" * 200
    with preloading.connect(databases[0]) as a, preloading.connect(databases[1]) as b:
        for key in ("k", long_key):
            assert a.execute("SELECT ok FROM rate_limiter.rate_limit('l', %s)", (key,)).fetchone() == (True,)
            assert a.execute("SELECT ok FROM rate_limiter.rate_limit('l', %s)", (key,)).fetchone() == (False,)
        # Tokens come back behind the limiter's back: a cached denial keeps denying.
        a.execute("UPDATE rate_limiter.state SET value = 1")
        b.execute("SELECT rate_limiter.define('other', 'token bucket', 1, '1 hour')")
        b.execute("SELECT rate_limiter.reset_rate_limit('l', 'k')")
        assert a.execute("SELECT ok FROM rate_limiter.rate_limit('l', 'k')").fetchone() == (False,), \
            "another database's define and reset emptied this database's cache"
        assert a.execute("SELECT ok FROM rate_limiter.rate_limit('l', %s)", (long_key,)).fetchone() == (True,), \
            "a pair longer than a slot holds was cached"
        a.execute("SELECT rate_limiter.define('other', 'token bucket', 1, '1 hour')")
        assert a.execute("SELECT ok FROM rate_limiter.rate_limit('l', 'k')").fetchone() == (True,)


@every_version
def test_a_role_a_trigger_limits_cannot_turn_shadow_mode_on_for_itself(test_cluster, database_name):
    """Shadow mode for a session would let through every call a limit denies: were any role
    able to SET it, a role whose inserts a trigger limits (examples/sql/recipes.sql) could
    turn the limit off for itself. It is a superuser's setting, granted per role."""
    role = "shadow_" + uuid.uuid4().hex[:8]
    with test_cluster.connect(database_name) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute("SELECT rate_limiter.define('posts', 'token bucket', 1, '1 hour')")
        admin.execute("CREATE TABLE public.posts (body text)")
        admin.execute("CREATE FUNCTION public.posts_limited() RETURNS trigger LANGUAGE plpgsql AS $$ "
                      "BEGIN PERFORM rate_limiter.rate_limit('posts', current_user, throws => true); RETURN NEW; END $$")
        admin.execute("CREATE TRIGGER posts_limited BEFORE INSERT ON public.posts FOR EACH ROW EXECUTE FUNCTION public.posts_limited()")
        admin.execute(f"GRANT INSERT ON public.posts TO {role}")
        admin.execute(f"GRANT USAGE ON SCHEMA rate_limiter TO {role}")
        admin.execute(f"GRANT EXECUTE ON FUNCTION rate_limiter.rate_limit TO {role}")
        try:
            with test_cluster.connect(database_name, user=role) as app:
                app.execute("INSERT INTO public.posts VALUES ('one')")
                with pytest.raises(psycopg.errors.InsufficientPrivilege, match="rate_limiter.shadow"):
                    app.execute("SET rate_limiter.shadow = on")
                with pytest.raises(psycopg.Error) as denied:
                    app.execute("INSERT INTO public.posts VALUES ('two')")
                assert denied.value.sqlstate == "RL429"
                # Its own inline config in shadow mode reaches only a state of its own.
                app.execute("""SELECT rate_limiter.rate_limit('posts', current_user, config => '{"kind": "token bucket",
                               "rate": 1, "period": "1 hour", "enforce": false}')""")
                with pytest.raises(psycopg.Error) as denied:
                    app.execute("INSERT INTO public.posts VALUES ('three')")
                assert denied.value.sqlstate == "RL429"
            # Granted, the setting is the role's to use.
            admin.execute(f"GRANT SET ON PARAMETER rate_limiter.shadow TO {role}")
            with test_cluster.connect(database_name, user=role) as app:
                app.execute("SET rate_limiter.shadow = on")
                app.execute("INSERT INTO public.posts VALUES ('four')")
            assert admin.execute("SELECT count(*) FROM public.posts").fetchone() == (2,)
        finally:
            admin.execute(f"REVOKE SET ON PARAMETER rate_limiter.shadow FROM {role}")
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


@every_version
def test_no_caller_can_starve_a_backend_of_time_zones(test_cluster, database_name):
    """Issue 41: a backend counted every spelling of a zone, so 1,000 case variants of
    `europe/berlin` in inline configs spent its 1,000 names, and every limit whose zone it had
    not yet looked up (an administrator's named one included) then failed with 22023. Now a
    zone is counted once whatever its case, zones of the tz database are never refused, nor
    is a named limit's zone; only POSIX-style specs in inline configs are bounded (100 per
    session), and past that bound only they are refused."""

    def config(tz):
        return json.dumps({"kind": "fixed window", "rate": 5, "period": "1 day", "tz": tz})

    def check(c, tz, name="zones"):
        return c.execute("SELECT ok FROM rate_limiter.check_rate_limit(%s, 'k', 1, config => %s::jsonb)",
                         (name, config(tz))).fetchone()[0]

    base = "europe/berlin"
    letters = [i for i, ch in enumerate(base) if ch.isalpha()]
    variants = ["".join(ch.upper() if i in letters and mask >> letters.index(i) & 1 else ch
                        for i, ch in enumerate(base)) for mask in range(1000)]
    with test_cluster.connect(database_name) as c:
        for tz in variants:
            assert check(c, tz)
        c.execute("SELECT rate_limiter.define('admins', 'fixed window', 5, '1 day', tz => 'America/New_York')")
        assert c.execute("SELECT ok FROM rate_limiter.rate_limit('admins', 'k')").fetchone()[0]
        assert check(c, "Asia/Tokyo"), "a zone of the tz database is never refused"
        specs = [f"<+{h:02d}{m:02d}>-{h}:{m:02d}" for h in range(1, 13) for m in range(0, 60, 5)][:100]
        for tz in specs:
            assert check(c, tz)
        with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
            check(c, "<+1259>-12:59")
        assert "POSIX-style" in str(refused.value)
        assert check(c, specs[0]), "a spec the session has loaded is still served"
        assert check(c, "australia/lord_howe"), "still no zone of the tz database refused"
        c.execute("SELECT rate_limiter.define('spec', 'fixed window', 5, '1 day', tz => '<+0130>-1:30')")
        assert c.execute("SELECT ok FROM rate_limiter.rate_limit('spec', 'k')").fetchone()[0], \
            "a named limit's zone is never refused"


# --- Triggers planted on the extension's tables (issue 52, F6) --------------------------------

TABLES = ["limits", "blocks", "allows", "state", "debits", "leases", "memory_snapshot"]
# Where the planted trigger runs the extension's own function (with a WHEN of the planter's).
OWN_FUNCTION_PLANTED = {"limits", "blocks", "memory_snapshot"}


@every_version
def test_no_trigger_a_role_plants_on_the_extensions_tables_runs_with_the_owners_rights(clusters):
    """A role given ALL on the extension's tables (an administrator's GRANT ALL ON ALL TABLES
    IN SCHEMA rate_limiter) has TRIGGER on each: it plants a plain trigger that, run as anyone
    else, counts the run and tries to make it superuser. Every route that writes a table is
    driven (each function, as that role, and both workers): each completes or refuses with
    55000, and no trap runs. Without the triggers every route works again."""
    cluster = clusters("planted", PORTS["planted"], ["-c shared_preload_libraries=rate_limiter",
                                                     "-c rate_limiter.prune_interval=1s",
                                                     "-c rate_limiter.memory_snapshot=200"]).init().start()
    role = "planter_" + uuid.uuid4().hex[:8]
    with cluster.connect() as admin:
        admin.execute("CREATE DATABASE app")
        admin.execute(f"CREATE ROLE {role} LOGIN")
    with cluster.connect("app") as admin:
        admin.execute("CREATE EXTENSION rate_limiter")
        admin.execute(f"CREATE SCHEMA {role} AUTHORIZATION {role}")
        admin.execute(f"GRANT USAGE ON SCHEMA rate_limiter TO {role}")
        admin.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA rate_limiter TO {role}")
        admin.execute(f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA rate_limiter TO {role}")
        for limit in ["'rows', 'token bucket', 10, '1 hour'", "'memory', 'token bucket', 10, '1 hour', durable => false",
                      "'hot', 'token bucket', 10, '1 hour', hot => true", "'slots', 'concurrency', 2, '1 hour'"]:
            admin.execute(f"SELECT rate_limiter.define({limit})")
        admin.execute("SELECT rate_limiter.rate_limit('memory', 'k')")
        lease = admin.execute("SELECT lease_id FROM rate_limiter.acquire('slots', 'k', lease => '1 minute')").fetchone()[0]
        expired_rows(admin, 10)
        admin.execute("SELECT rate_limiter.block('rows', 'gone', now() - interval '1 second')")

    with cluster.connect("app", user=role) as planter:
        runs = plant_trigger_traps(planter, role)

        def plant_on(table):
            if table in OWN_FUNCTION_PLANTED:
                # The extension's own trigger function, BEFORE each row (it would skip the row)
                # and with a WHEN of the planter's (run with the writer's rights).
                planter.execute(f"CREATE TRIGGER planted BEFORE INSERT OR UPDATE OR DELETE ON rate_limiter.{table} "
                                f"FOR EACH ROW WHEN ({role}.when_trap()) EXECUTE FUNCTION rate_limiter._limits_changed()")
            else:
                planter.execute(f"CREATE TRIGGER planted AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE "
                                f"ON rate_limiter.{table} FOR EACH STATEMENT EXECUTE FUNCTION {role}.trap()")

        # The workers first, while calls still work (every call refuses a trigger on state):
        # a memory call gives the snapshot worker a count to write, an ended block the prune
        # worker a row to delete. Each refuses and says so in the log, and tries again.
        for table in TABLES:
            if table != "state":
                plant_on(table)
        planter.execute("SELECT rate_limiter.rate_limit('memory', 'k3')")
        for table in ["memory_snapshot", "blocks"]:
            wait_for(lambda: f'will not write rate_limiter.{table}: it has trigger "planted"' in cluster.log(),
                     f"a worker's refusal to write {table}", timeout=30, detail=cluster.log)
        plant_on("state")
        routes = [
            "SELECT rate_limiter.define('rows', 'token bucket', 20, '1 hour')",
            "SELECT rate_limiter.rate_limit('rows', 'k')",
            "SELECT rate_limiter.rate_limit('memory', 'k2')",
            "SELECT rate_limiter.rate_limit('hot', 'k')",
            "SELECT rate_limiter.credit('rows', 'k')",
            "SELECT rate_limiter.block('rows', 'b')",
            "SELECT rate_limiter.unblock('rows', 'gone')",
            "SELECT rate_limiter.allow('rows', 'a')",
            "SELECT rate_limiter.disallow('rows', 'a')",
            "SELECT rate_limiter.acquire('slots', 'k2', lease => '1 minute')",
            f"SELECT rate_limiter.renew('slots', 'k', '{lease}', '2 minutes')",
            f"SELECT rate_limiter.release('slots', 'k', '{lease}')",
            "SELECT rate_limiter.reset_rate_limit('memory', 'k')",
            "SELECT rate_limiter.reset_rate_limit('rows', 'k')",
            "SELECT rate_limiter.prune()",
            "SELECT rate_limiter.define('memory', 'token bucket', 20, '1 hour', durable => false)",
        ]
        for route in routes:
            try:
                planter.execute(route)
            except psycopg.Error as error:
                assert error.sqlstate == "55000", f"{route}: {error.sqlstate} {error}"
        assert trap_runs(planter, runs) == 0, "a trap ran with another role's rights"
        assert not is_superuser(planter, role)

        # Without them (only the tables' owner may drop them), every route works again: the
        # refusals were the triggers'.
        with cluster.connect("app") as admin:
            for table in TABLES:
                admin.execute(f"DROP TRIGGER planted ON rate_limiter.{table}")
        for route in routes:
            planter.execute(route)
        wait_for(lambda: planter.execute("SELECT count(*) FROM rate_limiter.memory_snapshot").fetchone()[0] > 0,
                 "the snapshot worker to write again", timeout=30)
