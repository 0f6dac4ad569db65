"""The asynchronous storage for ``limits.aio`` (async SlowAPI, FastAPI):
``storage_uri="async+rate-limiter+postgresql://user@host/db"``, with the synchronous storage's
options and answers (``limits_storage``). Its pool (psycopg_pool's ``AsyncConnectionPool``)
opens in the event loop of the first call, and again in another loop (a pool belongs to the
loop that opened it); ``await storage.aclose()`` closes it.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Optional

import psycopg
from limits.aio.storage import MovingWindowSupport, SlidingWindowCounterSupport, Storage
from psycopg_pool import AsyncConnectionPool

from . import _limits_common as common
from ._async import AsyncRateLimiter
from ._limits_common import FIXED, MOVING, SLIDING


class AsyncRateLimiterStorage(Storage, MovingWindowSupport, SlidingWindowCounterSupport):
    """``limits.aio`` storage on the extension; options: ``_limits_common.StorageOptions``."""

    STORAGE_SCHEME = ["async+rate-limiter+postgresql", "async+rate-limiter+postgres"]

    def __init__(self, uri: str, wrap_exceptions: bool = False, **options: Any):
        self._min_size = int(options.pop("pool_min_size", 0))
        self.options = common.StorageOptions.parse(uri, options)
        self._pool: Optional[AsyncConnectionPool] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._granted = False
        super().__init__(uri, wrap_exceptions=wrap_exceptions)

    @property
    def base_exceptions(self) -> type[Exception]:
        return psycopg.Error

    async def _pool_here(self) -> AsyncConnectionPool:
        loop = asyncio.get_running_loop()
        if self._pool is None or self._loop is not loop:
            o = self.options
            # open=False, then open in this loop: its workers and locks are this loop's. No
            # connection is made in the background (min_size 0 unless asked): a loop that ends
            # without aclose() then cancels only idle tasks, never a connection attempt.
            self._pool = AsyncConnectionPool(o.conninfo, kwargs=o.connect, min_size=self._min_size,
                                             max_size=o.pool_max_size, timeout=o.pool_timeout,
                                             check=AsyncConnectionPool.check_connection, open=False,
                                             name=f"async+rate-limiter+postgresql {o.name}")
            self._loop = loop
            await self._pool.open()
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
