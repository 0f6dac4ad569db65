/**
 * rate_limiter from Node.js: the extension's calls on any object with
 * `query(text, values)` (a node-postgres Pool, Client or transaction client, or the raw
 * handle of Drizzle, Kysely or Knex), so that a limit commits or rolls back with the work
 * it guards when the handle is in a transaction.
 */

/** What runs SQL: a node-postgres `Pool`, `Client` or `PoolClient` has this shape. */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: any[] }>;
}

/** The answer of a consuming call or a check (times in milliseconds). */
export interface Decision {
  /** The tokens (or slots) were taken. */
  ok: boolean;
  /** When a retry could succeed; `null` when there is nothing to wait for. */
  retryAfter: number | null;
  /** Tokens left after this call. */
  remaining: number;
  /** Until the limit is full again. */
  resetAfter: number;
  /** Tokens this call took. */
  granted: number;
  /** The statement's start by the database's clock: `at` plus `resetAfter` is no later than
   * when the limit is full there, whatever this process's clock says. */
  at: Date;
  /** Why it was denied ('exhausted', 'blocked', ...), or 'allowed'/'shadow' when ok. */
  reason: string | null;
  /** The limit that denied the call. */
  limitedBy: string | null;
}

/** A concurrency limit's answer, with the lease's id when one was taken. */
export interface Acquired extends Decision {
  leaseId: string | null;
}

/** An inline config, in the Convex shape: `{kind, rate, period, capacity, ...}`. */
export type Config = Record<string, unknown>;

export interface CallOptions {
  /** Tokens to take (default 1). */
  count?: number;
  /** Take them even into debt (token bucket and fixed window with `maxReserved`). */
  reserve?: boolean;
  /** An inline config instead of the named limit's. */
  config?: Config;
  /** Reject with `RateLimitedError` (SQLSTATE RL429, which aborts the transaction) instead of resolving ok = false. */
  throws?: boolean;
}

/** A denial raised as SQLSTATE RL429 (`throws`). */
export class RateLimitedError extends Error {
  readonly code = "RL429";
  /** Milliseconds until a retry could succeed; `null` while the key is blocked for good. */
  readonly retryAfter: number | null;
  readonly limit: string;
  readonly key: string | null;
  readonly reason: string | null;

  constructor(message: string, detail: { name?: string; key?: string | null; retryAfter?: number | null; reason?: string }) {
    super(message);
    this.name = "RateLimitedError";
    this.limit = detail.name ?? "";
    this.key = detail.key ?? null;
    this.retryAfter = detail.retryAfter ?? null;
    this.reason = detail.reason ?? "exhausted";
  }
}

const DECISION = "ok, retry_after, remaining, reset_after, granted, reason, limited_by, pg_catalog.statement_timestamp() AS at";

function decision(row: any): Decision {
  return {
    ok: row.ok,
    retryAfter: row.retry_after,
    remaining: row.remaining,
    resetAfter: row.reset_after,
    granted: row.granted,
    at: row.at,
    reason: row.reason,
    limitedBy: row.limited_by,
  };
}

/** The `RateLimitedError` of a driver's error with SQLSTATE RL429; anything else as it is. */
export function asRateLimited(error: unknown): unknown {
  const e = error as { code?: string; message?: string; detail?: string };
  if (e?.code !== "RL429") return error;
  let detail = {};
  try {
    detail = JSON.parse(e.detail ?? "{}");
  } catch {
    // A detail that is not the extension's JSON: keep the message alone.
  }
  return new RateLimitedError(e.message ?? "rate limit exceeded", detail);
}

function json(config: Config | undefined): string | null {
  return config === undefined ? null : JSON.stringify(config);
}

export interface RateLimiterOptions {
  /** The extension's schema (default `rate_limiter`). */
  schema?: string;
}

/** The extension's calls on one SQL handle. */
export class RateLimiter {
  readonly schema: string;

  constructor(readonly db: Queryable, options: RateLimiterOptions = {}) {
    const schema = options.schema ?? "rate_limiter";
    if (!/^[a-z_][a-z0-9_]*$/.test(schema)) throw new TypeError(`schema must be a plain identifier, not ${JSON.stringify(schema)}`);
    this.schema = schema;
  }

  /** Run `sql` and give back its rows, turning RL429 into `RateLimitedError`. */
  private async rows(sql: string, values: unknown[]): Promise<any[]> {
    try {
      return (await this.db.query(sql, values)).rows;
    } catch (error) {
      throw asRateLimited(error);
    }
  }

  private async call(fn: string, name: string, key: string | null, options: CallOptions): Promise<Decision> {
    const [row] = await this.rows(
      `SELECT ${DECISION} FROM ${this.schema}.${fn}($1, $2, $3, $4, $5, $6::jsonb)`,
      [name, key, options.count ?? 1, options.reserve ?? false, options.throws ?? false, json(options.config)],
    );
    return decision(row);
  }

  /** The current role, and which of `functions` (names in the extension's schema) it may not
   * execute: no overload it has EXECUTE on, or no USAGE on the schema. */
  async missingGrants(functions: string[]): Promise<{ role: string; missing: string[] }> {
    const rows = await this.rows(
      `SELECT current_user AS role, pg_catalog.array_remove(pg_catalog.array_agg(f.name), NULL) AS missing ` +
        `FROM (SELECT w AS name FROM pg_catalog.unnest($2::text[]) w WHERE NOT EXISTS (` +
        `SELECT 1 FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace ` +
        `WHERE n.nspname OPERATOR(pg_catalog.=) $1 AND p.proname OPERATOR(pg_catalog.=) w ` +
        `AND pg_catalog.has_schema_privilege(n.oid, 'USAGE') AND pg_catalog.has_function_privilege(p.oid, 'EXECUTE'))) f`,
      [this.schema, functions],
    );
    return { role: rows[0].role, missing: rows[0].missing ?? [] };
  }

  /** Take `count` tokens from (name, key) in the handle's transaction (`rate_limit`). */
  limit(name: string, key: string | null = null, options: CallOptions = {}): Promise<Decision> {
    return this.call("rate_limit", name, key, options);
  }

  /** `limit`'s `ok` alone (`rate_limit_ok`, extension 0.8.0): the same call, no decision row. */
  async limitOk(name: string, key: string | null = null, options: CallOptions = {}): Promise<boolean> {
    const [row] = await this.rows(`SELECT ${this.schema}.rate_limit_ok($1, $2, $3, $4, $5, $6::jsonb) AS ok`, [
      name,
      key,
      options.count ?? 1,
      options.reserve ?? false,
      options.throws ?? false,
      json(options.config),
    ]);
    return row.ok;
  }

  /** The answer `limit` would give, taking nothing (`check_rate_limit`). */
  check(name: string, key: string | null = null, options: CallOptions = {}): Promise<Decision> {
    return this.call("check_rate_limit", name, key, options);
  }

  /** Give `count` tokens back, as much as the limit still counts (`credit`). */
  async credit(name: string, key: string | null = null, options: { count?: number; config?: Config } = {}): Promise<Decision> {
    const [row] = await this.rows(`SELECT ${DECISION} FROM ${this.schema}.credit($1, $2, $3, $4::jsonb)`, [
      name,
      key,
      options.count ?? 1,
      json(options.config),
    ]);
    return decision(row);
  }

  /** `credit`, kept only where it lands before `before` by the database's clock (the end of the
   * window the tokens were taken in): one that lands later is taken back in the same statement,
   * under the key's row lock, so that no other call sees it. The tokens given back. A memory
   * limit (durable: false) is refused: its credit counts only once committed, after the
   * statement that would take it back (credit() suits it). A named limit's kind is the
   * database's, asked in the same statement (rate_limit_value, whose grant it needs), which
   * then credits nothing. */
  async creditBefore(name: string, key: string | null, before: Date, options: { count?: number; config?: Config } = {}): Promise<number> {
    if (options.config?.durable === false) throw memoryCreditBefore(name);
    const s = this.schema;
    const args = [name, key, options.count ?? 1, json(options.config), before];
    const credited =
      `SELECT ARRAY[c.granted, CASE WHEN c.granted < 0 AND pg_catalog.clock_timestamp() >= $5 THEN ` +
      `(SELECT r.granted FROM ${s}.rate_limit($1, $2, -c.granted, false, false, $4::jsonb) r) END] ` +
      `FROM ${s}.credit($1, $2, $3, $4::jsonb) c`;
    // An uncorrelated subquery runs when its CASE branch is first evaluated: never for a memory limit.
    const sql =
      options.config == null
        ? `SELECT m.memory, CASE WHEN NOT m.memory THEN (${credited}) END AS credited FROM ` +
          `(SELECT coalesce(v.effective_config->>'durable' = 'false', false) AS memory ` +
          `FROM ${s}.rate_limit_value($1, $2, $4::jsonb) v) m`
        : `SELECT false AS memory, (${credited}) AS credited`;
    const [row] = await this.rows(sql, args);
    if (row.memory) throw memoryCreditBefore(name);
    const [granted, takenBack] = row.credited as [number, number | null];
    return -granted - (takenBack ?? 0);
  }

  /** Forget (name, key): it is full again (`reset_rate_limit`, an administrator's call). */
  async reset(name: string, key: string | null = null): Promise<void> {
    await this.rows(`SELECT ${this.schema}.reset_rate_limit($1, $2)`, [name, key]);
  }

  /** Deny (name, key) for `seconds` (for good when omitted) with reason 'blocked' (`block`, an administrator's call). */
  async block(name: string | null, key: string | null, options: { seconds?: number; note?: string } = {}): Promise<void> {
    const seconds = options.seconds ?? null;
    if (seconds !== null && !(Number.isFinite(seconds) && seconds > 0)) throw new RangeError(`seconds must be > 0, not ${seconds}`);
    await this.rows(
      `SELECT ${this.schema}.block($1, $2, CASE WHEN $3::float8 IS NULL THEN 'infinity'::timestamptz ` +
        `ELSE now() + make_interval(secs => $3::float8) END, $4)`,
      [name, key, seconds, options.note ?? null],
    );
  }

  /** Lift the block of (name, key); whether there was one (`unblock`). */
  async unblock(name: string | null, key: string | null): Promise<boolean> {
    const [row] = await this.rows(`SELECT ${this.schema}.unblock($1, $2) AS lifted`, [name, key]);
    return row.lifted;
  }

  /** The stored value of (name, key) and the config in force (`rate_limit_value`). */
  async value(
    name: string,
    key: string | null = null,
    options: { config?: Config } = {},
  ): Promise<{ value: number; ts: Date; shard: number; effectiveConfig: Config }> {
    const [row] = await this.rows(
      `SELECT value, ts, shard, effective_config FROM ${this.schema}.rate_limit_value($1, $2, $3::jsonb)`,
      [name, key, json(options.config)],
    );
    return { value: row.value, ts: row.ts, shard: row.shard, effectiveConfig: row.effective_config };
  }

  /** The `RateLimit-Policy`, `RateLimit` and (denied) `Retry-After` headers of decision `d` of `name`, with `key`'s own
   * numbers (its override's, 0.7.0) when given. */
  async headers(name: string, d: Decision, options: { config?: Config; key?: string } = {}): Promise<Record<string, string>> {
    const keyed = options.key === undefined ? "" : ", key => $10::text";
    const [row] = await this.rows(
      `SELECT ${this.schema}.http_headers($1, ROW($2, $3, $4, $5, $6, $7, $8)::${this.schema}.decision, $9::jsonb${keyed}) AS h`,
      [name, d.ok, d.retryAfter, d.remaining, d.resetAfter, d.granted, d.reason, d.limitedBy, json(options.config),
       ...(options.key === undefined ? [] : [options.key])],
    );
    return row.h;
  }

  /** Take `count` slots of a concurrency limit: until the transaction ends, or with `lease` (ms) until the lease does. */
  async acquire(
    name: string,
    key: string | null = null,
    options: { count?: number; lease?: number; config?: Config; throws?: boolean } = {},
  ): Promise<Acquired> {
    const lease = options.lease === undefined ? null : `${options.lease} milliseconds`;
    const [row] = await this.rows(
      `SELECT ${DECISION}, lease_id FROM ${this.schema}.acquire($1, $2, $3, $4::interval, $5, $6::jsonb)`,
      [name, key, options.count ?? 1, lease, options.throws ?? false, json(options.config)],
    );
    return { ...decision(row), leaseId: row.lease_id };
  }

  /** End a lease; whether it still held its slots. */
  async release(name: string, key: string | null, leaseId: string | null): Promise<boolean> {
    const [row] = await this.rows(`SELECT ${this.schema}.release($1, $2, $3::uuid) AS released`, [name, key, leaseId]);
    return row.released;
  }

  /** Move a lease's end to `lease` ms from now; false once it has ended. */
  async renew(name: string, key: string | null, leaseId: string | null, lease: number): Promise<boolean> {
    const [row] = await this.rows(`SELECT ${this.schema}.renew($1, $2, $3::uuid, $4::interval) AS renewed`, [
      name,
      key,
      leaseId,
      `${lease} milliseconds`,
    ]);
    return row.renewed;
  }
}

function memoryCreditBefore(name: string): Error {
  return new Error(
    `creditBefore: "${name}" is a memory limit (durable: false), whose credit counts only once its ` +
      `transaction commits, too late to be taken back in its statement: use credit(), or a durable limit`,
  );
}
