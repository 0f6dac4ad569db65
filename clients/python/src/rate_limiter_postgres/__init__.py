"""rate_limiter from Python: rate limits inside your PostgreSQL transactions.

``RateLimiter`` runs the extension's calls on a synchronous connection (psycopg 3, Django,
a SQLAlchemy ``Session``), ``AsyncRateLimiter`` on an asynchronous one (psycopg 3, asyncpg,
a SQLAlchemy ``AsyncSession``); a limit taken in a transaction commits or rolls back with it.
Importing the package registers the ``rate-limiter+postgresql://`` storage of ``limits``
(Flask-Limiter, SlowAPI) and ``async+rate-limiter+postgresql://`` of ``limits.aio`` when
``limits`` and ``psycopg_pool`` are installed.
"""

from ._async import AsyncRateLimiter
from ._decision import Acquired, Decision, RateLimited, as_rate_limited
from ._sync import RateLimiter

__all__ = ["Acquired", "AsyncRateLimiter", "Decision", "RateLimited", "RateLimiter", "as_rate_limited"]
__version__ = "0.6.0"

try:  # the storages of limits, registered by their classes' definitions
    from . import limits_storage, limits_storage_aio  # noqa: F401
except ImportError:  # limits (or psycopg, psycopg_pool) not installed
    pass
