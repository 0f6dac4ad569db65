/**
 * A limiter for rate-limiter-flexible 11: `new RateLimiterPostgresExtension({ db, points, duration })`
 * consumes from the extension, and works inside `RateLimiterUnion`, `RateLimiterQueue` and
 * `RLWrapperBlackAndWhite`. Each key is a fixed window of `points` per `duration` seconds.
 */
import rlf from "rate-limiter-flexible";
import type { RateLimiterCompatibleAbstract as Compatible, RateLimiterRes as Res } from "rate-limiter-flexible";
import { type Queryable, RateLimiter, type Decision } from "./index.js";
import { fixedWindow } from "./names.js";

// Runtime values of rate-limiter-flexible (the same copy the caller's wrappers check against).
// The base is extended as a plain class: its declarations say properties where the runtime
// has accessors, which this class implements.
const { RateLimiterCompatibleAbstract, RateLimiterRes } = rlf as unknown as {
  RateLimiterCompatibleAbstract: new () => object;
  RateLimiterRes: typeof Res;
};

export type { Res };

export interface RateLimiterPostgresExtensionOptions {
  db: Queryable;
  /** Points per window (default 4, as rate-limiter-flexible's). */
  points?: number;
  /** The window, in seconds (default 1). */
  duration?: number;
  /** When a consume is refused, block the key this many seconds (default 0: no block). */
  blockDuration?: number;
  /** The limit's name in the extension (default `rlflx`). */
  keyPrefix?: string;
  schema?: string;
  /** `false` keeps the windows in the server's shared memory (a memory limit): a request writes
   * no row and no WAL. Needs the extension preloaded with `rate_limiter.memory_keys` > 0; a
   * crash forgets at most the last second. */
  durable?: boolean;
}

export class RateLimiterPostgresExtension extends RateLimiterCompatibleAbstract implements Compatible {
  readonly points: number;
  readonly duration: number;
  private _blockDuration: number;
  private readonly _keyPrefix: string;
  private readonly limiter: RateLimiter;
  private readonly config: Record<string, unknown>;

  constructor(options: RateLimiterPostgresExtensionOptions) {
    super();
    this.points = options.points ?? 4;
    this.duration = options.duration ?? 1;
    this._blockDuration = options.blockDuration ?? 0;
    this._keyPrefix = options.keyPrefix ?? "rlflx";
    this.limiter = new RateLimiter(options.db, { schema: options.schema });
    // maxReserved lets a penalty take the window into debt by up to one window's points.
    this.config = fixedWindow(this.points, this.duration * 1000, {
      maxReserved: this.points,
      ...(options.durable === false ? { durable: false } : {}),
    });
  }

  get keyPrefix(): string {
    return this._keyPrefix;
  }

  get blockDuration(): number {
    return this._blockDuration;
  }

  set blockDuration(seconds: number) {
    this._blockDuration = seconds;
  }

  /** Not offered: always false. */
  get execEvenly(): boolean {
    return false;
  }

  set execEvenly(evenly: boolean) {
    if (evenly) throw new Error("RateLimiterPostgresExtension does not offer execEvenly");
  }

  private res(d: Decision, isFirst = false): Res {
    const left = Math.max(d.remaining, 0);
    const wait = d.ok ? d.resetAfter : d.retryAfter ?? d.resetAfter;
    return new RateLimiterRes(left, wait, this.points - d.remaining, isFirst);
  }

  /** Take `points`: resolves with what is left, or rejects with a `RateLimiterRes` when the window (or a block) refuses. Negative points are a reward. */
  async consume(key: string | number, points = 1): Promise<Res> {
    if (points < 0) return this.reward(key, -points);
    if (points > this.points) {
      throw new RateLimiterRes(0, (await this.limiter.check(this._keyPrefix, String(key), { count: 0, config: this.config })).resetAfter, this.points + points, false);
    }
    const d = await this.limiter.limit(this._keyPrefix, String(key), { count: points, config: this.config });
    if (d.ok) return this.res(d, d.remaining + points === this.points);
    if (this._blockDuration > 0 && d.reason !== "blocked") throw await this.block(key, this._blockDuration);
    throw this.res(d);
  }

  /** Take `points` whatever is left, into a debt of at most one window's points. */
  async penalty(key: string | number, points = 1): Promise<Res> {
    // As much of it as the window and a debt of one window's points hold: the rest would
    // only deny longer, which the debt already does until the next window repays it.
    const now = await this.limiter.check(this._keyPrefix, String(key), { count: 0, config: this.config });
    const take = Math.min(points, now.remaining + this.points);
    if (take <= 0) return this.res({ ...now, ok: true });
    const d = await this.limiter.limit(this._keyPrefix, String(key), { count: take, reserve: true, config: this.config });
    return this.res(d);
  }

  /** Give `points` back, as far as the window still counts them (never below none taken). */
  async reward(key: string | number, points = 1): Promise<Res> {
    return this.res(await this.limiter.credit(this._keyPrefix, String(key), { count: points, config: this.config }));
  }

  /** What the key has used in its window, or `null` when nothing. */
  async get(key: string | number): Promise<Res | null> {
    const d = await this.limiter.check(this._keyPrefix, String(key), { count: 0, config: this.config });
    return d.remaining >= this.points && d.reason !== "blocked" ? null : this.res({ ...d, ok: true });
  }

  /** Refused: the extension's state is its arithmetic's, never set from outside. */
  async set(): Promise<Res> {
    throw new Error("RateLimiterPostgresExtension.set is not supported: consume, penalty and reward change a key");
  }

  /** Deny the key for `secDuration` seconds (0: until unblocked), through the extension's block list. */
  async block(key: string | number, secDuration: number): Promise<Res> {
    await this.limiter.block(this._keyPrefix, String(key), { seconds: secDuration > 0 ? secDuration : undefined });
    return new RateLimiterRes(0, secDuration > 0 ? secDuration * 1000 : -1, this.points + 1, false);
  }

  /** Forget the key and lift its block; whether it had used anything or was blocked. */
  async delete(key: string | number): Promise<boolean> {
    const had = (await this.get(key)) !== null;
    await this.limiter.reset(this._keyPrefix, String(key));
    return (await this.limiter.unblock(this._keyPrefix, String(key))) || had;
  }
}
