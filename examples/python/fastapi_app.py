"""rate_limiter in a FastAPI request handler: the limit is taken in the request's
transaction beside its write, and a denial is an HTTP 429 with Retry-After and the
draft's RateLimit headers (rate_limiter.http_headers).

Run: uvicorn fastapi_app:app --port 8765 (the libpq environment names the database).
"""

import json
from contextlib import asynccontextmanager

import psycopg
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from psycopg_pool import ConnectionPool

pool = ConnectionPool("", min_size=1, max_size=4, open=False)  # libpq reads PGHOST, PGPORT, ...


@asynccontextmanager
async def lifespan(_app):
    pool.open()
    with pool.connection() as conn:
        conn.execute("SELECT rate_limiter.define('fastapi_post', 'token bucket', 2, '1 hour')")
        conn.execute("CREATE TABLE IF NOT EXISTS fastapi_posts (author text, body text)")
    yield
    pool.close()


app = FastAPI(lifespan=lifespan)


class RateLimited(Exception):
    def __init__(self, retry_after_ms, headers):
        self.retry_after_ms, self.headers = retry_after_ms, headers


@app.exception_handler(RateLimited)
async def rate_limited(_request: Request, e: RateLimited):
    return JSONResponse({"error": "rate limited", "retry_after_ms": e.retry_after_ms}, status_code=429,
                        headers=e.headers)


@app.post("/posts/{author}")
def create_post(author: str, body: str, response: Response, fail: bool = False):
    # One transaction per request: the limit, the write and their fate together.
    with pool.connection() as conn, conn.transaction():
        try:
            headers = conn.execute(
                "SELECT rate_limiter.http_headers('fastapi_post', "
                "rate_limiter.rate_limit('fastapi_post', %s, throws => true))", [author]).fetchone()[0]
        except psycopg.Error as e:
            if e.sqlstate != "RL429":
                raise
            retry_after_ms = json.loads(e.diag.message_detail)["retryAfter"]
            raise RateLimited(retry_after_ms, {"Retry-After": str(max(1, -(-int(retry_after_ms) // 1000)))}) from e
        conn.execute("INSERT INTO fastapi_posts VALUES (%s, %s)", [author, body])
        if fail:
            raise HTTPException(500, "the application failed after the limit was taken")
    response.headers.update(headers)
    return {"stored": body}
