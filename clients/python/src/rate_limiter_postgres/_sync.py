"""The extension's calls on a synchronous connection: psycopg 3, Django's ``connection``, a
SQLAlchemy ``Session``'s, or any DB-API connection whose cursors take ``%s``."""

from __future__ import annotations

from typing import Any, Optional

from ._decision import Acquired, Decision, as_rate_limited
from ._sql import check_seconds, config_json, json_value, ms_interval, psycopg_marks

Config = dict[str, Any]


class RateLimiter:
    """Calls on ``conn``: a limit taken in its transaction commits or rolls back with it."""

    def __init__(self, conn: Any, schema: str = "rate_limiter"):
        self.conn = conn
        self.sql = psycopg_marks(schema)

    @classmethod
    def for_sqlalchemy(cls, session: Any, schema: str = "rate_limiter") -> "RateLimiter":
        """On the connection a SQLAlchemy ``Session`` (or ``Connection``) holds, in its transaction."""
        connection = session.connection() if hasattr(session, "connection") and callable(session.connection) else session
        return cls(connection.connection, schema)

    @classmethod
    def for_django(cls, using: str = "default", schema: str = "rate_limiter") -> "RateLimiter":
        """On Django's connection ``using``: inside ``transaction.atomic()`` the limit is part of it."""
        from django.db import connections

        return cls(connections[using], schema)

    def _row(self, sql: str, params: tuple) -> Any:
        cursor = self.conn.cursor()
        try:
            cursor.execute(sql, params)
            return cursor.fetchone()
        except Exception as error:
            raised = as_rate_limited(error)
            if raised is error:
                raise
            raise raised from error
        finally:
            cursor.close()

    def limit(self, name: str, key: Optional[str] = None, count: float = 1, *, reserve: bool = False,
              config: Optional[Config] = None, throws: bool = False) -> Decision:
        """Take ``count`` tokens from (name, key) (``rate_limit``); ``throws`` raises ``RateLimited``."""
        return Decision.from_row(self._row(self.sql.limit, (name, key, count, reserve, throws, config_json(config))))

    def limit_ok(self, name: str, key: Optional[str] = None, count: float = 1, *, reserve: bool = False,
                 config: Optional[Config] = None, throws: bool = False) -> bool:
        """``limit``'s ``ok`` alone (``rate_limit_ok``, extension 0.8.0): the same call, no decision row."""
        return bool(self._row(self.sql.limit_ok, (name, key, count, reserve, throws, config_json(config)))[0])

    def check(self, name: str, key: Optional[str] = None, count: float = 1, *, reserve: bool = False,
              config: Optional[Config] = None) -> Decision:
        """The answer ``limit`` would give, taking nothing (``check_rate_limit``)."""
        return Decision.from_row(self._row(self.sql.check, (name, key, count, reserve, False, config_json(config))))

    def credit(self, name: str, key: Optional[str] = None, count: float = 1, *, config: Optional[Config] = None) -> Decision:
        """Give ``count`` back, as much as the limit still counts (``credit``)."""
        return Decision.from_row(self._row(self.sql.credit, (name, key, count, config_json(config))))

    def reset(self, name: str, key: Optional[str] = None) -> None:
        """Forget (name, key) (``reset_rate_limit``, an administrator's call)."""
        self._row(self.sql.reset, (name, key))

    def block(self, name: Optional[str], key: Optional[str], seconds: Optional[float] = None, note: Optional[str] = None) -> None:
        """Deny (name, key) for ``seconds`` (for good when ``None``), reason ``'blocked'``."""
        check_seconds(seconds)
        self._row(self.sql.block, self.sql.block_params(name, key, seconds, note))

    def missing_grants(self, functions: list[str]) -> tuple[str, list[str]]:
        """The current role, and which of ``functions`` (of the extension's schema) it may not execute."""
        role, missing = self._row(self.sql.missing_grants, (list(functions),))
        return role, list(missing or [])

    def unblock(self, name: Optional[str], key: Optional[str]) -> bool:
        return bool(self._row(self.sql.unblock, (name, key))[0])

    def value(self, name: str, key: Optional[str] = None, *, config: Optional[Config] = None) -> tuple:
        """``(value, ts, shard, effective_config)`` of (name, key) (``rate_limit_value``)."""
        value, ts, shard, effective = self._row(self.sql.value, (name, key, config_json(config)))
        return value, ts, shard, json_value(effective)

    def headers(self, name: str, d: Decision, *, config: Optional[Config] = None, key: Optional[str] = None) -> dict[str, str]:
        """``RateLimit-Policy``, ``RateLimit`` and (denied) ``Retry-After`` for decision ``d`` of ``name``, with
        ``key``'s own numbers (its override's) when given."""
        params = (name, d.ok, d.retry_after, d.remaining, d.reset_after, d.granted, d.reason, d.limited_by, config_json(config))
        row = self._row(self.sql.headers, params) if key is None else self._row(self.sql.headers_of_key, params + (str(key),))
        return json_value(row[0])

    def acquire(self, name: str, key: Optional[str] = None, count: float = 1, *, lease: Optional[float] = None,
                config: Optional[Config] = None, throws: bool = False) -> Acquired:
        """Take slots of a concurrency limit: until the transaction ends, or ``lease`` ms."""
        return Acquired.from_row(self._row(self.sql.acquire, (name, key, count, ms_interval(lease), throws, config_json(config))))

    def release(self, name: str, key: Optional[str], lease_id: Optional[str]) -> bool:
        return bool(self._row(self.sql.release, (name, key, lease_id))[0])

    def renew(self, name: str, key: Optional[str], lease_id: Optional[str], lease: float) -> bool:
        return bool(self._row(self.sql.renew, (name, key, lease_id, ms_interval(lease)))[0])
