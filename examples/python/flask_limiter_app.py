"""Flask-Limiter with its counts in Postgres (the rate-limiter+postgresql:// storage of
rate-limiter-postgres), and a limit taken inside the request's own transaction. Run from an
install of the package (clients/python); it serves on loopback, asks three times each, and
exits."""

import os
import threading
import urllib.error
import urllib.request

import psycopg
from flask import Flask, request
from flask_limiter import Limiter
from flask_limiter.util import get_remote_address
from werkzeug.serving import make_server

import rate_limiter_postgres  # registers rate-limiter+postgresql:// with limits
from rate_limiter_postgres import RateLimiter

NAME = f"example_{os.getpid()}"
app = Flask(__name__)
# The libpq environment names the database; the URI only says which storage.
limiter = Limiter(get_remote_address, app=app, storage_uri="rate-limiter+postgresql://", strategy="moving-window",
                  storage_options={"name": NAME})


@app.get("/hello")
@limiter.limit("2/minute")
def hello():
    return "hello"


@app.post("/messages")
@limiter.exempt
def send():
    # One transaction: the limit and the write commit or roll back together.
    with psycopg.connect() as conn:
        d = RateLimiter(conn).limit(NAME + "_send", "alice", config={"kind": "fixed window", "rate": 1, "period": 3600000})
        if not d.ok:
            return "slow down", 429, {"Retry-After": str(-(-int(d.retry_after) // 1000))}
        if request.args.get("fail"):
            conn.rollback()
            return "failed", 500
    return "sent"


@app.get("/plan")
@limiter.exempt
def plan():
    # A named limit, whose keys' plans are the administrator's rows (rate_limiter.override):
    # a customer moved to another plan mid-window needs no change here, and keeps its count.
    with psycopg.connect() as conn:
        d = RateLimiter(conn).limit(NAME + "_plan", request.remote_addr)
    return ("hello", 200) if d.ok else ("slow down", 429)


def status(url, method="GET"):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


server = make_server("127.0.0.1", 0, app, threaded=True)
threading.Thread(target=server.serve_forever, daemon=True).start()
base = f"http://127.0.0.1:{server.server_port}"
print("1. Flask-Limiter:", " ".join(str(status(f"{base}/hello")) for _ in range(3)))
print("2. in the transaction:", " ".join(str(status(base + p, "POST")) for p in ["/messages?fail=1", "/messages", "/messages"]))
# 3. Two requests in 30 days, then the client moves to the 'pro' tier (5) mid-window.
with psycopg.connect(autocommit=True) as admin:
    admin.execute("SELECT rate_limiter.define(%s, 'sliding window', 2, '30 days')", [NAME + "_plan"])
    admin.execute("SELECT rate_limiter.define_tier(%s, 'pro', rate => 5)", [NAME + "_plan"])
    before = [status(f"{base}/plan") for _ in range(3)]
    admin.execute("SELECT rate_limiter.override(%s, '127.0.0.1', tier => 'pro')", [NAME + "_plan"])
    after = [status(f"{base}/plan") for _ in range(4)]
    admin.execute("DELETE FROM rate_limiter.limits WHERE name = %s", [NAME + "_plan"])
print("3. a plan changed mid-window:", " ".join(map(str, before)), "|", " ".join(map(str, after)))
server.shutdown()
