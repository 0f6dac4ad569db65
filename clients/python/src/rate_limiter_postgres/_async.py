"""The extension's calls on an asynchronous connection: psycopg 3's ``AsyncConnection``, an
asyncpg ``Connection`` or ``Pool``, or a SQLAlchemy ``AsyncSession``'s."""

from __future__ import annotations

from typing import Any, Optional

from ._decision import Acquired, Decision, as_rate_limited
from ._sql import Statements, check_seconds, config_json, dollar_marks, json_value, ms_interval, psycopg_marks

Config = dict[str, Any]


def _is_asyncpg(conn: Any) -> bool:
    return hasattr(conn, "fetchrow")


class AsyncRateLimiter:
    """Calls on ``conn``: a limit taken in its transaction commits or rolls back with it."""

    def __init__(self, conn: Any, schema: str = "rate_limiter"):
        self.conn = conn
        self.asyncpg = _is_asyncpg(conn)
        self.sql: Statements = dollar_marks(schema) if self.asyncpg else psycopg_marks(schema)

    @classmethod
    async def for_sqlalchemy(cls, session: Any, schema: str = "rate_limiter") -> "AsyncRateLimiter":
        """On the driver connection a SQLAlchemy ``AsyncSession`` holds (psycopg or asyncpg), in its transaction."""
        connection = await session.connection()
        # Through SQLAlchemy once, so that its transaction has begun on the driver's connection
        # (the asyncpg dialect begins one only when it runs a statement itself).
        await connection.exec_driver_sql("SELECT 1")
        raw = await connection.get_raw_connection()
        return cls(raw.driver_connection, schema)

    async def _row(self, sql: str, params: tuple) -> Any:
        keyed = len(params) > 1 and sql not in (self.sql.headers, self.sql.headers_of_key)  # every other statement's second argument is the key
        if self.asyncpg and keyed and params[1] is not None and not isinstance(params[1], str):
            params = (params[0], str(params[1])) + params[2:]  # a key such as an integer id, as text
        try:
            if self.asyncpg:
                if sql is self.sql.acquire or sql is self.sql.renew:
                    # asyncpg binds an interval from a timedelta, not from text (the 4th argument of both).
                    params = params[:3] + (_interval(params[3]),) + params[4:]
                return await self.conn.fetchrow(sql, *params)
            async with self.conn.cursor() as cursor:
                await cursor.execute(sql, params)
                return await cursor.fetchone()
        except Exception as error:
            raised = as_rate_limited(error)
            if raised is error:
                raise
            raise raised from error

    async def limit(self, name: str, key: Optional[str] = None, count: float = 1, *, reserve: bool = False,
                    config: Optional[Config] = None, throws: bool = False) -> Decision:
        return Decision.from_row(await self._row(self.sql.limit, (name, key, float(count), reserve, throws, config_json(config))))

    async def limit_ok(self, name: str, key: Optional[str] = None, count: float = 1, *, reserve: bool = False,
                       config: Optional[Config] = None, throws: bool = False) -> bool:
        """``limit``'s ``ok`` alone (``rate_limit_ok``, extension 0.8.0): the same call, no decision row."""
        return bool((await self._row(self.sql.limit_ok, (name, key, float(count), reserve, throws, config_json(config))))[0])

    async def check(self, name: str, key: Optional[str] = None, count: float = 1, *, reserve: bool = False,
                    config: Optional[Config] = None) -> Decision:
        return Decision.from_row(await self._row(self.sql.check, (name, key, float(count), reserve, False, config_json(config))))

    async def credit(self, name: str, key: Optional[str] = None, count: float = 1, *, config: Optional[Config] = None) -> Decision:
        return Decision.from_row(await self._row(self.sql.credit, (name, key, float(count), config_json(config))))

    async def reset(self, name: str, key: Optional[str] = None) -> None:
        await self._row(self.sql.reset, (name, key))

    async def value(self, name: str, key: Optional[str] = None, *, config: Optional[Config] = None) -> tuple:
        """``(value, ts, shard, effective_config)`` of (name, key) (``rate_limit_value``)."""
        value, ts, shard, effective = await self._row(self.sql.value, (name, key, config_json(config)))
        return value, ts, shard, json_value(effective)

    async def block(self, name: Optional[str], key: Optional[str], seconds: Optional[float] = None,
                    note: Optional[str] = None) -> None:
        check_seconds(seconds)
        await self._row(self.sql.block, self.sql.block_params(name, key, None if seconds is None else float(seconds), note))

    async def missing_grants(self, functions: list[str]) -> tuple[str, list[str]]:
        """The current role, and which of ``functions`` (of the extension's schema) it may not execute."""
        role, missing = await self._row(self.sql.missing_grants, (list(functions),))
        return role, list(missing or [])

    async def unblock(self, name: Optional[str], key: Optional[str]) -> bool:
        return bool((await self._row(self.sql.unblock, (name, key)))[0])

    async def headers(self, name: str, d: Decision, *, config: Optional[Config] = None, key: Optional[str] = None) -> dict[str, str]:
        params = (name, d.ok, d.retry_after, d.remaining, d.reset_after, d.granted, d.reason, d.limited_by, config_json(config))
        row = await (self._row(self.sql.headers, params) if key is None else self._row(self.sql.headers_of_key, params + (str(key),)))
        return json_value(row[0])

    async def acquire(self, name: str, key: Optional[str] = None, count: float = 1, *, lease: Optional[float] = None,
                      config: Optional[Config] = None, throws: bool = False) -> Acquired:
        return Acquired.from_row(await self._row(self.sql.acquire, (name, key, float(count), ms_interval(lease), throws,
                                                                     config_json(config))))

    async def release(self, name: str, key: Optional[str], lease_id: Optional[str]) -> bool:
        return bool((await self._row(self.sql.release, (name, key, _uuid(lease_id, self.asyncpg))))[0])

    async def renew(self, name: str, key: Optional[str], lease_id: Optional[str], lease: float) -> bool:
        return bool((await self._row(self.sql.renew, (name, key, _uuid(lease_id, self.asyncpg), ms_interval(lease))))[0])


def _interval(p: Optional[str]) -> Any:
    """``'<ms> milliseconds'`` (``ms_interval``) as the timedelta asyncpg binds an interval from."""
    if p is None:
        return None
    import datetime

    return datetime.timedelta(milliseconds=float(p.split()[0]))


def _uuid(lease_id: Optional[str], asyncpg: bool) -> Any:
    if lease_id is None or not asyncpg:
        return lease_id
    import uuid

    return uuid.UUID(str(lease_id))
