"""rate_limiter from Python: rate limits inside your PostgreSQL transactions.

``RateLimiter`` runs the extension's calls on a synchronous connection (psycopg 3, Django,
a SQLAlchemy ``Session``), ``AsyncRateLimiter`` on an asynchronous one (psycopg 3, asyncpg,
a SQLAlchemy ``AsyncSession``); a limit taken in a transaction commits or rolls back with it.
Importing the package registers the ``rate-limiter+postgresql://`` storage of ``limits``
(Flask-Limiter, SlowAPI) when ``limits`` is installed.
"""

from ._async import AsyncRateLimiter
from ._decision import Acquired, Decision, RateLimited, as_rate_limited
from ._sync import RateLimiter

__all__ = ["Acquired", "AsyncRateLimiter", "Decision", "RateLimited", "RateLimiter", "as_rate_limited"]
__version__ = "0.5.0"

try:  # the storage of limits, registered by its class's definition
    from . import limits_storage  # noqa: F401
except ImportError:  # limits (or psycopg) not installed
    pass
