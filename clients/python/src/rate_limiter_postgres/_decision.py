"""What every call answers, and the error a denial raises with ``throws``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class Decision:
    """The answer of a consuming call or a check; times in milliseconds."""

    ok: bool
    #: When a retry could succeed; ``None`` when there is nothing to wait for.
    retry_after: Optional[float]
    remaining: float
    reset_after: float
    granted: float
    #: Why it was denied (``'exhausted'``, ``'blocked'``, ...), or ``'allowed'``/``'shadow'`` when ok.
    reason: Optional[str]
    limited_by: Optional[str]

    @classmethod
    def from_row(cls, row: Any) -> "Decision":
        return cls(*row[:7])


@dataclass(frozen=True)
class Acquired(Decision):
    """A concurrency limit's answer, with its lease's id when one was taken."""

    lease_id: Optional[str] = None

    @classmethod
    def from_row(cls, row: Any) -> "Acquired":
        lease = row[7]
        return cls(*row[:7], lease_id=None if lease is None else str(lease))


class RateLimited(Exception):
    """A denial raised by the extension as SQLSTATE RL429 (``throws=True``)."""

    sqlstate = "RL429"

    def __init__(self, message: str, detail: dict[str, Any]):
        super().__init__(message)
        self.limit: str = detail.get("name", "")
        self.key: Optional[str] = detail.get("key")
        #: Milliseconds until a retry could succeed; ``None`` while the key is blocked for good.
        self.retry_after: Optional[float] = detail.get("retryAfter")
        self.reason: str = detail.get("reason", "exhausted")


def as_rate_limited(error: BaseException) -> BaseException:
    """The ``RateLimited`` of a driver's error with SQLSTATE RL429 (psycopg or asyncpg); any other as it is."""
    # Django re-raises the driver's error as its own, the driver's as the cause; psycopg2
    # says pgcode where psycopg and asyncpg say sqlstate.
    driver = error
    while driver is not None and (getattr(driver, "sqlstate", None) or getattr(driver, "pgcode", None)) is None:
        driver = driver.__cause__
    if driver is None or (getattr(driver, "sqlstate", None) or getattr(driver, "pgcode", None)) != "RL429":
        return error
    error = driver
    diag = getattr(error, "diag", None)
    detail = getattr(diag, "message_detail", None) if diag is not None else getattr(error, "detail", None)
    message = getattr(diag, "message_primary", None) if diag is not None else getattr(error, "message", None)
    try:
        parsed = json.loads(detail or "{}")
    except ValueError:
        parsed = {}
    return RateLimited(message or str(error), parsed)
