"""A storage for ``limits`` 5 (and so for Flask-Limiter and SlowAPI) kept by the rate_limiter
extension: ``storage_uri="rate-limiter+postgresql://user@host/db"``. Importing this module
registers the scheme (``import rate_limiter_postgres`` does).

Each of ``limits``' strategies maps to the extension's kind that keeps its promise:

- ``fixed-window``: a fixed window of the limit's amount per its period;
- ``moving-window``: a rolling window (at most the amount in any period, counted in cells,
  so an entry is forgotten late, never early);
- ``sliding-window-counter``: a sliding window (the previous window weighs as it slides out,
  and a hit is taken only when the weighted count plus the hit stays within the amount).

A hit that the window refuses takes nothing (``limits``' own storages count it); ``clear`` is
the extension's ``reset_rate_limit``, and ``reset`` (every key of every application at once)
is refused.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional

import psycopg
from limits.storage import MovingWindowSupport, SlidingWindowCounterSupport, Storage

from ._sync import RateLimiter


def _amount(key: str) -> int:
    """The limit's amount from a ``limits`` key: ``.../{amount}/{multiples}/{granularity}``."""
    try:
        return int(key.rsplit("/", 3)[-3])
    except (IndexError, ValueError):
        raise ValueError(f"not a key of limits 5 (…/amount/multiples/granularity): {key!r}") from None


class RateLimiterStorage(Storage, MovingWindowSupport, SlidingWindowCounterSupport):
    """``limits`` storage on the extension. Options: ``name`` (the limit name its keys are
    counted under, default ``limits``), ``schema``, ``durable`` (``False`` keeps the windows in
    the server's shared memory, a memory limit: no row and no WAL per hit; needs the extension
    preloaded with ``rate_limiter.memory_keys`` > 0, and refuses the moving window with
    0A000), and libpq connection parameters."""

    STORAGE_SCHEME = ["rate-limiter+postgresql", "rate-limiter+postgres"]

    def __init__(self, uri: str, wrap_exceptions: bool = False, **options: Any):
        self.name = str(options.pop("name", "limits"))
        self.schema = str(options.pop("schema", "rate_limiter"))
        self.durable = options.pop("durable", True) not in (False, "false", "False", "0", 0)
        # A libpq URI: what follows the scheme, as postgresql:// (empty: the libpq environment).
        self.conninfo = "postgresql://" + uri.split("://", 1)[-1] if "://" in uri else "postgresql://"
        self.connect_options = options
        self.local = threading.local()
        super().__init__(uri, wrap_exceptions=wrap_exceptions)

    @property
    def base_exceptions(self) -> type[Exception]:
        return psycopg.Error

    def _limiter(self) -> RateLimiter:
        """One autocommit connection per thread: each hit is its own transaction."""
        limiter = getattr(self.local, "limiter", None)
        if limiter is None or limiter.conn.closed:
            conn = psycopg.connect(self.conninfo, autocommit=True, **self.connect_options)
            limiter = self.local.limiter = RateLimiter(conn, self.schema)
        return limiter

    def _config(self, kind: str, limit: int, expiry: float) -> dict[str, Any]:
        config: dict[str, Any] = {"kind": kind, "rate": limit, "period": expiry * 1000}
        if not self.durable:
            config["durable"] = False
        return config

    def _hit(self, key: str, kind: str, limit: int, expiry: float, amount: int) -> bool:
        if amount > limit:
            return False  # more than the window holds: never granted, nothing taken
        return self._limiter().limit(self.name, key, amount, config=self._config(kind, limit, expiry)).ok

    def _used(self, key: str, kind: str, limit: int, expiry: float):
        return self._limiter().check(self.name, key, 0, config=self._config(kind, limit, expiry))

    # The fixed window.

    def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        """Hits counted in the key's window: more than the amount when this one was refused."""
        limit = _amount(key)
        if not self._hit(key, "fixed window", limit, expiry, amount):
            return limit + 1
        return round(limit - self._used(key, "fixed window", limit, expiry).remaining)

    def get(self, key: str) -> int:
        limit, expiry = _amount(key), self._expiry_of(key)
        return round(limit - self._used(key, "fixed window", limit, expiry).remaining)

    def get_expiry(self, key: str) -> float:
        limit, expiry = _amount(key), self._expiry_of(key)
        return time.time() + self._used(key, "fixed window", limit, expiry).reset_after / 1000

    def _expiry_of(self, key: str) -> float:
        """The period from a key's multiples and granularity, as ``limits`` counts them."""
        from limits.limits import GRANULARITIES

        _, _, multiples, granularity = key.rsplit("/", 3)
        return int(multiples) * GRANULARITIES[granularity].GRANULARITY.seconds

    def check(self) -> bool:
        try:
            self._limiter().conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def reset(self) -> Optional[int]:
        raise NotImplementedError(
            "rate-limiter+postgresql does not reset every key at once: clear keys one by one "
            "(rate_limiter.reset_rate_limit), or reset the limit's state in the database")

    def clear(self, key: str) -> None:
        self._limiter().reset(self.name, key)

    # The moving window, as a rolling window.

    def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        return self._hit(key, "rolling window", limit, expiry, amount)

    def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:
        d = self._used(key, "rolling window", limit, expiry)
        count = round(limit - d.remaining)
        return time.time() + d.reset_after / 1000 - expiry, count

    # The sliding window counter, as a sliding window.

    def acquire_sliding_window_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        return self._hit(key, "sliding window", limit, expiry, amount)

    def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        """The weighted count as the current window's (rounded up, so a test is never looser
        than a hit), with the time until the limit is whole again."""
        limit = _amount(key)
        d = self._used(key, "sliding window", limit, expiry)
        used = limit - d.remaining
        count = int(used) + (used % 1 > 0)
        return 0, 0.0, count, d.reset_after / 1000

    def clear_sliding_window(self, key: str, expiry: int) -> None:
        self.clear(key)
