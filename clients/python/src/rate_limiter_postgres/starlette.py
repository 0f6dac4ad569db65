"""A Starlette/FastAPI dependency that takes a limit for each request and answers 429 with the
extension's ``RateLimit-Policy``, ``RateLimit`` and ``Retry-After`` headers:

    api_limit = rate_limit("api", key=lambda request: request.client.host, db=pool)

    @app.get("/items")
    async def items(d: Decision = Depends(api_limit)): ...

``db`` is an asyncpg ``Pool`` or ``Connection``, a psycopg ``AsyncConnection``, or a
psycopg_pool ``AsyncConnectionPool``; or a function of the request giving one of those (the
request's own connection, so that the limit is part of its transaction).
"""

from __future__ import annotations

import inspect
from typing import Any, Awaitable, Callable, Optional, Union

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ._async import AsyncRateLimiter
from ._decision import Decision

Db = Union[Any, Callable[[Request], Union[Any, Awaitable[Any]]]]


async def _decide(conn: Any, schema: str, name: str, key: Optional[str], count: float,
                  config: Optional[dict[str, Any]]) -> tuple[Decision, dict[str, str]]:
    limiter = AsyncRateLimiter(conn, schema)
    d = await limiter.limit(name, key, count, config=config)
    return d, await limiter.headers(name, d, config=config)


def rate_limit(name: str, *, key: Callable[[Request], Optional[str]], db: Db, count: float = 1,
               config: Optional[dict[str, Any]] = None, schema: str = "rate_limiter"):
    """A dependency taking ``count`` from (name, key(request)); a denial raises ``HTTPException(429)``."""

    async def dependency(request: Request, response: Response) -> Decision:
        handle = db(request) if callable(db) and not hasattr(db, "fetchrow") and not hasattr(db, "cursor") else db
        if inspect.isawaitable(handle):
            handle = await handle
        if hasattr(handle, "connection") and not hasattr(handle, "cursor") and not hasattr(handle, "fetchrow"):
            async with handle.connection() as conn:  # a psycopg_pool AsyncConnectionPool
                d, headers = await _decide(conn, schema, name, key(request), count, config)
        else:
            d, headers = await _decide(handle, schema, name, key(request), count, config)
        if not d.ok:
            raise HTTPException(429, detail=f"rate limit \"{name}\" exceeded", headers=headers)
        response.headers.update(headers)
        return d

    return dependency
