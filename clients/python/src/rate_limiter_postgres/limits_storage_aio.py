"""The asynchronous storage for ``limits.aio`` (async SlowAPI, FastAPI):
``storage_uri="async+rate-limiter+postgresql://user@host/db"``, with the synchronous storage's
options and answers (``limits_storage``). Its connections are pooled per event loop, at most
``pool_max_size``, each made when a call needs one, in the caller's task: the pool runs no
task of its own, so a loop that ends without ``await storage.aclose()`` (limits never closes
a storage) has nothing of the storage's to wait for. (psycopg_pool's ``AsyncConnectionPool``
grows in background tasks, which an ending loop waited on for good in a connection attempt.)
"""

from __future__ import annotations

import asyncio
import weakref
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Optional

import psycopg
from limits.aio.storage import MovingWindowSupport, SlidingWindowCounterSupport, Storage

from . import _limits_common as common
from ._async import AsyncRateLimiter
from ._limits_common import FIXED, MOVING, SLIDING


def _finish(idle: list) -> None:
    for conn in idle:
        conn.pgconn.finish()
    idle.clear()


class _LoopPool:
    """The connections of one event loop: at most `options.pool_max_size`, idle ones reused,
    a connection whose call raised closed instead of reused."""

    def __init__(self, options: common.StorageOptions):
        self.options = options
        self.idle: list[psycopg.AsyncConnection] = []
        self.slots = asyncio.Semaphore(options.pool_max_size)
        # Collected (its storage, or its loop, gone) without aclose(): the idle connections
        # are ended at once, without a loop, as libpq's PQfinish ends them.
        weakref.finalize(self, _finish, self.idle)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        try:
            await asyncio.wait_for(self.slots.acquire(), self.options.pool_timeout)
        except asyncio.TimeoutError:
            raise psycopg.OperationalError(
                f"no connection of async+rate-limiter+postgresql free within {self.options.pool_timeout} s "
                f"(pool_max_size {self.options.pool_max_size}, pool_timeout)") from None
        conn: Optional[psycopg.AsyncConnection] = None
        try:
            while self.idle and conn is None:
                candidate = self.idle.pop()
                if not candidate.closed and not candidate.broken:
                    conn = candidate
            if conn is None:
                conn = await psycopg.AsyncConnection.connect(self.options.conninfo, **self.options.connect)
            yield conn
            self.idle.append(conn)
            conn = None
        finally:
            if conn is not None:
                await conn.close()
            self.slots.release()

    async def close(self) -> None:
        while self.idle:
            await self.idle.pop().close()


class AsyncRateLimiterStorage(Storage, MovingWindowSupport, SlidingWindowCounterSupport):
    """``limits.aio`` storage on the extension; options: ``_limits_common.StorageOptions``."""

    STORAGE_SCHEME = ["async+rate-limiter+postgresql", "async+rate-limiter+postgres"]

    def __init__(self, uri: str, wrap_exceptions: bool = False, **options: Any):
        self.options = common.StorageOptions.parse(uri, options)
        self._pool: Optional[_LoopPool] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._granted = False
        super().__init__(uri, wrap_exceptions=wrap_exceptions)

    @property
    def base_exceptions(self) -> type[Exception]:
        return psycopg.Error

    async def _pool_here(self) -> _LoopPool:
        loop = asyncio.get_running_loop()
        if self._pool is None or self._loop is not loop:
            # A connection belongs to the loop it was made in.
            self._pool, self._loop = _LoopPool(self.options), loop
        return self._pool

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @asynccontextmanager
    async def _limiter(self) -> AsyncIterator[AsyncRateLimiter]:
        async with (await self._pool_here()).connection() as conn:
            limiter = AsyncRateLimiter(conn, self.options.schema)
            if not self._granted:
                role, missing = await limiter.missing_grants(list(common.NEEDED_GRANTS))
                if missing:
                    raise common.grants_error(role, missing, self.options.schema)
                self._granted = True
            yield limiter

    async def _hit(self, key: str, kind: str, limit: int, expiry: float, amount: int) -> bool:
        if amount > limit:
            return False  # more than the window holds: never granted, nothing taken
        async with self._limiter() as rl:
            return (await rl.limit(self.options.name, key, amount, config=self.options.config(kind, limit, expiry))).ok

    async def _used(self, key: str, kind: str, limit: int, expiry: float):
        async with self._limiter() as rl:
            return await rl.check(self.options.name, key, 0, config=self.options.config(kind, limit, expiry))

    async def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        limit = common.amount(key)
        if not await self._hit(key, FIXED, limit, expiry, amount):
            return limit + 1
        return common.used(limit, await self._used(key, FIXED, limit, expiry))

    async def get(self, key: str) -> int:
        limit = common.amount(key)
        return common.used(limit, await self._used(key, FIXED, limit, common.period(key)))

    async def get_expiry(self, key: str) -> float:
        return common.expiry(await self._used(key, FIXED, common.amount(key), common.period(key)))

    async def check(self) -> bool:
        try:
            async with (await self._pool_here()).connection() as conn:
                await conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    async def reset(self) -> Optional[int]:
        raise NotImplementedError(common.RESET_REFUSED)

    async def clear(self, key: str) -> None:
        async with self._limiter() as rl:
            await rl.reset(self.options.name, key)

    async def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        return await self._hit(key, MOVING, limit, expiry, amount)

    async def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:
        return common.moving_window(limit, expiry, await self._used(key, MOVING, limit, expiry))

    async def acquire_sliding_window_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        return await self._hit(key, SLIDING, limit, expiry, amount)

    async def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        limit = common.amount(key)
        return common.sliding_window(limit, await self._used(key, SLIDING, limit, expiry))

    async def clear_sliding_window(self, key: str, expiry: int) -> None:
        await self.clear(key)
