"""The extension's life cycle: ALTER EXTENSION rate_limiter UPDATE from every released
version gives the same objects as a fresh install and keeps the limits, the state and the
grants; sessions carry on when the extension is dropped and created again.

scripts/test.sh installs the frozen install scripts of released versions (sql/archive/) next
to the current one, so CREATE EXTENSION ... VERSION '0.1.0' works against the current library.
"""

import datetime
import uuid

import psycopg
import pytest

from calls import amcheck_clean
from catalog import catalog_of, default_privileges, granted_to
from clusters import every_version


@pytest.fixture
def databases(test_cluster):
    names = {kind: f"rl_{kind}_{uuid.uuid4().hex[:8]}" for kind in ("fresh", "upgraded")}
    with test_cluster.connect() as admin:
        for n in names.values():
            admin.execute(f"CREATE DATABASE {n}")
        try:
            yield names
        finally:
            for n in names.values():
                admin.execute(f"DROP DATABASE {n} WITH (FORCE)")


@every_version
@pytest.mark.parametrize("released", ["0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0"])
def test_update_matches_a_fresh_install_and_keeps_data_and_grants(test_cluster, databases, released):
    role, intruder = "app_" + uuid.uuid4().hex[:8], "intruder_" + uuid.uuid4().hex[:8]
    with test_cluster.connect(databases["fresh"]) as fresh, test_cluster.connect(databases["upgraded"]) as old:
        fresh.execute(f"CREATE ROLE {intruder}")
        fresh.execute(f"CREATE ROLE {role}")
        # Issue 41: objects an install or update creates get no grant from default privileges
        # (0.4.0 -> 0.5.0 gave define() and the leases to whoever they named).
        default_privileges(fresh, intruder)
        fresh.execute("CREATE EXTENSION rate_limiter")
        old.execute(f"CREATE EXTENSION rate_limiter VERSION '{released}'")
        old.execute("INSERT INTO rate_limiter.limits (name, kind, rate, period) VALUES ('kept', 'token bucket', 10, '1 second')")
        # Periods of months, which 0.4.0 and before read as 30 days each.
        months = released not in ("0.5.0", "0.6.0", "0.7.0")
        # 0.4.0 -> 0.5.0 and 0.6.0 -> 0.7.0 create the statistics' view and functions again.
        stats_recreated = released in ("0.4.0", "0.5.0", "0.6.0")
        if months:
            old.execute("INSERT INTO rate_limiter.limits (name, kind, rate, period) VALUES "
                        "('monthly_bucket', 'token bucket', 10, '1 month'), ('monthly_window', 'fixed window', 10, '1 month'), "
                        "('quarter_and_a_day', 'fixed window', 10, '3 months 1 day'), ('daily_window', 'fixed window', 10, '1 day'), "
                        "('daily_bucket', 'token bucket', 10, '1 day')")
        if released in ("0.1.0", "0.2.0"):
            old.execute("INSERT INTO rate_limiter.state VALUES ('kept', 'k', 0, 3, '2030-01-01')")
            old.execute("INSERT INTO rate_limiter.state VALUES ('inline', 'k', 0, 1, '2030-01-01')")
        else:  # as 0.3.0 and 0.4.0 write them: with their expiry, inline rows with shard -1 - shard
            old.execute("INSERT INTO rate_limiter.state VALUES ('kept', 'k', 0, 3, '2030-01-01', '2030-01-01 00:00:01.7')")
            old.execute("INSERT INTO rate_limiter.state VALUES ('inline', 'k', -1, 1, '2030-01-01', 'infinity')")
        try:
            old.execute(f"GRANT EXECUTE ON FUNCTION rate_limiter.rate_limit TO {role}")
            old.execute(f"GRANT EXECUTE ON FUNCTION rate_limiter.define TO {role}")
            headers = released not in ("0.1.0", "0.2.0")  # http_headers came in 0.3.0
            if headers:
                old.execute(f"GRANT EXECUTE ON FUNCTION rate_limiter.http_headers TO {role} WITH GRANT OPTION")
            if stats_recreated:
                old.execute(f"GRANT SELECT ON rate_limiter.stats TO {role}")
                old.execute(f"GRANT EXECUTE ON FUNCTION rate_limiter.stats_every_database() TO {role}")
            # Between installing the new library and updating, calls say what to do (0.3.0's
            # tables and functions are the library's still: its define() works, never hot;
            # 0.4.0's hot calls wait for the log's index).
            if released in ("0.1.0", "0.2.0"):
                with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
                    old.execute("SELECT * FROM rate_limiter.rate_limit('kept', 'k')")
                with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
                    old.execute("SELECT rate_limiter.define('new', 'token bucket', 1, '1 second')")
            else:
                old.execute("SELECT rate_limiter.define('defined_before_update', 'token bucket', 1, '1 second')")
                old.execute("DELETE FROM rate_limiter.limits WHERE name = 'defined_before_update'")
            if released == "0.4.0":
                old.execute("SELECT rate_limiter.define('hot_before_update', 'token bucket', 1, '1 second', hot => true)")
                with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as outdated:
                    old.execute("SELECT * FROM rate_limiter.rate_limit('hot_before_update', 'k')")
                assert "ALTER EXTENSION rate_limiter UPDATE" in outdated.value.diag.message_hint
                # A change of a hot limit folds its log, which waits for the update too.
                with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
                    old.execute("DELETE FROM rate_limiter.limits WHERE name = 'hot_before_update'")

            # An application function written against the old decision type.
            old.execute("CREATE FUNCTION public.app_call(k text) RETURNS boolean LANGUAGE plpgsql AS $$ "
                        "DECLARE d rate_limiter.decision; "
                        "BEGIN SELECT * INTO d FROM rate_limiter.rate_limit('kept', k); RETURN d.ok; END $$")

            default_privileges(old, intruder, schema="rate_limiter")
            if released == "0.6.0":
                # The role's own grants, which its default privileges happen to repeat: those of the
                # objects 0.7.0 creates again are given back after the pin that takes back leaks.
                default_privileges(old, role, schema="rate_limiter")
            old.execute("ALTER EXTENSION rate_limiter UPDATE")
            for test_conn in (fresh, old):
                assert granted_to(test_conn, "rate_limiter", intruder) == [], "no default privilege reached the extension"
            if released == "0.4.0":
                assert old.execute("SELECT ok FROM rate_limiter.rate_limit('hot_before_update', 'k')").fetchone() == (True,)
                old.execute("DELETE FROM rate_limiter.limits WHERE name = 'hot_before_update'")
                old.execute("DELETE FROM rate_limiter.state WHERE name = 'hot_before_update'")  # its folded log

            # The limits defined before keep the lengths 0.4.0 gave them, written out: no window
            # moves (a fixed window of months or days defined from now on is a calendar one).
            periods = "SELECT name, period::text FROM rate_limiter.limits WHERE name ~ '^(month|quarter|daily)'"
            assert dict(old.execute(periods).fetchall()) == ({
                "monthly_bucket": "720:00:00", "monthly_window": "720:00:00", "quarter_and_a_day": "2184:00:00",
                "daily_window": "24:00:00", "daily_bucket": "1 day"} if months else {})
            for name in ("monthly_bucket", "monthly_window", "quarter_and_a_day", "daily_window") if months else ():
                assert old.execute("SELECT ok FROM rate_limiter.rate_limit(%s, 'k')", (name,)).fetchone() == (True,)
            old.execute("DELETE FROM rate_limiter.state WHERE name ~ '^(month|quarter|daily)'")
            assert old.execute("SELECT extversion FROM pg_extension WHERE extname = 'rate_limiter'").fetchone() == (
                fresh.execute("SELECT extversion FROM pg_extension WHERE extname = 'rate_limiter'").fetchone())
            upgraded = catalog_of(old, "rate_limiter", initial_privileges=False)
            old.execute(f"REVOKE EXECUTE ON FUNCTION rate_limiter.rate_limit FROM {role}")
            # define() was created again with more arguments; its grant came along.
            assert old.execute(f"SELECT has_function_privilege('{role}', 'rate_limiter.define(text, text, float8, "
                               "interval, float8, float8, integer, timestamptz, interval, text, integer, interval, text, interval, boolean, boolean, text, boolean)', 'EXECUTE')"
                               ).fetchone() == (True,)
            old.execute(f"REVOKE EXECUTE ON FUNCTION rate_limiter.define FROM {role}")
            if headers:
                # Created again in 0.7.0 with key, draft and partition_key: its grant came along.
                new_headers = "rate_limiter.http_headers(text, rate_limiter.decision, jsonb, text, integer, boolean)"
                assert old.execute(f"SELECT has_function_privilege('{role}', '{new_headers}', 'EXECUTE WITH GRANT OPTION')"
                                   ).fetchone() == (True,)
                old.execute(f"REVOKE EXECUTE ON FUNCTION {new_headers} FROM {role}")
            if stats_recreated:
                assert old.execute(f"SELECT has_table_privilege('{role}', 'rate_limiter.stats', 'SELECT'), "
                                   f"has_function_privilege('{role}', 'rate_limiter.stats_every_database()', 'EXECUTE')"
                                   ).fetchone() == (True, True), "the grants came along"
                old.execute(f"REVOKE SELECT ON rate_limiter.stats FROM {role}")
                old.execute(f"REVOKE EXECUTE ON FUNCTION rate_limiter.stats_every_database() FROM {role}")
            assert catalog_of(old, "rate_limiter", initial_privileges=False) == catalog_of(fresh, "rate_limiter", initial_privileges=False)
            assert upgraded != catalog_of(fresh, "rate_limiter", initial_privileges=False), "the grant showed in the catalog"

            # The row the update found got a conservative expiry: refilled (0.7 s) plus a period.
            assert old.execute("SELECT expires - ts FROM rate_limiter.state WHERE name = 'kept' AND key = 'k'").fetchone() == (
                datetime.timedelta(seconds=1.7),)
            old.execute("SET rate_limiter.fake_now = '2030-01-01'")
            ok, remaining = old.execute(
                "SELECT ok, remaining FROM rate_limiter.rate_limit('kept', 'k')").fetchone()
            assert (ok, remaining) == (True, 2), "the stored state (3 tokens) survived the update"
            assert old.execute("SELECT remaining FROM rate_limiter.rate_limit('kept', 'other')").fetchone() == (9,)
            # The decision gained columns at its end; callers of the old shape keep working.
            assert old.execute("SELECT public.app_call('plpgsql')").fetchone() == (True,)
            assert old.execute("SELECT (rate_limiter.rate_limit('kept', 'field')).ok").fetchone() == (True,)
            # A row of a name that is not defined was an inline config's, and still is.
            inline = """'{"kind": "token bucket", "rate": 2, "period": "1 hour"}'"""
            assert old.execute(f"SELECT ok, remaining FROM rate_limiter.rate_limit('inline', 'k', config => {inline})"
                               ).fetchone() == (True, 0)
            assert old.execute("SELECT shard FROM rate_limiter.state WHERE name = 'inline'").fetchone() == (-1,)
            old.execute("SET rate_limiter.fake_now = '2030-01-01 00:00:01'")
            assert old.execute("SELECT rate_limiter.prune()").fetchone() == (4,), "the four keys of 'kept' have refilled"
            old.execute("DELETE FROM rate_limiter.limits")
            assert old.execute("SELECT rate_limiter.prune()").fetchone() == (0,), "the inline row is not refilled"
        finally:
            old.execute("DROP FUNCTION IF EXISTS public.app_call(text)")
            for test_conn in (fresh, old):
                test_conn.execute(f"DROP OWNED BY {role}, {intruder}")
            old.execute(f"DROP ROLE {role}, {intruder}")


def test_a_session_survives_the_extension_being_dropped_and_created_again(test_cluster, databases):
    with test_cluster.connect(databases["fresh"]) as admin, test_cluster.connect(databases["fresh"]) as app:
        admin.execute("CREATE EXTENSION rate_limiter")
        admin.execute("SELECT rate_limiter.define('l', 'token bucket', 1, '1 hour')")
        call = "SELECT ok, remaining FROM rate_limiter.rate_limit('l', 'k')"
        assert app.execute(call).fetchone() == (True, 0)  # app's backend caches OIDs and config
        admin.execute("DROP EXTENSION rate_limiter")
        admin.execute("CREATE EXTENSION rate_limiter")
        admin.execute("SELECT rate_limiter.define('l', 'token bucket', 3, '1 hour')")
        ok, remaining = app.execute(call).fetchone()
        assert ok and remaining == pytest.approx(2, abs=0.01), "new tables, new config"


@every_version
def test_an_index_or_trigger_added_to_the_state_table_is_refused_but_a_copy_of_the_key_is_kept(test_cluster, databases):
    with test_cluster.connect(databases["fresh"]) as admin, test_cluster.connect(databases["fresh"]) as app:
        admin.execute("CREATE EXTENSION rate_limiter")
        admin.execute("SELECT rate_limiter.define('l', 'token bucket', 5, '1 hour')")
        call = "SELECT ok FROM rate_limiter.rate_limit('l', 'k')"
        assert app.execute(call).fetchone() == (True,)
        # Writes bypass the executor: another index would go stale, a trigger never fire.
        # A summarizing index too: from 16 a HOT update still owes it entries.
        for index in ("CREATE INDEX state_ts ON rate_limiter.state (ts)",
                      "CREATE INDEX state_ts ON rate_limiter.state USING brin (ts)"):
            admin.execute(index)
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
                app.execute(call)
            admin.execute("DROP INDEX rate_limiter.state_ts")
            assert app.execute(call).fetchone() == (True,)
        admin.execute("CREATE FUNCTION public.noop() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END'")
        admin.execute("CREATE TRIGGER t BEFORE UPDATE ON rate_limiter.state FOR EACH ROW EXECUTE FUNCTION public.noop()")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
            app.execute(call)
        admin.execute("DROP TRIGGER t ON rate_limiter.state")
        assert app.execute(call).fetchone() == (True,)
        # A copy of the unique index (what REINDEX CONCURRENTLY and repacks build) is kept
        # up to date, including entries made by new rows.
        admin.execute("CREATE UNIQUE INDEX state_copy ON rate_limiter.state (key, name, shard) NULLS NOT DISTINCT")
        assert app.execute("SELECT ok FROM rate_limiter.rate_limit('l', 'new')").fetchone() == (True,)
        amcheck_clean(admin)  # state_copy among the state table's indexes
        assert admin.execute("SELECT count(*) FROM rate_limiter.state s WHERE key = 'new'").fetchone() == (1,)
