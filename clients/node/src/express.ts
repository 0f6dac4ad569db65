/**
 * A store for express-rate-limit 8: `rateLimit({ windowMs, limit, store: new PostgresStore({ db }) })`.
 * Each key is a fixed window of `limit` requests per `windowMs`, kept by the extension.
 */
import { type Queryable, RateLimiter } from "./index.js";
import { fixedWindow } from "./names.js";

/** What express-rate-limit 8 expects back from a store. */
export interface ClientRateLimitInfo {
  totalHits: number;
  resetTime: Date | undefined;
}

export interface PostgresStoreOptions {
  /** Where the calls run: a `pg` Pool (or anything with `query(text, values)`). */
  db: Queryable;
  /** The limit's name in the extension (default `express-rate-limit`); give each limiter its own. */
  name?: string;
  /** The limit, when express-rate-limit's `limit` option is a function (the store never sees its per-request value). */
  limit?: number;
  /** The extension's schema (default `rate_limiter`). */
  schema?: string;
}

export class PostgresStore {
  /** Keys live in the database, shared by every process. */
  readonly localKeys = false;
  readonly prefix: string;
  private readonly limiter: RateLimiter;
  private limit: number | undefined;
  private windowMs = 60_000;
  /** express-rate-limit's own limit is a function: a denial must be over any it could return. */
  private dynamic = false;
  /** Denials this process answered and has not seen decremented (a decrement of one gives
   * nothing back), with when each may be forgotten: a window and one more after it was
   * answered, for a late decrement. In order of last change, so that those whose time has
   * come are at the front: client-chosen keys cannot grow it without end. */
  private readonly denials = new Map<string, { count: number; until: number }>();

  constructor(private readonly options: PostgresStoreOptions) {
    this.limiter = new RateLimiter(options.db, { schema: options.schema });
    this.prefix = options.name ?? "express-rate-limit";
    this.limit = options.limit;
  }

  /** Called by express-rate-limit with its options: the window, and the limit when it is a number. */
  init(options: { windowMs: number; limit?: unknown }): void {
    this.windowMs = options.windowMs;
    if (typeof options.limit === "number") this.limit = options.limit;
    this.dynamic = typeof options.limit === "function";
  }

  private config(): Record<string, unknown> {
    if (this.limit === undefined) {
      throw new TypeError(
        "PostgresStore: express-rate-limit's limit is a function, which a store never sees; give the store its own `limit`",
      );
    }
    return fixedWindow(this.limit, this.windowMs);
  }

  /** Hits in the key's window: `limit` minus what is left (at least 1: an allowed key took
   * nothing); when denied, more than any limit express-rate-limit could compare it with. */
  private info(d: { ok: boolean; remaining: number; resetAfter: number; retryAfter: number | null }, limit: number): ClientRateLimitInfo {
    const denied = this.dynamic ? Number.MAX_SAFE_INTEGER : limit + 1;
    const totalHits = d.ok ? Math.max(1, Math.round(limit - d.remaining)) : denied;
    const wait = d.ok ? d.resetAfter : d.retryAfter ?? d.resetAfter;
    return { totalHits, resetTime: new Date(Date.now() + wait) };
  }

  /** One request: taken from the key's window, or (window spent) counted as over the limit, taking nothing. */
  async increment(key: string): Promise<ClientRateLimitInfo> {
    if (this.limit === 0) {
      this.denied(key, 1, this.windowMs);
      return { totalHits: 1, resetTime: new Date(Date.now() + this.windowMs) };
    }
    const config = this.config();
    const d = await this.limiter.limit(this.prefix, key, { config });
    if (!d.ok) this.denied(key, 1, d.retryAfter ?? d.resetAfter);
    return this.info(d, this.limit as number);
  }

  /** `n` more (or, negative, fewer) denials of `key`, the last answered in a window that ends
   * in `windowLeft` ms. */
  private denied(key: string, n: number, windowLeft = 0): void {
    const now = Date.now();
    for (const [k, { until }] of this.denials) {
      if (until > now) break;
      this.denials.delete(k);
    }
    const entry = this.denials.get(key);
    const count = (entry?.count ?? 0) + n;
    this.denials.delete(key);
    if (count > 0) {
      const until = Math.max(entry?.until ?? 0, now + Math.min(windowLeft, this.windowMs) + this.windowMs);
      this.denials.set(key, { count, until });
    }
  }

  /** A request not to count after all (skipFailedRequests, skipSuccessfulRequests): a denied
   * one took nothing and gives nothing back (its 429 is a failed request too); a granted one is
   * given back as far as the window still counts it. */
  async decrement(key: string): Promise<void> {
    if ((this.denials.get(key)?.count ?? 0) > 0) {
      this.denied(key, -1);
      return;
    }
    if (this.limit === 0) return;
    await this.limiter.credit(this.prefix, key, { config: this.config() });
  }

  /** The key's hits so far, taking nothing; `undefined` when it has none. */
  async get(key: string): Promise<ClientRateLimitInfo | undefined> {
    if (this.limit === 0) return undefined;
    const d = await this.limiter.check(this.prefix, key, { count: 0, config: this.config() });
    const totalHits = Math.round((this.limit as number) - d.remaining);
    return totalHits > 0 ? { totalHits, resetTime: new Date(Date.now() + d.resetAfter) } : undefined;
  }

  /** Forget the key (the extension's `reset_rate_limit`, which needs its grant). */
  async resetKey(key: string): Promise<void> {
    await this.limiter.reset(this.prefix, key);
  }
}
