"""The libraries driven for real over loopback HTTP: Flask-Limiter with each of limits'
strategies on the rate-limiter+postgresql:// storage, SlowAPI on FastAPI, and this package's
Starlette dependency."""

import asyncio
import gc
import socket
import threading
import time
import urllib.error
import urllib.request
import warnings

import asyncpg
import psycopg
import pytest
import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from flask import Flask
from flask_limiter import Limiter as FlaskLimiter
from flask_limiter.util import get_remote_address
from limits.storage import storage_from_string
from slowapi import Limiter as SlowLimiter
from slowapi import _rate_limit_exceeded_handler
from slowapi.errors import RateLimitExceeded
from werkzeug.serving import make_server

from conftest import DB, HOST, PORT, USER
import rate_limiter_postgres  # noqa: F401 - registers the storage scheme
from rate_limiter_postgres.starlette import rate_limit


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.headers


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("strategy", ["fixed-window", "moving-window", "sliding-window-counter"])
def test_flask_limiter_on_the_extension_answers_429_in_each_strategy(storage_uri, name, strategy):
    app = Flask(__name__)
    limiter = FlaskLimiter(get_remote_address, app=app, storage_uri=storage_uri, strategy=strategy,
                           headers_enabled=True, key_prefix=name, storage_options={"name": "flask"})

    @app.get("/")
    @limiter.limit("2/minute")
    def index():
        return "hello"

    @app.get("/fail")
    @limiter.limit("2/minute")
    def fail():
        raise RuntimeError("the view failed after its hit was counted")

    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/"
        answers = [get(url) for _ in range(3)]
        denied_at = time.time()
        assert [a[0] for a in answers] == [200, 200, 429]
        assert answers[0][1]["X-RateLimit-Remaining"] == "1"
        # Flask-Limiter writes int(reset_at - now) with reset_at in whole seconds: 0 when the
        # window ends within the second; a moving window's reset is the whole limit back (< 2 periods).
        retry_after, reset_at = int(answers[2][1]["Retry-After"]), int(answers[2][1]["X-RateLimit-Reset"])
        assert 0 <= retry_after <= 120
        assert abs(reset_at - (denied_at + retry_after)) <= 2
        # A view that fails keeps its hit: each commits on the storage's connection.
        assert [get(f"{url}fail")[0] for _ in range(3)] == [500, 500, 429]
    finally:
        server.shutdown()


@pytest.mark.parametrize("strategy", ["fixed-window", "sliding-window-counter"])
def test_flask_limiter_on_a_memory_limit_answers_alike_and_writes_no_row(storage_uri, name, strategy):
    """storage_options durable=False: the windows in the server's shared memory."""
    app = Flask(__name__)
    limiter = FlaskLimiter(get_remote_address, app=app, storage_uri=storage_uri, strategy=strategy,
                           key_prefix=name, storage_options={"name": f"flask_{name}", "durable": False})

    @app.get("/")
    @limiter.limit("2/minute")
    def index():
        return "hello"

    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert [get(f"http://127.0.0.1:{server.server_port}/")[0] for _ in range(3)] == [200, 200, 429]
    finally:
        server.shutdown()
    with psycopg.connect(host=HOST, port=PORT, user=USER, dbname=DB) as conn:
        assert conn.execute("SELECT count(*) FROM rate_limiter.state WHERE name LIKE %s",
                            (f"flask_{name}%",)).fetchone() == (0,)


def test_the_storage_refuses_to_reset_everything_and_clears_one_key(storage_uri, name):
    storage = storage_from_string(storage_uri)
    key = f"LIMITER/{name}/1/1/minute"
    assert storage.incr(key, 60) == 1
    assert storage.incr(key, 60) == 2, "refused: one over the amount, nothing taken"
    assert storage.get(key) == 1
    storage.clear(key)
    assert storage.get(key) == 0
    with pytest.raises(NotImplementedError):
        storage.reset()
    assert storage.check()


def test_the_limits_storage_honours_the_administrators_override_of_its_name_unchanged(storage_uri, name, conn):
    """The storage passes limits' numbers inline; an override of (its name, limits' key for a
    client) still gives that client its plan (docs/api.md, Overrides), with no change here."""
    from limits import RateLimitItemPerMinute
    from limits.strategies import MovingWindowRateLimiter

    conn.execute("SELECT rate_limiter.define(%s, 'rolling window', 2, '1 minute')", (name,))
    conn.execute("SELECT rate_limiter.override(%s, 'LIMITER/pro-customer/2/1/minute', rate => 5)", (name,))
    storage = storage_from_string(storage_uri, name=name)
    limiter = MovingWindowRateLimiter(storage)
    item = RateLimitItemPerMinute(2)
    assert [limiter.hit(item, "pro-customer") for _ in range(6)] == [True] * 5 + [False]
    assert [limiter.hit(item, "free-customer") for _ in range(3)] == [True, True, False]
    storage.close()


def test_slowapi_and_the_starlette_dependency_on_fastapi_answer_429(storage_uri, name):
    slow = SlowLimiter(key_func=lambda request: name, storage_uri=storage_uri, headers_enabled=True)
    pools = {}

    async def lifespan(_app):
        pools["pg"] = await asyncpg.create_pool(host=HOST, port=int(PORT), user=USER, database=DB, min_size=1, max_size=2)
        yield
        await pools["pg"].close()

    app = FastAPI(lifespan=lifespan)
    app.state.limiter = slow
    app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)

    @app.get("/slow")
    @slow.limit("2/minute")
    async def slow_route(request: Request, response: Response):
        return {"ok": True}

    limited = rate_limit(name, key=lambda request: "client", db=lambda request: pools["pg"],
                         config={"kind": "fixed window", "rate": 2, "period": 60000})

    @app.get("/dep")
    async def dep_route(d=Depends(limited)):
        return {"remaining": d.remaining}

    guarded = rate_limit(name + "_fail", key=lambda request: "client", db=lambda request: pools["pg"],
                         config={"kind": "fixed window", "rate": 2, "period": 60000})

    @app.get("/missing")
    async def missing_route(d=Depends(guarded)):
        raise HTTPException(status_code=404)  # a wrong guess: its token stays taken

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        base = f"http://127.0.0.1:{port}"
        answers = [get(f"{base}/slow") for _ in range(3)]
        assert [a[0] for a in answers] == [200, 200, 429]
        assert answers[1][1]["X-RateLimit-Remaining"] == "0"
        answers = [get(f"{base}/dep") for _ in range(3)]
        assert [a[0] for a in answers] == [200, 200, 429]
        assert answers[0][1]["RateLimit"].startswith(f'"{name}";r=1')
        assert int(answers[2][1]["Retry-After"]) > 0
        assert [get(f"{base}/missing")[0] for _ in range(3)] == [404, 404, 429]
    finally:
        server.should_exit = True
        thread.join(10)


def test_flask_limiter_on_a_threaded_server_shares_a_bounded_pool_and_leaves_no_connection_open(storage_uri, name):
    """Werkzeug serves each request on a thread of its own: the storage's connections come from
    its pool (at most pool_max_size), not one per request thread, and closing it closes them."""
    app = Flask(__name__)
    limiter = FlaskLimiter(get_remote_address, app=app, storage_uri=storage_uri, key_prefix=name,
                           storage_options={"name": f"flask_{name}", "pool_max_size": 4})

    @app.get("/")
    @limiter.limit("100/minute")
    def index():
        return "hello"

    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            statuses = [get(f"http://127.0.0.1:{server.server_port}/")[0] for _ in range(50)]
        finally:
            server.shutdown()
        storage = limiter._storage
        assert statuses == [200] * 50
        stats = storage.pool.get_stats()
        assert stats["connections_num"] <= 4, stats
        storage.close()
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]


def test_the_async_storage_for_limits_aio_counts_as_the_sync_one(storage_uri, name):
    from limits import RateLimitItemPerMinute
    from limits.aio.strategies import MovingWindowRateLimiter

    async def main():
        storage = storage_from_string("async+" + storage_uri, name=name)
        limiter = MovingWindowRateLimiter(storage)
        item = RateLimitItemPerMinute(3)
        assert [await limiter.hit(item, "k") for _ in range(4)] == [True, True, True, False]
        assert (await limiter.get_window_stats(item, "k")).remaining == 0
        await storage.aclose()

    asyncio.run(main())
    sync = storage_from_string(storage_uri, name=name)
    assert sync.get_moving_window("LIMITER/k/3/1/minute", 3, 60)[1] == 3, "the same rows as the sync storage's"
    sync.close()


def test_a_storage_whose_role_lacks_a_grant_fails_at_its_first_call_naming_the_grant(storage_uri, name, conn):
    role = f"rl_py_{name}"
    conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        conn.execute(f"GRANT USAGE ON SCHEMA rate_limiter TO {role}")
        conn.execute(f"""DO $$ DECLARE f regprocedure; BEGIN
            FOR f IN SELECT p.oid FROM pg_proc p WHERE p.pronamespace = 'rate_limiter'::regnamespace
              AND p.proname = 'rate_limit' LOOP EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO {role}', f); END LOOP; END $$""")
        storage = storage_from_string(storage_uri.replace(f"://{USER}@", f"://{role}@"), name=name)
        with pytest.raises(PermissionError, match=rf"may not execute rate_limiter\.check_rate_limit .*GRANT EXECUTE ON FUNCTION "
                                                  rf"rate_limiter\.check_rate_limit TO {role};"):
            storage.incr(f"LIMITER/{name}/2/1/minute", 60)
        storage.close()
    finally:
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")
