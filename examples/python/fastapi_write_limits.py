"""A write limit behind a FastAPI handler: the table holds its writes to 2 messages per author
an hour (rate_limiter.limit_writes), so the handler only inserts; a statement over the limit
fails whole with SQLSTATE RL429, which the handler turns into an HTTP 429 with Retry-After.
A job, an admin tool or a PostgREST client writing the same table is held to the same limit.

Run: uvicorn fastapi_write_limits:app --port 8766 (the libpq environment names the database).
"""

import json
from contextlib import asynccontextmanager

import psycopg
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from psycopg_pool import ConnectionPool

pool = ConnectionPool("", min_size=1, max_size=4, open=False)  # libpq reads PGHOST, PGPORT, ...


@asynccontextmanager
async def lifespan(_app):
    pool.open()
    with pool.connection() as conn:
        # Declared once, by the table's owner.
        conn.execute("SELECT rate_limiter.define('fastapi_messages', 'fixed window', 2, '1 hour')")
        conn.execute("CREATE TABLE IF NOT EXISTS fastapi_messages (author text NOT NULL, body text NOT NULL)")
        conn.execute("SELECT rate_limiter.limit_writes('fastapi_messages', 'fastapi_messages', key => 'author')")
    yield
    pool.close()


app = FastAPI(lifespan=lifespan)


class RateLimited(Exception):
    def __init__(self, retry_after_ms):
        self.retry_after_ms = retry_after_ms


@app.exception_handler(RateLimited)
async def rate_limited(_request: Request, e: RateLimited):
    seconds = max(1, -(-int(e.retry_after_ms) // 1000))  # rounded up
    return JSONResponse({"error": "rate limited", "retry_after_ms": e.retry_after_ms}, status_code=429,
                        headers={"Retry-After": str(seconds)})


@app.post("/messages/{author}")
def post_messages(author: str, body: list[str]):
    """All the bodies in one statement: all stored, or none (429)."""
    with pool.connection() as conn, conn.transaction():
        try:
            conn.execute("INSERT INTO fastapi_messages SELECT %s, b FROM unnest(%s::text[]) b", [author, body])
        except psycopg.Error as e:
            if e.sqlstate != "RL429":
                raise
            raise RateLimited(json.loads(e.diag.message_detail)["retryAfter"]) from e
    return {"stored": len(body)}
