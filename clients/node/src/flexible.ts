/**
 * A limiter for rate-limiter-flexible 11: `new RateLimiterPostgresExtension({ db, points, duration })`
 * consumes from the extension, and works inside `RateLimiterUnion`, `RateLimiterQueue` and
 * `RLWrapperBlackAndWhite`. Each key is a fixed window of `points` per `duration` seconds.
 */
import rlf from "rate-limiter-flexible";
import type { RateLimiterCompatibleAbstract as Compatible, RateLimiterRes as Res } from "rate-limiter-flexible";
import { type Queryable, RateLimiter, type Decision } from "./index.js";
import { fixedWindow } from "./names.js";
import { Grants } from "./grants.js";

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
  /** Points per window, required as in rate-limiter-flexible 11 (0 or less: every consume of a point is refused). */
  points: number;
  /** The window, in seconds, required as in rate-limiter-flexible 11 (0: a window that never ends). */
  duration: number;
  /** When a consume is refused, block the key this many seconds (default 0: no block). */
  blockDuration?: number;
  /** The limit's name in the extension (default `rlflx`). */
  keyPrefix?: string;
  schema?: string;
  /** `false` keeps the windows in the server's shared memory (a memory limit): a request writes
   * no row and no WAL. Needs the extension preloaded with `rate_limiter.memory_keys` > 0; a
   * crash forgets at most the last second. */
  durable?: boolean;
  /** Only `false` (the default): spreading consumes over the window is not offered. */
  execEvenly?: boolean;
}

/** The options this limiter keeps; any other is refused by name rather than ignored. */
const KEPT_OPTIONS = new Set(["db", "points", "duration", "blockDuration", "keyPrefix", "schema", "durable", "execEvenly"]);

/** A window that never ends (`duration: 0`): the extension's longest period, 100 years. */
const FOREVER_MS = 36_525 * 86_400_000;

function refuseUnknown(options: object, kept: Set<string>, where: string): void {
  for (const [name, value] of Object.entries(options ?? {})) {
    if (value !== undefined && !kept.has(name)) {
      throw new TypeError(`RateLimiterPostgresExtension does not support the option "${name}"${where}: it would be ignored`);
    }
  }
}

/** A method's own options (the library's `customDuration`, a store's `attrs`): none is kept. */
function refuseCallOptions(options: object, method: string): void {
  refuseUnknown(options, new Set(), ` of ${method}`);
}

export class RateLimiterPostgresExtension extends RateLimiterCompatibleAbstract implements Compatible {
  readonly points: number;
  readonly duration: number;
  private _blockDuration: number;
  private readonly _keyPrefix: string;
  private readonly limiter: RateLimiter;
  private readonly config: Record<string, unknown>;
  private readonly grants: Grants;

  constructor(options: RateLimiterPostgresExtensionOptions) {
    super();
    refuseUnknown(options, KEPT_OPTIONS, "");
    // As rate-limiter-flexible 11 validates them, with its messages.
    if (!Number.isFinite(options.points)) throw new Error("points must be set and must be a finite number");
    if (!(typeof options.duration === "number" && Number.isFinite(options.duration) && options.duration >= 0)) {
      throw new Error("duration must be set and must be a finite, non-negative number");
    }
    if (options.keyPrefix !== undefined && typeof options.keyPrefix !== "string") throw new Error("keyPrefix must be string");
    if (options.execEvenly) throw new TypeError("RateLimiterPostgresExtension does not offer execEvenly");
    this.points = options.points;
    this.duration = options.duration;
    this._blockDuration = options.blockDuration ?? 0;
    this._keyPrefix = options.keyPrefix ?? "rlflx";
    this.limiter = new RateLimiter(options.db, { schema: options.schema });
    // maxReserved lets a penalty take the window into debt by up to one window's points. With
    // no points at all nothing is asked of the extension (every consume is refused here).
    this.config =
      this.points > 0
        ? fixedWindow(this.points, this.duration > 0 ? this.duration * 1000 : FOREVER_MS, {
            maxReserved: this.points,
            ...(options.durable === false ? { durable: false } : {}),
          })
        : {};
    this.grants = new Grants(this.limiter, "RateLimiterPostgresExtension", () => ({
      rate_limit: "consume and penalty",
      check_rate_limit: "get, and consume of more points than the limit",
      ...(this._blockDuration > 0 ? { block: "consume with blockDuration" } : {}),
    }));
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

  /** The library's key of `key`: `keyPrefix:key`, or `key` itself with an empty prefix. */
  getKey(key: string | number): string | number {
    return this._keyPrefix.length > 0 ? `${this._keyPrefix}:${key}` : key;
  }

  /** `getKey` undone. */
  parseKey(rlKey: string): string {
    return this._keyPrefix.length > 0 ? rlKey.substring(this._keyPrefix.length + 1) : rlKey;
  }

  /** The library's time left: -1 for a window that never ends. */
  private msLeft(ms: number): number {
    return this.duration === 0 ? -1 : ms;
  }

  private res(d: Decision, isFirst = false): Res {
    const left = Math.max(d.remaining, 0);
    return new RateLimiterRes(left, this.msLeft(d.ok ? d.resetAfter : d.retryAfter ?? d.resetAfter), this.points - d.remaining, isFirst);
  }

  /** A blocked key, as the library reports one: the block's points (`points + 1`, plus what
   * this call asked for) and its time left, -1 for a block with no end. */
  private blocked(d: Decision, asked: number): Res {
    return new RateLimiterRes(0, d.retryAfter ?? -1, this.points + 1 + asked, false);
  }

  /** A consume of `points` refused with `used` already taken: the library's counter would hold
   * `used + points` (nothing is taken here). With a `blockDuration`, the consume that first goes
   * over the limit blocks the key for that long, as the library does. */
  private async refused(key: string | number, points: number, used: number, msLeft: number): Promise<Res> {
    const consumed = used + points;
    if (this._blockDuration > 0 && used <= this.points) {
      await this.limiter.block(this._keyPrefix, String(key), { seconds: this._blockDuration });
      return new RateLimiterRes(0, this._blockDuration * 1000, consumed, used === 0);
    }
    return new RateLimiterRes(Math.max(this.points - consumed, 0), this.msLeft(msLeft), consumed, used === 0);
  }

  /** Take `points`: resolves with what is left, or rejects with a `RateLimiterRes` when the window (or a block) refuses. Negative points are a reward. */
  async consume(key: string | number, points = 1, options: object = {}): Promise<Res> {
    refuseCallOptions(options, "consume");
    if (points < 0) return this.reward(key, -points);
    await this.grants.require();
    if (this.points <= 0 || points > this.points) {
      // Never fits: refused as the library refuses it, taking nothing. A fresh key's window
      // is a whole one, as the library's starts at this call.
      if (points === 0) return new RateLimiterRes(0, this.msLeft(this.duration * 1000), 0, true);
      const now = this.points > 0 ? await this.limiter.check(this._keyPrefix, String(key), { count: 0, config: this.config }) : undefined;
      if (now?.reason === "blocked") throw this.blocked(now, points);
      const used = now === undefined ? 0 : this.points - now.remaining;
      throw await this.refused(key, points, used, used > 0 && now !== undefined ? now.resetAfter : this.duration * 1000);
    }
    const d = await this.limiter.limit(this._keyPrefix, String(key), { count: points, config: this.config });
    if (d.ok) return this.res(d, d.remaining + points === this.points);
    if (d.reason === "blocked") throw this.blocked(d, points);
    throw await this.refused(key, points, this.points - d.remaining, d.retryAfter ?? d.resetAfter);
  }

  /** Take `points` whatever is left, into a debt of at most one window's points. */
  async penalty(key: string | number, points = 1, options: object = {}): Promise<Res> {
    refuseCallOptions(options, "penalty");
    if (this.points <= 0) return new RateLimiterRes(0, this.msLeft(this.duration * 1000), points, true);
    // As much of it as the window and a debt of one window's points hold: the rest would
    // only deny longer, which the debt already does until the next window repays it.
    const now = await this.limiter.check(this._keyPrefix, String(key), { count: 0, config: this.config });
    const take = Math.min(points, now.remaining + this.points);
    if (take <= 0) return this.res({ ...now, ok: true });
    const d = await this.limiter.limit(this._keyPrefix, String(key), { count: take, reserve: true, config: this.config });
    return this.res(d);
  }

  /** Give `points` back, as far as the window still counts them (never below none taken). */
  async reward(key: string | number, points = 1, options: object = {}): Promise<Res> {
    refuseCallOptions(options, "reward");
    if (this.points <= 0) return new RateLimiterRes(0, this.msLeft(this.duration * 1000), 0, true);
    return this.res(await this.limiter.credit(this._keyPrefix, String(key), { count: points, config: this.config }));
  }

  /** What the key has used in its window, or `null` when nothing. */
  async get(key: string | number, options: object = {}): Promise<Res | null> {
    refuseCallOptions(options, "get");
    if (this.points <= 0) return null;
    const d = await this.limiter.check(this._keyPrefix, String(key), { count: 0, config: this.config });
    if (d.reason === "blocked") return this.blocked(d, 0);
    return d.remaining >= this.points ? null : this.res({ ...d, ok: true });
  }

  /** Refused: the extension's state is its arithmetic's, never set from outside. */
  async set(): Promise<Res> {
    throw new Error("RateLimiterPostgresExtension.set is not supported: consume, penalty and reward change a key");
  }

  /** Deny the key for `secDuration` seconds (0: until unblocked), through the extension's block list. */
  async block(key: string | number, secDuration: number, options: object = {}): Promise<Res> {
    refuseCallOptions(options, "block");
    await this.limiter.block(this._keyPrefix, String(key), { seconds: secDuration > 0 ? secDuration : undefined });
    return new RateLimiterRes(0, secDuration > 0 ? secDuration * 1000 : -1, this.points + 1, false);
  }

  /** Forget the key and lift its block; whether it had used anything or was blocked. */
  async delete(key: string | number, options: object = {}): Promise<boolean> {
    refuseCallOptions(options, "delete");
    const had = (await this.get(key)) !== null;
    if (this.points > 0) await this.limiter.reset(this._keyPrefix, String(key));
    return (await this.limiter.unblock(this._keyPrefix, String(key))) || had;
  }
}
