/**
 * A store for @fastify/rate-limit: `fastify.register(rateLimit, { max, timeWindow, store: postgresStore({ db }) })`.
 * Each key (per route, for a route's own limit) is a fixed window of `max` requests per
 * `timeWindow`, kept by the extension.
 */
import { type Queryable, RateLimiter } from "./index.js";
import { fixedWindow, limitName } from "./names.js";
import { Grants } from "./grants.js";

type Callback = (error: Error | null, result?: { current: number; ttl: number }) => void;

export interface PostgresStoreOptions {
  db: Queryable;
  /** The limit's name in the extension (default `fastify-rate-limit`); a route's own limit adds its method and URL. */
  name?: string;
  schema?: string;
  /** `false` keeps the windows in the server's shared memory (a memory limit): a request writes
   * no row and no WAL. Needs the extension preloaded with `rate_limiter.memory_keys` > 0; a
   * crash forgets at most the last second. */
  durable?: boolean;
}

/** The parameters @fastify/rate-limit constructs a store (or a route's) with. */
export interface StoreParams {
  routeInfo?: { method?: string; url?: string };
}

/** A store as @fastify/rate-limit calls it. */
export interface FastifyRateLimitStore {
  incr(key: string, callback: Callback, timeWindow: number, max: number): void;
  read(key: string, callback: Callback, timeWindow: number, max: number): void;
  child(routeOptions: StoreParams): FastifyRateLimitStore;
}

/** The store class @fastify/rate-limit instantiates with its parameters. */
export function postgresStore(options: PostgresStoreOptions): new (params?: StoreParams) => FastifyRateLimitStore {
  const limiter = new RateLimiter(options.db, { schema: options.schema });
  const base = options.name ?? "fastify-rate-limit";
  const extra = options.durable === false ? { durable: false } : {};
  const grants = new Grants(limiter, "postgresStore", () => ({ rate_limit: "incr" }));

  return class PostgresStore implements FastifyRateLimitStore {
    private readonly name: string;

    constructor(params: StoreParams = {}) {
      const route = params.routeInfo;
      this.name = route?.url ? limitName(base, String(route.method ?? ""), route.url) : base;
    }

    private answer(d: { ok: boolean; remaining: number; resetAfter: number; retryAfter: number | null }, max: number) {
      // current > max is what the plugin denies: one over when the window is spent.
      const current = d.ok ? Math.round(max - d.remaining) : max + 1;
      return { current, ttl: d.ok ? d.resetAfter : d.retryAfter ?? d.resetAfter };
    }

    /** One request: taken from the key's window, or counted one over `max`, taking nothing. */
    incr(key: string, callback: Callback, timeWindow: number, max: number): void {
      if (max <= 0) {
        callback(null, { current: 1, ttl: timeWindow });  // a limit of 0 denies every request
        return;
      }
      grants
        .require()
        .then(() => limiter.limit(this.name, key, { config: fixedWindow(max, timeWindow, extra) }))
        .then((d) => callback(null, this.answer(d, max)), (error) => callback(error));
    }

    /** The key's count so far, taking nothing. */
    read(key: string, callback: Callback, timeWindow: number, max: number): void {
      if (max <= 0) {
        callback(null, { current: 0, ttl: timeWindow });
        return;
      }
      limiter
        .check(this.name, key, { count: 0, config: fixedWindow(max, timeWindow, extra) })
        .then((d) => callback(null, this.answer({ ...d, ok: true }, max)), (error) => callback(error));
    }

    /** A route's own store: its keys apart from every other route's. */
    child(routeOptions: StoreParams): FastifyRateLimitStore {
      return new PostgresStore(routeOptions);
    }
  };
}
