"""The examples in examples/ run as their users would run them, against the test cluster,
and print what examples/README.md shows."""

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psycopg
import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PYTHON = sys.executable


def run(*cmd, cwd):
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.splitlines()


@pytest.mark.parametrize("script", ["sqlalchemy_example.py", "django_example.py"])
def test_python_orm_examples(script):
    assert run(PYTHON, script, cwd=EXAMPLES / "python") == [
        "1. committed: ok=True, messages=['hello'], remaining=2.0",
        "2. rolled back: messages=['hello'], remaining=2.0",
        "3. RateLimited from SQLSTATE RL429: retry after 1200 s",
    ]


@pytest.fixture(scope="module")
def node_modules():
    """The Node examples' packages, as package-lock.json pins them."""
    run("npm", "ci", "--no-audit", "--no-fund", cwd=EXAMPLES / "node")


@pytest.mark.parametrize("script", ["pg_example.js", "knex_example.js"])
def test_node_examples(node_modules, script):
    assert run("node", script, cwd=EXAMPLES / "node") == [
        '1. committed: ok=true, messages=["hello"], remaining=2.00',
        '2. rolled back: messages=["hello"], remaining=2.00',
        "3. RateLimited from SQLSTATE RL429: retry after 1200 s",
    ]


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
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.time() < deadline, server.stdout.read() if server.poll() else "no start"
                time.sleep(0.1)
        status, headers = post(port, "/posts/alice?body=one")
        assert status == 200 and headers["ratelimit-policy"] == '"fastapi_post";q=2;w=3600'
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
