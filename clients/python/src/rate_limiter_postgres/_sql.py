"""The extension's calls as SQL, with one placeholder style per driver."""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Optional

DECISION = "ok, retry_after, remaining, reset_after, granted, reason, limited_by"


def check_schema(schema: str) -> str:
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", schema):
        raise ValueError(f"schema must be a plain identifier, not {schema!r}")
    return schema


def config_json(config: Optional[dict[str, Any]]) -> Optional[str]:
    return None if config is None else json.dumps(config)


def check_seconds(seconds: Optional[float]) -> None:
    if seconds is not None and not (seconds > 0 and seconds != float("inf")):
        raise ValueError(f"seconds must be a finite number > 0 (None blocks for good), not {seconds!r}")


def json_value(value: Any) -> Any:
    """A jsonb result as Python: drivers that hand it over as text (asyncpg, Django's cursors) too."""
    return json.loads(value) if isinstance(value, str) else value


def ms_interval(ms: Optional[float]) -> Optional[str]:
    return None if ms is None else f"{float(ms)} milliseconds"


class Statements:
    """Each call's SQL with placeholders ``mark(n)`` (``%s`` for psycopg and DB-API, ``$n`` for asyncpg)."""

    def __init__(self, schema: str, mark: Callable[[int], str]):
        s, m = check_schema(schema), mark
        args = lambda n, casts=(): ", ".join(m(i) + (casts[i - 1] if i - 1 < len(casts) else "") for i in range(1, n + 1))  # noqa: E731
        six = ("::text", "::text", "::float8", "::boolean", "::boolean", "::jsonb")
        self.limit = f"SELECT {DECISION} FROM {s}.rate_limit({args(6, six)})"
        self.check = f"SELECT {DECISION} FROM {s}.check_rate_limit({args(6, six)})"
        self.limit_ok = f"SELECT {s}.rate_limit_ok({args(6, six)})"
        self.credit = f"SELECT {DECISION} FROM {s}.credit({args(4, ('::text', '::text', '::float8', '::jsonb'))})"
        self.reset = f"SELECT {s}.reset_rate_limit({args(2, ('::text', '::text'))})"
        self.value = f"SELECT value, ts, shard, effective_config FROM {s}.rate_limit_value({args(3, ('::text', '::text', '::jsonb'))})"
        self.headers = (
            f"SELECT {s}.http_headers({m(1)}::text, ROW({m(2)}::boolean, {m(3)}::float8, {m(4)}::float8, {m(5)}::float8, "
            f"{m(6)}::float8, {m(7)}::text, {m(8)}::text)::{s}.decision, {m(9)}::jsonb)"
        )
        # The key's own numbers (its override's, 0.7.0): named so that 0.6.0's three arguments still do without one.
        self.headers_of_key = self.headers[:-1] + f", key => {m(10)}::text)"
        self.acquire = (
            f"SELECT {DECISION}, lease_id FROM {s}.acquire("
            f"{args(6, ('::text', '::text', '::float8', '::interval', '::boolean', '::jsonb'))})"
        )
        self.release = f"SELECT {s}.release({args(3, ('::text', '::text', '::uuid'))})"
        self.renew = f"SELECT {s}.renew({args(4, ('::text', '::text', '::uuid', '::interval'))})"
        self.block = (
            f"SELECT {s}.block({m(1)}::text, {m(2)}::text, CASE WHEN {m(3)}::float8 IS NULL THEN 'infinity'::timestamptz "
            f"ELSE now() + make_interval(secs => {m(3)}::float8) END, {m(4)}::text)"
        )
        self.unblock = f"SELECT {s}.unblock({args(2, ('::text', '::text'))})"
        # The current role, and which of the functions named by the array it may not execute
        # (no overload it has EXECUTE on, or no USAGE on the schema).
        self.missing_grants = (
            "SELECT current_user::text, pg_catalog.array_remove(pg_catalog.array_agg(f.w), NULL) "
            f"FROM (SELECT w FROM pg_catalog.unnest({m(1)}::text[]) w WHERE NOT EXISTS ("
            "SELECT 1 FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace "
            f"WHERE n.nspname OPERATOR(pg_catalog.=) '{s}' AND p.proname OPERATOR(pg_catalog.=) w "
            "AND pg_catalog.has_schema_privilege(n.oid, 'USAGE') "
            "AND pg_catalog.has_function_privilege(p.oid, 'EXECUTE'))) f"
        )
        # %s binds by position: the seconds, used twice, are passed twice.
        self.positional = m(1) == m(2)

    def block_params(self, name: Optional[str], key: Optional[str], seconds: Optional[float], note: Optional[str]) -> tuple:
        return (name, key, seconds, seconds, note) if self.positional else (name, key, seconds, note)


def psycopg_marks(schema: str) -> Statements:
    return Statements(schema, lambda n: "%s")


def dollar_marks(schema: str) -> Statements:
    return Statements(schema, lambda n: f"${n}")
