// Compiled, not run (`tsc -p types-test`): what TypeScript users write type-checks against the
// package's declarations and the libraries' own.
import pg from "pg";
import { RateLimiterQueue, RateLimiterUnion, RLWrapperBlackAndWhite, type RateLimiterRes } from "rate-limiter-flexible";
import { RateLimiter, RateLimitedError, type Decision } from "../dist/esm/index.js";
import { PostgresStore } from "../dist/esm/express.js";
import { postgresStore } from "../dist/esm/fastify.js";
import { RateLimiterPostgresExtension } from "../dist/esm/flexible.js";

declare const pool: { query(text: string, values?: unknown[]): Promise<{ rows: any[] }> };
const limiter = new RateLimiterPostgresExtension({ db: pool, points: 5, duration: 60 });
new RateLimiterUnion(limiter, new RateLimiterPostgresExtension({ db: pool, keyPrefix: "b", points: 10, duration: 3600 }));
new RateLimiterQueue(limiter, { maxQueueSize: 10 });
new RLWrapperBlackAndWhite({ limiter, whiteList: ["127.0.0.1"] });
const res: Promise<RateLimiterRes> = limiter.consume("k");
const d: Promise<Decision> = new RateLimiter(pool).limit("api", "k", { count: 1 });
const ok: Promise<boolean> = new RateLimiter(pool).limitOk("api", "k", { throws: true });
const e: RateLimitedError | null = null;
new PostgresStore({ db: pool, limit: 10 });
postgresStore({ db: pool });
void [res, d, ok, e, pg];
