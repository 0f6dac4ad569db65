"""The examples in examples/ run as their users would run them, against the test cluster,
and print what examples/README.md shows."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import psycopg
import pytest

from clusters import wait_for

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PYTHON = sys.executable

# What every example prints, in its language's spelling of booleans, lists and numbers.
PYTHON_OUTPUT = [
    "1. committed: ok=True, messages=['hello'], remaining=2.0",
    "2. rolled back: messages=['hello'], remaining=2.0",
    "3. RateLimited from SQLSTATE RL429: retry after 1200 s",
]
# Django's fourth step: a plan change mid-window, the administrator's alone.
DJANGO_OUTPUT = PYTHON_OUTPUT + ["4. upgraded to 'pro' mid-window: 2 posts before, 3 after (5 in the window in all)"]
NODE_AND_RUST_OUTPUT = [
    '1. committed: ok=true, messages=["hello"], remaining=2.00',
    '2. rolled back: messages=["hello"], remaining=2.00',
    "3. RateLimited from SQLSTATE RL429: retry after 1200 s",
]


# One worker runs them all: they share examples/node's node_modules, fixed table and limit
# names, and a database and role of the cluster's.
pytestmark = pytest.mark.xdist_group("examples")


def run(*cmd, cwd, env=None, timeout=300):
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.splitlines()


def listening(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def wait_until_listening(process, port, what):
    """Until `process` accepts connections on `port`; fails at once if it exited."""
    def ready():
        assert process.poll() is None, f"{what} exited: {process.stdout.read()}"
        return listening(port)
    wait_for(ready, what, timeout=30)


@pytest.mark.parametrize("script, output", [("sqlalchemy_example.py", PYTHON_OUTPUT), ("django_example.py", DJANGO_OUTPUT)])
def test_python_orm_examples(script, output):
    assert run(PYTHON, script, cwd=EXAMPLES / "python") == output


@pytest.fixture(scope="module")
def node_modules():
    """The Node examples' packages, as package-lock.json pins them."""
    run("npm", "ci", "--no-audit", "--no-fund", cwd=EXAMPLES / "node")


@pytest.mark.parametrize("script", ["pg_example.js", "knex_example.js"])
def test_node_examples(node_modules, script):
    assert run("node", script, cwd=EXAMPLES / "node") == NODE_AND_RUST_OUTPUT


def test_rust_sqlx_example():
    # Its own Cargo workspace and lock file; the first build takes about a minute alone, and
    # more beside the other workers' tests.
    assert run("cargo", "run", "--quiet", "--locked", cwd=EXAMPLES / "rust", timeout=900) == NODE_AND_RUST_OUTPUT


def test_java_jdbc_example():
    # Single-file source launch (Java 11+); the driver is Debian's, installed by scripts/lib.sh.
    assert run("java", "-cp", "/usr/share/java/postgresql.jar", "RateLimiterExample.java", cwd=EXAMPLES / "java") == [
        "1. committed: ok=true, messages=[hello], remaining=2.00",
        "2. rolled back: messages=[hello], remaining=2.00",
        "3. RateLimited from SQLSTATE RL429: retry after 1200 s",
    ]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path):
    """Status and headers (names lowercased: HTTP header names are case-insensitive)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}


def test_fastapi_answers_429_with_retry_after_over_real_http():
    with psycopg.connect(autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS fastapi_posts")
        c.execute("SELECT rate_limiter.reset_rate_limit('fastapi_post', 'alice')")
    port = free_port()
    server = subprocess.Popen([PYTHON, "-m", "uvicorn", "fastapi_app:app", "--host", "127.0.0.1", "--port", str(port)],
                              cwd=EXAMPLES / "python", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until_listening(server, port, "uvicorn")
        status, headers = post(port, "/posts/alice?body=one")
        assert status == 200 and headers["ratelimit-policy"] == '"fastapi_post";q=2;qu="requests";w=3600'
        assert headers["ratelimit"].startswith('"fastapi_post";r=1;t=')
        assert post(port, "/posts/alice?body=lost&fail=true")[0] == 500  # rolled back, token back
        assert post(port, "/posts/alice?body=two")[0] == 200
        status, headers = post(port, "/posts/alice?body=three")
        assert status == 429 and headers["retry-after"] == "1800"
        with psycopg.connect() as c:
            assert c.execute("SELECT body FROM fastapi_posts ORDER BY body").fetchall() == [("one",), ("two",)]
    finally:
        server.terminate()
        server.wait(timeout=10)


def post_json(port, path, body):
    """Status and headers of a POST of `body` as JSON."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}


def test_fastapi_behind_a_write_limit_answers_429_for_a_statement_over_it():
    with psycopg.connect(autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS fastapi_messages")
        c.execute("SELECT rate_limiter.reset_rate_limit('fastapi_messages', 'alice')")
    port = free_port()
    server = subprocess.Popen([PYTHON, "-m", "uvicorn", "fastapi_write_limits:app", "--host", "127.0.0.1",
                               "--port", str(port)],
                              cwd=EXAMPLES / "python", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until_listening(server, port, "uvicorn")
        assert post_json(port, "/messages/alice", ["one"])[0] == 200
        assert post_json(port, "/messages/alice", ["two", "three"])[0] == 429  # one left: none stored
        assert post_json(port, "/messages/alice", ["two"])[0] == 200
        status, headers = post_json(port, "/messages/alice", ["three"])
        assert status == 429 and 1 <= int(headers["retry-after"]) <= 3600
        with psycopg.connect() as c:
            assert c.execute("SELECT body FROM fastapi_messages ORDER BY body").fetchall() == [("one",), ("two",)]
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture
def recipes_database():
    name = "rl_recipes"
    with psycopg.connect(autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute("DROP ROLE IF EXISTS app_user")
        admin.execute(f"CREATE DATABASE {name}")
        try:
            with psycopg.connect(dbname=name, autocommit=True) as c:
                c.execute("CREATE EXTENSION rate_limiter")
                c.execute((EXAMPLES / "sql" / "recipes.sql").read_text())
            yield name
        finally:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
            admin.execute("DROP ROLE IF EXISTS app_user")


def test_row_level_security_and_trigger_recipes(recipes_database):
    with psycopg.connect(dbname=recipes_database, user="app_user", autocommit=True) as app:
        app.execute("INSERT INTO posts (body) VALUES ('one'), ('two')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security policy"):
            app.execute("INSERT INTO posts (body) VALUES ('three')")
        # The failed insert rolled back its token too: still none left, still 2 rows.
        assert app.execute("SELECT count(*) FROM posts").fetchone() == (2,)

        app.execute("INSERT INTO comments (body) VALUES ('one')")
        with app.transaction():
            app.execute("INSERT INTO comments (body) VALUES ('two')")
        with pytest.raises(psycopg.Error) as caught:
            app.execute("INSERT INTO comments (body) VALUES ('three')")
        assert caught.value.sqlstate == "RL429"
        assert '"retryAfter":' in caught.value.diag.message_detail
        assert app.execute("SELECT body FROM comments ORDER BY id").fetchall() == [("one",), ("two",)]

        # The write limit: with one left, a statement of two rows fails whole; one passes.
        app.execute("INSERT INTO messages (body) VALUES ('one')")
        with pytest.raises(psycopg.Error) as caught:
            app.execute("INSERT INTO messages (body) VALUES ('two'), ('three')")
        assert caught.value.sqlstate == "RL429"
        app.execute("INSERT INTO messages (body) VALUES ('two')")
        with pytest.raises(psycopg.Error) as caught:
            app.execute("INSERT INTO messages (body) VALUES ('three')")
        assert caught.value.sqlstate == "RL429"
        assert app.execute("SELECT body FROM messages ORDER BY id").fetchall() == [("one",), ("two",)]


@pytest.fixture(scope="module")
def pgbouncer():
    """Debian's PgBouncer in transaction pooling mode in front of the test cluster, on
    loopback; the examples reach it through PGHOST and PGPORT."""
    # Outside pytest's private temporary directory: PgBouncer runs as postgres.
    directory = Path(tempfile.mkdtemp(prefix="rate_limiter_pgbouncer_"))
    os.chmod(directory, 0o755)
    port = free_port()
    (directory / "userlist.txt").write_text('"postgres" ""\n')
    (directory / "pgbouncer.ini").write_text(f"""[databases]
* = host=/tmp port={os.environ.get("PGPORT", "5432")}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {directory}/userlist.txt
pool_mode = transaction
default_pool_size = 4
ignore_startup_parameters = extra_float_digits
""")
    # PgBouncer refuses to run as root.
    bouncer = subprocess.Popen(["sudo", "-u", "postgres", "pgbouncer", str(directory / "pgbouncer.ini")],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until_listening(bouncer, port, "pgbouncer")
        yield {**os.environ, "PGHOST": "127.0.0.1", "PGPORT": str(port)}
    finally:
        subprocess.run(["sudo", "-u", "postgres", "kill", str(bouncer.pid)], check=False)
        subprocess.run(["pkill", "-u", "postgres", "-f", str(directory / "pgbouncer.ini")], check=False)
        bouncer.wait(timeout=10)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize("cmd,cwd,lines", [
    ([PYTHON, "sqlalchemy_example.py"], "python", PYTHON_OUTPUT),
    ([PYTHON, "django_example.py"], "python", DJANGO_OUTPUT),
    (["node", "pg_example.js"], "node", NODE_AND_RUST_OUTPUT),
    (["node", "knex_example.js"], "node", NODE_AND_RUST_OUTPUT),
])
def test_examples_through_pgbouncer_in_transaction_pooling(pgbouncer, node_modules, cmd, cwd, lines):
    assert run(*cmd, cwd=EXAMPLES / cwd, env=pgbouncer) == lines


def test_through_pgbouncer_set_local_holds_for_the_transaction(pgbouncer):
    conninfo = f"host=127.0.0.1 port={pgbouncer['PGPORT']} dbname={os.environ['PGDATABASE']} user=postgres"
    with psycopg.connect(conninfo, autocommit=True, prepare_threshold=None) as c:
        # Another client holds a server connection, so the next transaction may get another.
        with psycopg.connect(conninfo, autocommit=False, prepare_threshold=None) as other:
            other.execute("SELECT 1")
            c.execute("SET rate_limiter.fake_now = '2030-01-01 00:00:00+00'")
            other.commit()
        # In transaction pooling a session SET applies to whichever server connection ran it:
        # what a later transaction sees is luck. SET LOCAL, inside the transaction, is exact.
        with c.transaction():
            c.execute("SET LOCAL rate_limiter.fake_now = '2031-01-01 00:00:00+00'")
            assert c.execute("SHOW rate_limiter.fake_now").fetchone() == ("2031-01-01 00:00:00+00",)
