/**
 * A store for express-rate-limit 8: `rateLimit({ windowMs, limit, store: new PostgresStore({ db }) })`.
 * Each key is a fixed window of `limit` requests per `windowMs`, kept by the extension.
 */
import { type Queryable, RateLimiter } from "./index.js";
import { fixedWindow } from "./names.js";
import { Grants } from "./grants.js";

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
  /** `false` keeps the windows in the server's shared memory (a memory limit): a request writes
   * no row and no WAL. Needs the extension preloaded with `rate_limiter.memory_keys` > 0; a
   * crash forgets at most the last second. Not with `skipFailedRequests` or
   * `skipSuccessfulRequests`: their give-back could land in the next window. */
  durable?: boolean;
  /** `true` counts under the named limit `name` of `rate_limiter.limits` (its numbers, and each
   * key's override or tier) instead of an inline fixed window of `limit` per `windowMs`: a
   * customer's plan is then the administrator's row, with no change here. The database
   * decides; `limit` only scales the hits the library is told (a granted request is never
   * reported over it). */
  named?: boolean;
}

interface Counted {
  denials: number;
  windowEnd: Date | undefined;
  /** When this process's clock may forget the entry. */
  until: number;
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
  /** Per key, what this process counted and may yet be asked to decrement: denials (a
   * decrement of one gives nothing back) and where the window of the last granted hit ends by
   * the database's clock. Each entry leaves a window after its own window ends; in order of
   * last change, so that those whose time has come are at the front: client-chosen keys
   * cannot grow it without end. */
  private readonly counted = new Map<string, Counted>();
  /** Options that cannot be kept: every request fails with this. */
  private refused: Error | undefined;
  /** Whether decrement is called (skipFailedRequests, skipSuccessfulRequests): it needs `credit`. */
  private decrements = false;
  private readonly grants: Grants;

  constructor(private readonly options: PostgresStoreOptions) {
    this.limiter = new RateLimiter(options.db, { schema: options.schema });
    this.prefix = options.name ?? "express-rate-limit";
    this.limit = options.limit;
    this.grants = new Grants(this.limiter, "PostgresStore", () => ({
      rate_limit: "increment",
      ...(this.decrements ? { credit: "decrement, which skipFailedRequests and skipSuccessfulRequests call" } : {}),
      ...(this.decrements && options.named ? { rate_limit_value: "decrement on a named limit (its kind)" } : {}),
    }));
  }

  /** Called by express-rate-limit with its options: the window, and the limit when it is a number. */
  init(options: { windowMs: number; limit?: unknown; skipFailedRequests?: boolean; skipSuccessfulRequests?: boolean }): void {
    if (this.options.durable === false && (options.skipFailedRequests || options.skipSuccessfulRequests)) {
      // A memory limit's give-back counts only once committed, and this store cannot take one
      // back in the statement that gives it when the window has ended meanwhile. The library
      // only logs an error thrown here: every request fails with it instead.
      this.refused = new TypeError(
        "PostgresStore: durable: false does not go with skipFailedRequests or skipSuccessfulRequests; keep the limit durable",
      );
    }
    this.decrements = Boolean(options.skipFailedRequests || options.skipSuccessfulRequests);
    this.windowMs = options.windowMs;
    if (typeof options.limit === "number") this.limit = options.limit;
    this.dynamic = typeof options.limit === "function";
  }

  /** The call's limit: the named one, or the inline fixed window. */
  private counting(): { config?: Record<string, unknown> } {
    const config = this.config(); // also when named: the hits reported need a number
    return this.options.named ? {} : { config };
  }

  private config(): Record<string, unknown> {
    if (this.limit === undefined) {
      throw new TypeError(
        "PostgresStore: express-rate-limit's limit is a function, which a store never sees; give the store its own `limit`",
      );
    }
    return fixedWindow(this.limit, this.windowMs, this.options.durable === false ? { durable: false } : {});
  }

  /** Hits in the key's window: `limit` minus what is left (at least 1: an allowed key took
   * nothing); when denied, more than any limit express-rate-limit could compare it with. */
  private hits(d: { ok: boolean; remaining: number }, limit: number): number {
    if (!d.ok) return this.dynamic ? Number.MAX_SAFE_INTEGER : limit + 1;
    // A named limit's key may have more than `limit` (its plan): granted is never over it.
    return Math.min(Math.max(1, Math.round(limit - d.remaining)), this.options.named ? limit : Infinity);
  }

  /** One request: taken from the key's window, or (window spent) counted as over the limit,
   * taking nothing. Its reset time is the window's end counted from before the call, so that
   * express-rate-limit (8.6 and later) never decrements it after the window has ended there. */
  async increment(key: string): Promise<ClientRateLimitInfo> {
    if (this.refused) throw this.refused;
    await this.grants.require();
    const started = Date.now();
    if (this.limit === 0) {
      this.remember(key, started, this.windowMs, { denials: 1 });
      return { totalHits: 1, resetTime: new Date(started + this.windowMs) };
    }
    const d = await this.limiter.limit(this.prefix, key, this.counting());
    const windowLeft = d.ok ? d.resetAfter : d.retryAfter ?? d.resetAfter;
    this.remember(key, started, windowLeft, d.ok ? { windowEnd: new Date(d.at.getTime() + d.resetAfter) } : { denials: 1 });
    return { totalHits: this.hits(d, this.limit as number), resetTime: new Date(started + windowLeft) };
  }

  /** Note a hit of `key` counted at `started` in a window with `windowLeft` ms to go. */
  private remember(key: string, started: number, windowLeft: number, hit: { denials?: number; windowEnd?: Date }): void {
    const now = Date.now();
    for (const [k, { until }] of this.counted) {
      if (until > now) break;
      this.counted.delete(k);
    }
    const entry = this.counted.get(key) ?? { denials: 0, windowEnd: undefined, until: 0 };
    this.counted.delete(key);
    this.counted.set(key, {
      denials: entry.denials + (hit.denials ?? 0),
      windowEnd: hit.windowEnd ?? entry.windowEnd,
      until: Math.max(entry.until, started + Math.min(windowLeft, this.windowMs) + this.windowMs),
    });
  }

  /** A request not to count after all (skipFailedRequests, skipSuccessfulRequests): a denied
   * one took nothing and gives nothing back (its 429 is a failed request too); a granted one is
   * given back only into the window it was counted in, never the next. */
  async decrement(key: string): Promise<void> {
    const entry = this.counted.get(key);
    if (entry === undefined) return;
    if (entry.denials > 0) {
      entry.denials -= 1;
      return;
    }
    if (entry.windowEnd === undefined || this.limit === 0) return;
    await this.limiter.creditBefore(this.prefix, key, entry.windowEnd, this.counting());
  }

  /** The key's hits so far, taking nothing, as MemoryStore answers: `undefined` for a key with
   * no window, `{ totalHits: 0 }` for one this process counted whose hits were all given back
   * in a window still running. */
  async get(key: string): Promise<ClientRateLimitInfo | undefined> {
    if (this.limit === 0) return undefined;
    const d = await this.limiter.check(this.prefix, key, { count: 0, ...this.counting() });
    const totalHits = Math.min(Math.round((this.limit as number) - d.remaining), this.limit as number);
    if (totalHits > 0) return { totalHits, resetTime: new Date(Date.now() + d.resetAfter) };
    const windowEnd = this.counted.get(key)?.windowEnd;
    return windowEnd !== undefined && windowEnd.getTime() > d.at.getTime() ? { totalHits: 0, resetTime: windowEnd } : undefined;
  }

  /** Forget the key (the extension's `reset_rate_limit`, which needs its grant). */
  async resetKey(key: string): Promise<void> {
    await this.limiter.reset(this.prefix, key);
    this.counted.delete(key);
  }
}
