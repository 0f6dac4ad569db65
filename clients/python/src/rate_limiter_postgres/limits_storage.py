"""A storage for ``limits`` 5 (and so for Flask-Limiter and SlowAPI) kept by the rate_limiter
extension: ``storage_uri="rate-limiter+postgresql://user@host/db"``. Importing this module
registers the scheme (``import rate_limiter_postgres`` does); ``limits_storage_aio`` is the
asynchronous one (``async+rate-limiter+postgresql://``, for ``limits.aio``).

Its connections come from a pool (psycopg_pool, ``pool_min_size`` to ``pool_max_size``,
closed with the storage or at exit). How each strategy maps to the extension: see
``_limits_common``. A hit that the window refuses takes nothing (``limits``' own storages
count it); ``clear`` is the extension's ``reset_rate_limit``, and ``reset`` (every key of every
application at once) is refused.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import psycopg
from limits.storage import MovingWindowSupport, SlidingWindowCounterSupport, Storage
from psycopg_pool import ConnectionPool

from . import _limits_common as common
from ._limits_common import FIXED, MOVING, SLIDING
from ._sync import RateLimiter


class RateLimiterStorage(Storage, MovingWindowSupport, SlidingWindowCounterSupport):
    """``limits`` storage on the extension; options: ``_limits_common.StorageOptions``."""

    STORAGE_SCHEME = ["rate-limiter+postgresql", "rate-limiter+postgres"]

    def __init__(self, uri: str, wrap_exceptions: bool = False, **options: Any):
        self.options = common.StorageOptions.parse(uri, options)
        o = self.options
        self.pool = ConnectionPool(o.conninfo, kwargs=o.connect, min_size=o.pool_min_size, max_size=o.pool_max_size,
                                   timeout=o.pool_timeout, check=ConnectionPool.check_connection, open=True,
                                   name=f"rate-limiter+postgresql {o.name}")
        # Closed when the storage is collected or at exit; the callback holds the pool, not self.
        self._close = weakref.finalize(self, self.pool.close)
        self._granted = False
        super().__init__(uri, wrap_exceptions=wrap_exceptions)

    @property
    def base_exceptions(self) -> type[Exception]:
        return psycopg.Error

    def close(self) -> None:
        self._close()

    @contextmanager
    def _limiter(self) -> Iterator[RateLimiter]:
        with self.pool.connection() as conn:
            limiter = RateLimiter(conn, self.options.schema)
            if not self._granted:
                role, missing = limiter.missing_grants(list(common.NEEDED_GRANTS))
                if missing:
                    raise common.grants_error(role, missing, self.options.schema)
                self._granted = True
            yield limiter

    def _hit(self, key: str, kind: str, limit: int, expiry: float, amount: int) -> bool:
        if amount > limit:
            return False  # more than the window holds: never granted, nothing taken
        with self._limiter() as rl:
            return rl.limit(self.options.name, key, amount, config=self.options.config(kind, limit, expiry)).ok

    def _used(self, key: str, kind: str, limit: int, expiry: float):
        with self._limiter() as rl:
            return rl.check(self.options.name, key, 0, config=self.options.config(kind, limit, expiry))

    # The fixed window.

    def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        """Hits counted in the key's window: more than the amount when this one was refused."""
        limit = common.amount(key)
        if not self._hit(key, FIXED, limit, expiry, amount):
            return limit + 1
        return common.used(limit, self._used(key, FIXED, limit, expiry))

    def get(self, key: str) -> int:
        limit = common.amount(key)
        return common.used(limit, self._used(key, FIXED, limit, common.period(key)))

    def get_expiry(self, key: str) -> float:
        return common.expiry(self._used(key, FIXED, common.amount(key), common.period(key)))

    def check(self) -> bool:
        try:
            with self.pool.connection() as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def reset(self) -> Optional[int]:
        raise NotImplementedError(common.RESET_REFUSED)

    def clear(self, key: str) -> None:
        with self._limiter() as rl:
            rl.reset(self.options.name, key)

    # The moving window, as a rolling window.

    def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        return self._hit(key, MOVING, limit, expiry, amount)

    def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:
        return common.moving_window(limit, expiry, self._used(key, MOVING, limit, expiry))

    # The sliding window counter, as a sliding window.

    def acquire_sliding_window_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        return self._hit(key, SLIDING, limit, expiry, amount)

    def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        limit = common.amount(key)
        return common.sliding_window(limit, self._used(key, SLIDING, limit, expiry))

    def clear_sliding_window(self, key: str, expiry: int) -> None:
        self.clear(key)
