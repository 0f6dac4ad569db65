"""Limits on a table's writes (rate_limiter.limit_writes, docs/api.md): every way rows arrive
charged per key exactly, against counts kept in Python; a statement over the quota failing
whole; and the rights, from the side of a writer, a role with TRIGGER on the table and a
careless owner."""

import json
import uuid

import psycopg
import pytest

from calls import define
from clusters import every_version
from editions import edition  # noqa: F401 - a fixture


def remaining(c, name, key):
    return c.execute("SELECT remaining FROM rate_limiter.check_rate_limit(%s, %s, 0)", (name, key)).fetchone()[0]


def refused(c, sql, args=()):
    """The SQLSTATE `sql` fails with (the statement's transaction rolled back)."""
    with pytest.raises(psycopg.Error) as e:
        c.execute(sql, args)
    if not c.autocommit:
        c.rollback()
    return e.value


@every_version
@pytest.mark.parametrize("durable", [True, False], ids=["durable", "memory"])
def test_every_way_rows_arrive_is_charged_per_key_exactly(test_conn, name, durable, pg):
    """Single and multi-row INSERT, INSERT ... SELECT, COPY, both ON CONFLICTs, MERGE, UPDATE
    and DELETE, a row a BEFORE trigger skips: each key is charged its rows' counts (a size
    column), as the same counts kept in Python say."""
    c = test_conn
    table = f"writes_{uuid.uuid4().hex[:8]}"
    c.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, author text, size int NOT NULL DEFAULT 1)")
    c.execute(f"""CREATE FUNCTION {table}_skip() RETURNS trigger LANGUAGE plpgsql AS
                  $$ BEGIN IF NEW.author = 'skipped' THEN RETURN NULL; END IF; RETURN NEW; END $$""")
    c.execute(f"CREATE TRIGGER skip BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {table}_skip()")
    define(c, name, "fixed window", rate=1000, period="1 hour", durable=durable)
    c.execute("SELECT rate_limiter.limit_writes(%s, %s, key => 'author', count => 'size', "
              "events => '{INSERT,UPDATE,DELETE}')", (table, name))
    used = {}

    def charged(**keys):
        for key, n in keys.items():
            used[key] = used.get(key, 0) + n

    c.execute(f"INSERT INTO {table} VALUES (1, 'a', 2)")
    charged(a=2)
    c.execute(f"INSERT INTO {table} VALUES (2, 'a', 1), (3, 'b', 3), (4, 'b', 4), (5, 'skipped', 50)")
    charged(a=1, b=7)
    c.execute(f"INSERT INTO {table} SELECT g, 'c', 1 FROM generate_series(10, 14) g")
    charged(c=5)
    with c.cursor().copy(f"COPY {table} (id, author, size) FROM STDIN") as copy:
        for row in ((20, "a", 1), (21, "d", 6), (22, "skipped", 9)):
            copy.write_row(row)
    charged(a=1, d=6)
    c.execute(f"INSERT INTO {table} VALUES (1, 'a', 7), (30, 'e', 2) ON CONFLICT DO NOTHING")
    charged(e=2)
    # The insert charges the row it inserts; the update (an UPDATE event) the new values.
    c.execute(f"INSERT INTO {table} VALUES (3, 'b', 9), (31, 'e', 1) ON CONFLICT (id) DO UPDATE SET size = EXCLUDED.size")
    charged(e=1, b=9)
    c.execute(f"""MERGE INTO {table} t USING (VALUES (4, 'b', 5), (40, 'f', 3)) v(id, author, size) ON t.id = v.id
                  WHEN MATCHED THEN UPDATE SET size = v.size
                  WHEN NOT MATCHED THEN INSERT VALUES (v.id, v.author, v.size)""")
    charged(b=5, f=3)
    c.execute(f"UPDATE {table} SET size = 2 WHERE author = 'c'")
    charged(c=10)
    c.execute(f"DELETE FROM {table} WHERE author = 'd'")
    charged(d=6)
    c.execute(f"UPDATE {table} SET size = 1 WHERE false")
    for key in ("a", "b", "c", "d", "e", "f", "skipped"):
        assert remaining(c, name, key) == 1000 - used.get(key, 0), key
    rows = c.execute("SELECT limit_name, key_column, count_column, event, config, enabled FROM rate_limiter.write_limits "
                     "WHERE \"table\" = %s::regclass ORDER BY event", (table,)).fetchall()
    assert rows == [(name, "author", "size", event, None, True) for event in ("DELETE", "INSERT", "UPDATE")]


def test_a_statement_over_the_quota_fails_whole_and_gives_back_what_rolls_back(test_conn, name):
    """A 100-row insert over a quota of 50 fails whole (22023: no statement of more rows than
    the capacity ever passes) and leaves the quota as it was; one over what is left fails whole
    with RL429 (the decision in DETAIL); a rolled-back savepoint and transaction give their
    tokens back; the 51st row is refused."""
    c = test_conn
    table = f"writes_{uuid.uuid4().hex[:8]}"
    c.execute(f"CREATE TABLE {table} (id serial, author_id int)")
    define(c, name, "fixed window", rate=50, period="1 hour")
    c.execute("SELECT rate_limiter.limit_writes(%s, %s, key => 'author_id')", (table, name))
    assert refused(c, f"INSERT INTO {table} (author_id) SELECT 7 FROM generate_series(1, 100)").sqlstate == "22023"
    assert c.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
    assert remaining(c, name, "7") == 50
    with c.transaction():
        c.execute(f"INSERT INTO {table} (author_id) SELECT 7 FROM generate_series(1, 10)")
        c.execute("SAVEPOINT s")
        c.execute(f"INSERT INTO {table} (author_id) SELECT 7 FROM generate_series(1, 30)")
        c.execute("ROLLBACK TO SAVEPOINT s")
    assert remaining(c, name, "7") == 40
    e = refused(c, f"INSERT INTO {table} (author_id) SELECT 7 FROM generate_series(1, 41)")
    assert e.sqlstate == "RL429"
    detail = json.loads(e.diag.message_detail)
    assert (detail["kind"], detail["name"], detail["key"]) == ("RateLimited", name, "7")
    assert e.diag.message_hint.startswith("Retry after ")
    assert c.execute(f"SELECT count(*) FROM {table}").fetchone() == (10,)
    assert remaining(c, name, "7") == 40
    c.execute("BEGIN")
    c.execute(f"INSERT INTO {table} (author_id) SELECT 7 FROM generate_series(1, 40)")
    c.execute("ROLLBACK")
    assert remaining(c, name, "7") == 40
    c.execute(f"INSERT INTO {table} (author_id) SELECT 7 FROM generate_series(1, 40)")
    assert refused(c, f"INSERT INTO {table} (author_id) VALUES (7)").sqlstate == "RL429"
    # Another key, and a statement of several keys where one is over: all or nothing.
    assert refused(c, f"INSERT INTO {table} (author_id) VALUES (8), (8), (7)").sqlstate == "RL429"
    assert remaining(c, name, "8") == 50
    c.execute(f"INSERT INTO {table} (author_id) VALUES (8), (8), (NULL)")
    assert remaining(c, name, "8") == 48
    assert remaining(c, name, None) == 49


def test_what_a_declaration_refuses(test_conn, name):
    """Missing and dropped columns, a count of another type, NULL and negative counts, a
    hot limit, an undefined one, more keys than one call takes, a table of rate_limiter's:
    each refused with its SQLSTATE; declaring again replaces, unlimit_writes drops."""
    c = test_conn
    table = f"writes_{uuid.uuid4().hex[:8]}"
    c.execute(f"CREATE TABLE {table} (id serial, author text, size numeric, note text)")
    define(c, name, "fixed window", rate=5000, period="1 hour")
    declare = f"SELECT rate_limiter.limit_writes('{table}', %s, key => %s, count => %s)"
    assert refused(c, declare, (name, "nope", None)).sqlstate == "42703"
    assert refused(c, declare, (name, "ctid", None)).sqlstate == "42703"
    assert refused(c, declare, (name, "author", "note")).sqlstate == "42703"
    assert refused(c, declare, ("undefined_" + name, "author", None)).sqlstate == "42704"
    c.execute(f"ALTER TABLE {table} ADD COLUMN at timestamptz, ADD COLUMN ratio float8")
    assert refused(c, declare, (name, "at", None)).sqlstate == "42703"  # its text follows DateStyle
    assert refused(c, declare, (name, "ratio", None)).sqlstate == "42703"  # and extra_float_digits
    assert refused(c, "SELECT rate_limiter.limit_writes('rate_limiter.limits', %s)", (name,)).sqlstate == "0A000"
    assert refused(c, f"SELECT rate_limiter.limit_writes('{table}', %s, events => '{{TRUNCATE}}')", (name,)).sqlstate == "22023"

    c.execute(declare, (name, "author", "size"))
    assert refused(c, f"INSERT INTO {table} (author, size) VALUES ('a', 1), ('a', NULL)").sqlstate == "22023"
    assert refused(c, f"INSERT INTO {table} (author, size) VALUES ('a', -1)").sqlstate == "22023"
    assert refused(c, f"INSERT INTO {table} (author, size) VALUES ('a', 'NaN')").sqlstate == "22023"
    assert refused(c, f"INSERT INTO {table} (author, size) SELECT g::text, 1 FROM generate_series(1, 1001) g").sqlstate == "22023"
    c.execute(f"INSERT INTO {table} (author, size) SELECT g::text, 1.5 FROM generate_series(1, 1000) g")
    assert remaining(c, name, "1") == 4998.5
    # A column dropped under the limit: writes refused, not let through.
    c.execute(f"ALTER TABLE {table} DROP COLUMN size")
    assert refused(c, f"INSERT INTO {table} (author) VALUES ('a')").sqlstate == "42703"
    # Declared again: its new events alone; then dropped.
    c.execute(f"SELECT rate_limiter.limit_writes('{table}', %s, key => 'author', events => '{{DELETE}}')", (name,))
    assert c.execute("SELECT event, count_column FROM rate_limiter.write_limits WHERE \"table\" = %s::regclass",
                     (table,)).fetchall() == [("DELETE", None)]
    c.execute(f"INSERT INTO {table} (author) VALUES ('z')")
    assert remaining(c, name, "z") == 5000
    assert c.execute("SELECT rate_limiter.unlimit_writes(%s)", (table,)).fetchone() == (1,)
    assert c.execute("SELECT count(*) FROM rate_limiter.write_limits WHERE \"table\" = %s::regclass",
                     (table,)).fetchone() == (0,)
    c.execute(f"DELETE FROM {table}")
    assert remaining(c, name, "z") == 5000


def test_rights_from_a_writer_and_a_role_with_trigger(test_conn, name):
    """A writer needs no grant of the extension, and can neither declare, drop, disable, nor
    fire the trigger's function itself; a role with TRIGGER on the table cannot make a trigger
    of it; an owner who may not call rate_limit cannot declare one."""
    c = test_conn
    suffix = uuid.uuid4().hex[:8]
    owner, writer, trigger_role = f"owner_{suffix}", f"writer_{suffix}", f"trig_{suffix}"
    table = f"writes_{suffix}"
    for role in (owner, writer, trigger_role):
        c.execute(f"CREATE ROLE {role}")
    try:
        c.execute(f"CREATE TABLE {table} (id serial, author text)")
        c.execute(f"ALTER TABLE {table} OWNER TO {owner}")
        c.execute(f"GRANT INSERT, SELECT ON {table} TO {writer}")
        c.execute(f"GRANT USAGE ON SEQUENCE {table}_id_seq TO {writer}")
        c.execute(f"GRANT USAGE ON SCHEMA rate_limiter TO {owner}, {writer}, {trigger_role}")
        c.execute(f"GRANT EXECUTE ON FUNCTION rate_limiter.limit_writes, rate_limiter.unlimit_writes "
                  f"TO {owner}, {writer}, {trigger_role}")
        define(c, name, "fixed window", rate=2, period="1 hour")
        declare = f"SELECT rate_limiter.limit_writes('{table}', %s, key => 'author')"

        c.execute(f"SET ROLE {owner}")
        assert refused(c, declare, (name,)).sqlstate == "42501"  # may not call rate_limit
        c.execute("RESET ROLE")
        c.execute(f"GRANT EXECUTE ON FUNCTION rate_limiter.rate_limit(text, text, double precision, boolean, boolean, jsonb) TO {owner}")
        c.execute(f"SET ROLE {writer}")
        assert refused(c, declare, (name,)).sqlstate == "42501"  # not the owner
        c.execute("RESET ROLE")
        c.execute(f"SET ROLE {owner}")
        c.execute(declare, (name,))
        c.execute("RESET ROLE")
        # Once another role holds TRIGGER (which could replace the trigger), no declaration.
        c.execute(f"GRANT TRIGGER ON {table} TO {trigger_role}")
        c.execute(f"SET ROLE {owner}")
        e = refused(c, declare, (name,))
        assert e.sqlstate == "42501" and "TRIGGER" in e.diag.message_primary
        c.execute("RESET ROLE")

        c.execute(f"SET ROLE {writer}")
        c.execute(f"INSERT INTO {table} (author) VALUES ('w'), ('w')")
        assert refused(c, f"INSERT INTO {table} (author) VALUES ('w')").sqlstate == "RL429"
        assert refused(c, "SELECT rate_limiter.unlimit_writes(%s)", (table,)).sqlstate == "42501"
        assert refused(c, f"ALTER TABLE {table} DISABLE TRIGGER ALL").sqlstate == "42501"
        assert refused(c, "SELECT rate_limiter._write_limited()").sqlstate == "42501"
        c.execute("RESET ROLE")

        c.execute(f"SET ROLE {trigger_role}")
        planted = (f"CREATE TRIGGER planted AFTER INSERT ON {table} REFERENCING NEW TABLE AS r FOR EACH STATEMENT "
                   f"EXECUTE FUNCTION rate_limiter._write_limited('1', %s, 'author', '', '')")
        assert refused(c, planted.replace("%s", f"'{name}'")).sqlstate == "42501"
        c.execute("RESET ROLE")
        assert c.execute("SELECT count(*) FROM rate_limiter.write_limits WHERE \"table\" = %s::regclass",
                         (table,)).fetchone() == (1,)
        # The function itself, called by a superuser other than as a write limit's trigger.
        assert refused(c, "SELECT rate_limiter._write_limited()").sqlstate == "0A000"
        # The owner's right to call rate_limit revoked: the limit charges nothing, and refuses.
        c.execute(f"REVOKE EXECUTE ON FUNCTION rate_limiter.rate_limit(text, text, double precision, boolean, boolean, jsonb) FROM {owner}")
        c.execute(f"SET ROLE {writer}")
        assert refused(c, f"INSERT INTO {table} (author) VALUES ('v')").sqlstate == "42501"
        c.execute("RESET ROLE")
    finally:
        c.execute("RESET ROLE")
        c.execute(f"DROP TABLE IF EXISTS {table}")
        for role in (owner, writer, trigger_role):
            c.execute(f"DROP OWNED BY {role}")
            c.execute(f"DROP ROLE {role}")


def test_a_partitioned_table_is_charged_for_the_rows_routed_through_it(test_conn, name):
    """Rows inserted through a partitioned table, into two partitions, are charged once each;
    rows written straight into a partition too; unlimit_writes drops the partitions' triggers."""
    c = test_conn
    table = f"writes_{uuid.uuid4().hex[:8]}"
    c.execute(f"CREATE TABLE {table} (id int, author text) PARTITION BY RANGE (id)")
    c.execute(f"CREATE TABLE {table}_low PARTITION OF {table} FOR VALUES FROM (0) TO (100)")
    c.execute(f"CREATE TABLE {table}_high PARTITION OF {table} FOR VALUES FROM (100) TO (200)")
    define(c, name, "fixed window", rate=10, period="1 hour")
    c.execute("SELECT rate_limiter.limit_writes(%s, %s, key => 'author')", (table, name))
    c.execute(f"INSERT INTO {table} VALUES (1, 'a'), (150, 'a'), (151, 'b')")
    assert (remaining(c, name, "a"), remaining(c, name, "b")) == (8, 9)
    c.execute(f"INSERT INTO {table}_high VALUES (152, 'a'), (153, 'b')")
    c.execute(f"DELETE FROM {table}_low")
    assert (remaining(c, name, "a"), remaining(c, name, "b")) == (7, 8)
    assert c.execute("SELECT rate_limiter.unlimit_writes(%s)", (table,)).fetchone() == (3,)
    c.execute(f"INSERT INTO {table}_high VALUES (154, 'a')")
    assert remaining(c, name, "a") == 7


def test_a_denial_reads_as_postgrest_answers_it_when_asked(test_conn, name):
    """rate_limiter.throw_as: PT429 (PostgREST's HTTP 429), and PGRST (PostgREST's body in the
    message; status 429, Retry-After and draft 11's RateLimit fields in DETAIL), for a write
    limit and for throws => true alike; RL429 again once reset."""
    c = test_conn
    table = f"writes_{uuid.uuid4().hex[:8]}"
    c.execute(f"CREATE TABLE {table} (author text)")
    define(c, name, "fixed window", rate=2, period="1 hour")
    c.execute("SELECT rate_limiter.limit_writes(%s, %s, key => 'author')", (table, name))
    c.execute(f"INSERT INTO {table} VALUES ('a'), ('a')")
    over = f"INSERT INTO {table} VALUES ('a')"
    try:
        c.execute("SET rate_limiter.throw_as = 'PT429'")
        assert refused(c, over).sqlstate == "PT429"
        c.execute("SET rate_limiter.throw_as = 'pgrst'")
        e = refused(c, over)
        assert e.sqlstate == "PGRST"
        body, response = json.loads(e.diag.message_primary), json.loads(e.diag.message_detail)
        assert (body["code"], body["message"]) == ("RL429", f'rate limit "{name}" exceeded')
        assert json.loads(body["details"])["key"] == "a"
        assert response["status"] == 429
        headers = response["headers"]
        assert 0 < int(headers["Retry-After"]) <= 3600
        assert headers["RateLimit-Policy"] == f'"{name}";q=2;qu="requests";w=3600'
        assert headers["RateLimit"].startswith(f'"{name}";r=0;t=')
        e = refused(c, "SELECT rate_limiter.rate_limit(%s, 'a', throws => true)", (name,))
        assert (e.sqlstate, json.loads(e.diag.message_detail)["status"]) == ("PGRST", 429)
        assert refused(c, "SET rate_limiter.throw_as = 'HTTP429'").sqlstate == "22023"
    finally:
        c.execute("RESET rate_limiter.throw_as")
    assert refused(c, over).sqlstate == "RL429"


def test_shadow_hot_and_memory_limits_and_a_name_the_view_must_decode(test_cluster, database_name, name):
    """A limit in shadow mode lets a statement over it through (counted as shadow-denied); a
    hot limit charges exactly; the view decodes a name holding a backslash and "000". In a
    database of its own: a hot limit's debits stay until folded, which a TRUNCATE of the
    limits by another test of the shared database would refuse."""
    with test_cluster.connect(database_name) as c:
        shadow_hot_and_odd_name(c, name)


def shadow_hot_and_odd_name(c, name):
    table = f"writes_{uuid.uuid4().hex[:8]}"
    c.execute(f"CREATE TABLE {table} (author text)")
    define(c, name, "fixed window", rate=2, period="1 hour", enforce=False)
    c.execute("SELECT rate_limiter.limit_writes(%s, %s, key => 'author')", (table, name))
    c.execute(f"INSERT INTO {table} VALUES ('a'), ('a')")
    c.execute(f"INSERT INTO {table} VALUES ('a')")  # over, in shadow mode: let through
    assert c.execute(f"SELECT count(*) FROM {table}").fetchone() == (3,)
    hot = name + "_hot"
    define(c, hot, "fixed window", rate=3, period="1 hour", hot=True)
    c.execute("SELECT rate_limiter.limit_writes(%s, %s, key => 'author')", (table, hot))
    c.execute(f"INSERT INTO {table} VALUES ('h'), ('h'), ('i')")
    assert refused(c, f"INSERT INTO {table} VALUES ('h'), ('h')").sqlstate == "RL429"
    c.execute(f"INSERT INTO {table} VALUES ('h')")
    assert refused(c, f"INSERT INTO {table} VALUES ('h')").sqlstate == "RL429"
    odd = name + "\\000x"
    c.execute("SELECT rate_limiter.limit_writes(%s, %s, config => %s)",
              (table, odd, json.dumps({"kind": "fixed window", "rate": 100, "period": 3600000})))
    assert c.execute("SELECT limit_name, key_column, config->>'kind' FROM rate_limiter.write_limits "
                     "WHERE \"table\" = %s::regclass AND limit_name = %s", (table, odd)).fetchall() == [(odd, None, "fixed window")]
    assert c.execute("SELECT rate_limiter.unlimit_writes(%s)", (table,)).fetchone() == (3,)


@every_version
def test_the_edition_charges_every_way_rows_arrive_and_holds_the_rights(test_cluster, edition, pg):
    """The SQL-only edition's write limits: charged per key exactly (multi-row INSERT,
    INSERT ... SELECT, COPY, ON CONFLICT, MERGE, DELETE, a partitioned table, a row a BEFORE
    trigger skips), all or nothing; a writer needs no grant; a role that may make such a
    trigger on a table of its own, but may not call rate_limit, charges nothing."""
    dbname, owner = edition
    suffix = uuid.uuid4().hex[:6]
    writer, planter = f"ed_writer_{suffix}", f"ed_planter_{suffix}"
    with test_cluster.connect() as admin:
        admin.execute(f"CREATE ROLE {writer} LOGIN")
        admin.execute(f"CREATE ROLE {planter} LOGIN")
    try:
        with test_cluster.connect(dbname, user=owner) as c:
            c.execute("CREATE TABLE m (id int PRIMARY KEY, author text, size int NOT NULL DEFAULT 1)")
            c.execute("""CREATE FUNCTION skip() RETURNS trigger LANGUAGE plpgsql AS
                         $$ BEGIN IF NEW.author = 'skipped' THEN RETURN NULL; END IF; RETURN NEW; END $$""")
            c.execute("CREATE TRIGGER skip BEFORE INSERT ON m FOR EACH ROW EXECUTE FUNCTION skip()")
            c.execute("SELECT rate_limiter.define('w', 'fixed window', 20, '1 hour')")
            c.execute("SELECT rate_limiter.limit_writes('m', 'w', key => 'author', count => 'size', events => '{INSERT,DELETE}')")
            c.execute("GRANT INSERT, SELECT ON m TO " + writer)
            with test_cluster.connect(dbname, user=writer) as w:
                w.execute("INSERT INTO m VALUES (1, 'a', 2), (2, 'b', 3), (3, 'skipped', 9)")
                w.execute("INSERT INTO m SELECT g, 'c', 1 FROM generate_series(10, 14) g")
                with w.cursor().copy("COPY m (id, author, size) FROM STDIN") as copy:
                    copy.write_row((20, "a", 1))
                w.execute("INSERT INTO m VALUES (1, 'a', 7), (30, 'b', 2) ON CONFLICT DO NOTHING")
            c.execute("""MERGE INTO m t USING (VALUES (40, 'd', 4)) v(id, author, size) ON t.id = v.id
                         WHEN NOT MATCHED THEN INSERT VALUES (v.id, v.author, v.size)""")
            c.execute("DELETE FROM m WHERE author = 'c'")
            left = {k: c.execute("SELECT remaining FROM rate_limiter.check_rate_limit('w', %s, 0)", (k,)).fetchone()[0]
                    for k in ("a", "b", "c", "d", "skipped")}
            assert left == {"a": 17, "b": 15, "c": 10, "d": 16, "skipped": 20}
            # Over what is left of b: the statement fails whole, a's share of it too.
            with pytest.raises(psycopg.Error) as e:
                c.execute("INSERT INTO m VALUES (50, 'a', 1), (51, 'b', 16)")
            assert e.value.sqlstate == "RL429"
            assert c.execute("SELECT remaining FROM rate_limiter.check_rate_limit('w', 'a', 0)").fetchone() == (17,)
            assert c.execute("SELECT event FROM rate_limiter.write_limits ORDER BY 1").fetchall() == [("DELETE",), ("INSERT",)]
            # A partitioned table: rows routed through it and written straight into a partition.
            c.execute("CREATE TABLE p (id int, author text) PARTITION BY RANGE (id)")
            c.execute("CREATE TABLE p_low PARTITION OF p FOR VALUES FROM (0) TO (100)")
            c.execute("SELECT rate_limiter.limit_writes('p', 'w', key => 'author')")
            c.execute("INSERT INTO p VALUES (1, 'e'), (2, 'e')")
            c.execute("INSERT INTO p_low VALUES (3, 'e')")
            assert c.execute("SELECT remaining FROM rate_limiter.check_rate_limit('w', 'e', 0)").fetchone() == (17,)
            assert c.execute("SELECT rate_limiter.unlimit_writes('p')").fetchone() == (2,)
            # A role with a table of its own and the trigger function, but not rate_limit.
            c.execute(f"GRANT USAGE ON SCHEMA rate_limiter TO {planter}")
            c.execute(f"GRANT EXECUTE ON FUNCTION rate_limiter._write_limited() TO {planter}")
            c.execute(f"GRANT CREATE ON SCHEMA public TO {planter}")
            with test_cluster.connect(dbname, user=planter) as p:
                p.execute("CREATE TABLE mine (author text)")
                p.execute("""CREATE TRIGGER planted AFTER INSERT ON mine REFERENCING NEW TABLE AS rate_limiter_rows
                             FOR EACH STATEMENT EXECUTE FUNCTION rate_limiter._write_limited('1', 'w', 'author', '', '')""")
                with pytest.raises(psycopg.Error) as e:
                    p.execute("INSERT INTO mine VALUES ('a')")
                assert e.value.sqlstate == "42501"
            # Granted rate_limit too, a trigger without the transition table, and a temporary
            # view of that name whose column would run the planter's code as the edition's owner.
            c.execute(f"GRANT EXECUTE ON FUNCTION rate_limiter.rate_limit(text, text, double precision, boolean, boolean, jsonb) TO {planter}")
            with test_cluster.connect(dbname, user=planter) as p:
                p.execute("DROP TRIGGER planted ON mine")
                p.execute("""CREATE TRIGGER bare AFTER INSERT ON mine FOR EACH STATEMENT
                             EXECUTE FUNCTION rate_limiter._write_limited('1', 'w', '', 'c', '')""")
                p.execute("CREATE TEMP VIEW rate_limiter_rows AS SELECT 1::float8 AS c, current_user AS who")
                with pytest.raises(psycopg.Error) as e:
                    p.execute("INSERT INTO mine VALUES ('a')")
                assert e.value.sqlstate == "0A000"
            assert c.execute("SELECT remaining FROM rate_limiter.check_rate_limit('w', 'a', 0)").fetchone() == (17,)
    finally:
        with test_cluster.connect(dbname) as c:
            c.execute(f"DROP OWNED BY {writer}, {planter}")
        with test_cluster.connect() as admin:
            admin.execute(f"DROP ROLE {writer}")
            admin.execute(f"DROP ROLE {planter}")
