"""What ``limits``' storage API asks, in the extension's terms, for the synchronous storage
(``limits_storage``) and the asynchronous one (``limits_storage_aio``): the options of a
storage URI, a key's amount and period, the inline config of each strategy and the answers
limits expects from the extension's decisions.

Each of ``limits``' strategies maps to the extension's kind that keeps its promise:

- ``fixed-window``: a fixed window of the limit's amount per its period (the extension phases
  each key's windows: a key's first window may end sooner than a whole period after its first
  hit, where ``limits``' own storages start the window at that hit);
- ``moving-window``: a rolling window (at most the amount in any period, counted in cells,
  so an entry is forgotten late, never early);
- ``sliding-window-counter``: a sliding window (the previous window weighs as it slides out,
  and a hit is taken only when the weighted count plus the hit stays within the amount).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ._decision import Decision

FIXED, MOVING, SLIDING = "fixed window", "rolling window", "sliding window"

# What the storage calls, and what for: checked once per storage, at its first call.
NEEDED_GRANTS = {"rate_limit": "every hit", "check_rate_limit": "counts, tests and window stats"}


@dataclass
class StorageOptions:
    """A storage URI's options: ``name`` (the limit name its keys are counted under, default
    ``limits``), ``schema``, ``durable`` (``False``: a memory limit), the pool's
    ``pool_min_size`` (1), ``pool_max_size`` (10) and ``pool_timeout`` (seconds to wait for a
    connection, 5), and libpq connection parameters for the rest."""

    conninfo: str
    name: str = "limits"
    schema: str = "rate_limiter"
    durable: bool = True
    pool_min_size: int = 1
    pool_max_size: int = 10
    pool_timeout: float = 5.0
    connect: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, uri: str, options: dict[str, Any]) -> "StorageOptions":
        options = dict(options)
        # A libpq URI: what follows the scheme, as postgresql:// (empty: the libpq environment).
        conninfo = "postgresql://" + uri.split("://", 1)[-1] if "://" in uri else "postgresql://"
        return cls(
            conninfo=conninfo,
            name=str(options.pop("name", "limits")),
            schema=str(options.pop("schema", "rate_limiter")),
            durable=options.pop("durable", True) not in (False, "false", "False", "0", 0),
            pool_min_size=int(options.pop("pool_min_size", 1)),
            pool_max_size=int(options.pop("pool_max_size", 10)),
            pool_timeout=float(options.pop("pool_timeout", 5.0)),
            connect={"autocommit": True, **options},  # each hit is its own transaction
        )

    def config(self, kind: str, limit: int, expiry: float) -> dict[str, Any]:
        config: dict[str, Any] = {"kind": kind, "rate": limit, "period": expiry * 1000}
        if not self.durable:
            config["durable"] = False
        return config


def amount(key: str) -> int:
    """The limit's amount from a ``limits`` key: ``.../{amount}/{multiples}/{granularity}``."""
    try:
        return int(key.rsplit("/", 3)[-3])
    except (IndexError, ValueError):
        raise ValueError(f"not a key of limits 5 (…/amount/multiples/granularity): {key!r}") from None


def period(key: str) -> float:
    """The period from a key's multiples and granularity, as ``limits`` counts them."""
    from limits.limits import GRANULARITIES

    _, _, multiples, granularity = key.rsplit("/", 3)
    return int(multiples) * GRANULARITIES[granularity].GRANULARITY.seconds


def used(limit: int, d: Decision) -> int:
    """The hits a window counts."""
    return round(limit - d.remaining)


def expiry(d: Decision) -> float:
    """When the key's window is whole again, as a UNIX time."""
    return time.time() + d.reset_after / 1000


def moving_window(limit: int, period_s: float, d: Decision) -> tuple[float, int]:
    return time.time() + d.reset_after / 1000 - period_s, used(limit, d)


def sliding_window(limit: int, d: Decision) -> tuple[int, float, int, float]:
    """The weighted count as the current window's (rounded up, so a test is never looser than
    a hit), with the time until the limit is whole again."""
    taken = limit - d.remaining
    return 0, 0.0, int(taken) + (taken % 1 > 0), d.reset_after / 1000


def grants_error(role: str, missing: list[str], schema: str) -> PermissionError:
    what = ", ".join(f"{schema}.{fn} ({NEEDED_GRANTS[fn]})" for fn in missing)
    grants = " ".join(f"GRANT EXECUTE ON FUNCTION {schema}.{fn} TO {role};" for fn in missing)
    return PermissionError(f"rate-limiter+postgresql: the role {role} may not execute {what}. "
                           f"As its owner: GRANT USAGE ON SCHEMA {schema} TO {role}; {grants}")


RESET_REFUSED = ("rate-limiter+postgresql does not reset every key at once: clear keys one by one "
                 "(rate_limiter.reset_rate_limit), or reset the limit's state in the database")
