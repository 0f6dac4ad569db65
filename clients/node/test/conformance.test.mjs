// The peer libraries' own store cases, ported: their packages ship no tests, so each case of
// express-rate-limit's memory-store and external-store tests and of rate-limiter-flexible's
// store, Memory, Abstract, Union, Queue and BlackAndWhite tests that a store can keep is here,
// named as upstream names it, with its assertions. A case the store's documented contract
// answers otherwise (clients/node/README.md) is listed in DIFFERENCES with the reason, and
// asserts what the store does instead, so a change either way fails.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import express from "express";
import { rateLimit } from "express-rate-limit";
import rlf from "rate-limiter-flexible";
import pg from "pg";
import { PostgresStore } from "rate-limiter-postgres/express";
import { RateLimiterPostgresExtension } from "rate-limiter-postgres/flexible";
import { unique } from "./helpers.mjs";

const { RateLimiterRes, RateLimiterUnion, RateLimiterQueue, RLWrapperBlackAndWhite } = rlf;
const { RateLimiterQueueError } = rlf;
const pool = new pg.Pool();
after(() => pool.end());
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function store(limit = 3, windowMs = 60_000) {
  const s = new PostgresStore({ db: pool, name: unique("erl") });
  s.init({ windowMs, limit });
  return s;
}

function flexible(options) {
  return new RateLimiterPostgresExtension({ db: pool, keyPrefix: unique("rlf"), ...options });
}

// ---- express-rate-limit: test/library/memory-store-test.ts and test/external/stores ----

test("express-rate-limit memory store: returns the current hit count and reset time for a key", async () => {
  const s = store();
  await s.increment("k");
  const info = await s.get("k");
  assert.equal(info.totalHits, 1);
  assert.ok(info.resetTime instanceof Date);
});

test("express-rate-limit memory store: sets the value to 1 on first call to increment, then increments", async () => {
  const s = store();
  assert.equal((await s.increment("k")).totalHits, 1);
  assert.equal((await s.increment("k")).totalHits, 2);
});

test("express-rate-limit memory store: decrements the key", async () => {
  const s = store();
  await s.increment("k");
  await s.increment("k");
  await s.decrement("k");
  assert.equal((await s.increment("k")).totalHits, 2);
});

test("express-rate-limit memory store: does not decrement the key below 0 (get is defined with totalHits 0)", async () => {
  const s = store();
  await s.increment("k");
  await s.decrement("k");
  await s.decrement("k");
  const info = await s.get("k");
  assert.ok(info !== undefined, "a key counted in a running window is known");
  assert.equal(info.totalHits, 0);
  assert.equal(await s.get("never"), undefined, "a key never seen is not");
});

test("express-rate-limit memory store: resetKey removes the key, and the next increment counts 1", async () => {
  const s = store();
  await s.increment("k");
  await s.increment("k");
  await s.resetKey("k");
  assert.equal(await s.get("k"), undefined);
  assert.equal((await s.increment("k")).totalHits, 1);
});

test("express-rate-limit memory store: a key's count starts again once its window has passed", async () => {
  const s = store(3, 300);
  await s.increment("k");
  await s.increment("k");
  await sleep(350); // a window of 300 ms, wherever the key's windows begin, has ended
  assert.equal((await s.increment("k")).totalHits, 1);
});

test("express-rate-limit external stores: should work (three 200s, then 429)", async () => {
  const app = express();
  app.use(rateLimit({ windowMs: 60_000, limit: 3, store: new PostgresStore({ db: pool, name: unique("erl_http") }) }));
  app.get("/", (_req, res) => res.send("hi"));
  const server = await new Promise((resolve) => { const s = app.listen(0, "127.0.0.1", () => resolve(s)); });
  try {
    const url = `http://127.0.0.1:${server.address().port}/`;
    const codes = [];
    for (let i = 0; i < 4; i++) codes.push((await fetch(url)).status);
    assert.deepEqual(codes, [200, 200, 200, 429]);
  } finally {
    await new Promise((r) => server.close(r));
  }
});

// ---- rate-limiter-flexible: RateLimiterAbstract.test.js ----

test("rate-limiter-flexible abstract: points and duration are required and validated with the library's messages", () => {
  for (const points of [undefined, null, "10", {}, true, NaN, Infinity]) {
    assert.throws(() => flexible({ points, duration: 1 }), { message: "points must be set and must be a finite number" });
  }
  for (const duration of [undefined, null, "5", {}, -1]) {
    assert.throws(() => flexible({ points: 1, duration }), { message: "duration must be set and must be a finite, non-negative number" });
  }
  for (const points of [10, 0, -5]) assert.equal(flexible({ points, duration: 1 }).points, points);
  assert.equal(flexible({ points: 1, duration: 0 }).duration, 0);
  assert.throws(() => flexible({ points: 1, duration: 1, keyPrefix: 5 }), { message: "keyPrefix must be string" });
});

test("rate-limiter-flexible abstract: getKey and parseKey, with the default, a custom and an empty prefix", () => {
  const byDefault = new RateLimiterPostgresExtension({ db: pool, points: 1, duration: 1 });
  assert.equal(byDefault.getKey("test-key"), "rlflx:test-key");
  assert.equal(byDefault.parseKey("rlflx:test-key"), "test-key");
  assert.equal(byDefault.parseKey("rlflx:user:123:action"), "user:123:action");
  const custom = flexible({ points: 1, duration: 1, keyPrefix: "test" });
  assert.equal(custom.getKey("key"), "test:key");
  const bare = flexible({ points: 1, duration: 1, keyPrefix: "" });
  assert.equal(bare.getKey("test1"), "test1");
  assert.equal(bare.getKey(5), 5, "as the library: the key itself, of its own type");
  assert.equal(bare.parseKey("test1"), "test1");
});

test("rate-limiter-flexible: an option the limiter does not keep is refused by name, never ignored", async () => {
  for (const option of ["insuranceLimiter", "inMemoryBlockOnConsumed", "inMemoryBlockDuration", "blockOnConsumed",
    "execEvenlyMinDelayMs", "storeClient", "storeType", "tableName", "tableCreated", "clearExpiredByTimeout", "customDuration"]) {
    assert.throws(() => flexible({ points: 1, duration: 1, [option]: 1 }), new RegExp(`"${option}"`));
  }
  assert.throws(() => flexible({ points: 1, duration: 1, execEvenly: true }), /execEvenly/);
  flexible({ points: 1, duration: 1, execEvenly: false });
  const l = flexible({ points: 2, duration: 60 });
  // RateLimiterMemory.test.js' customDuration cases: refused, not applied silently.
  for (const method of ["consume", "penalty", "reward"]) {
    await assert.rejects(l[method]("k", 1, { customDuration: 1 }), /"customDuration" of/);
  }
  for (const method of ["get", "delete"]) await assert.rejects(l[method]("k", { customDuration: 1 }), /"customDuration" of/);
});

// ---- rate-limiter-flexible: RateLimiterMemory.test.js and the store tests ----

test("rate-limiter-flexible: consume 1 point; get by key; get resolves null if key is not set", async () => {
  const l = flexible({ points: 2, duration: 5 });
  const res = await l.consume("k");
  assert.deepEqual([res.consumedPoints, res.remainingPoints, res.isFirstInDuration], [1, 1, true]);
  assert.equal((await l.get("k")).remainingPoints, 1);
  assert.equal(await l.get("nothing"), null);
});

test("rate-limiter-flexible: should respect points and duration; should handle multiple concurrent requests", async () => {
  const l = flexible({ points: 5, duration: 5 });
  assert.equal((await l.consume("k")).consumedPoints, 1);
  const second = await l.consume("k");
  assert.deepEqual([second.consumedPoints, second.remainingPoints], [2, 3]);
  const parallel = await Promise.all([1, 2, 3].map(() => l.consume("c")));
  assert.deepEqual(parallel.map((r) => r.consumedPoints).sort(), [1, 2, 3]);
});

test("rate-limiter-flexible: can not consume more than maximum points (a whole window to wait on a fresh key, the library's consumedPoints)", async () => {
  const l = flexible({ points: 5, duration: 10 });
  await assert.rejects(l.consume("fresh", 6), (res) =>
    res instanceof RateLimiterRes && res.remainingPoints === 0 && res.consumedPoints === 6 && res.isFirstInDuration &&
    res.msBeforeNext === 10_000);
  await l.consume("used", 1);
  await assert.rejects(l.consume("used", 6), (res) =>
    res.consumedPoints === 7 && !res.isFirstInDuration && res.msBeforeNext > 0 && res.msBeforeNext <= 10_000);
  const one = flexible({ points: 1, duration: 5 });
  await assert.rejects(one.consume("k", 2), (res) => res.msBeforeNext >= 0 && res.consumedPoints === 2);
});

test("rate-limiter-flexible: blocks key for block duration when consumed more than points, once, until the block expires", async () => {
  const l = flexible({ points: 1, duration: 1, blockDuration: 2 });
  await assert.rejects(l.consume("over", 2), (res) => res.msBeforeNext === 2000 && res.consumedPoints === 2);
  await assert.rejects(l.consume("over"), (res) => res.msBeforeNext > 1000, "blocked for its blockDuration, past the window");
  await l.consume("k");
  await assert.rejects(l.consume("k"), (res) => res.msBeforeNext === 2000 && res.consumedPoints === 2, "the consume that crossed the limit blocks");
  await sleep(1201);
  await assert.rejects(l.consume("k"), (res) => res.msBeforeNext < 1000 && res.msBeforeNext > 0, "not blocked a second time");
  await sleep(850);
  assert.equal((await l.consume("k")).consumedPoints, 1, "the block expired in blockDuration seconds");
});

test("rate-limiter-flexible: block custom key; block key forever, if secDuration is 0", async () => {
  const l = flexible({ points: 1, duration: 5 });
  await l.block("k", 2);
  await assert.rejects(l.consume("k"), (res) => res.msBeforeNext > 1000 && res.msBeforeNext <= 2000);
  const forever = await l.block("f", 0);
  assert.deepEqual([forever.msBeforeNext, forever.consumedPoints], [-1, 2]);
  const got = await l.get("f");
  assert.deepEqual([got.msBeforeNext, got.consumedPoints, got.remainingPoints], [-1, 2, 0]);
  await assert.rejects(l.consume("f"), (res) => res.msBeforeNext === -1 && res.consumedPoints === 3);
});

test("rate-limiter-flexible: makes penalty; reward points; delete resolves true if key is set, false if not", async () => {
  const l = flexible({ points: 3, duration: 5 });
  await l.consume("k");
  await l.penalty("k");
  assert.equal((await l.get("k")).consumedPoints, 2);
  assert.equal((await l.reward("k", 2)).consumedPoints, 0);
  await l.consume("d");
  assert.equal(await l.delete("d"), true);
  assert.equal(await l.get("d"), null, "should delete key");
  assert.equal(await l.delete("d"), false);
});

test("rate-limiter-flexible: does not expire key if duration set to 0", async () => {
  const l = flexible({ points: 3, duration: 0 });
  assert.equal((await l.consume("k")).msBeforeNext, -1);
  await l.consume("k");
  const got = await l.get("k");
  assert.deepEqual([got.consumedPoints, got.msBeforeNext], [2, -1]);
  await l.consume("k");
  await assert.rejects(l.consume("k"), (res) => res.msBeforeNext === -1 && res.consumedPoints === 4);
});

test("rate-limiter-flexible: does not allow to consume if points is zero (a consume of 0 is allowed)", async () => {
  const l = flexible({ points: 0, duration: 5 });
  await assert.rejects(l.consume("k"), (res) => res instanceof RateLimiterRes && res.msBeforeNext >= 0 && res.consumedPoints === 1);
  const none = await l.consume("k", 0);
  assert.deepEqual([none.remainingPoints, none.consumedPoints], [0, 0]);
  assert.equal(await l.get("k"), null);
});

test("rate-limiter-flexible: should expire points after duration; consume starts a new window once the previous has ended", async () => {
  const l = flexible({ points: 2, duration: 1 });
  await l.consume("k", 2);
  await sleep(1100); // a window of 1 s, wherever the key's windows begin, has ended
  assert.equal(await l.get("k"), null);
  const fresh = await l.consume("k");
  assert.deepEqual([fresh.consumedPoints, fresh.remainingPoints], [1, 1]);
  assert.ok(fresh.msBeforeNext > 0 && fresh.msBeforeNext <= 1000);
});

// ---- RateLimiterUnion.test.js ----

test("rate-limiter-flexible Union: consume from all limiters; reject the one, or both, without enough points", async () => {
  const limit1 = flexible({ keyPrefix: unique("limit1"), points: 1, duration: 60 });
  const limit2 = flexible({ keyPrefix: unique("limit2"), points: 2, duration: 60 });
  const union = new RateLimiterUnion(limit1, limit2);
  const res = await union.consume("k");
  assert.deepEqual([res[limit1.keyPrefix].remainingPoints, res[limit2.keyPrefix].remainingPoints], [0, 1]);
  const one = await union.consume("j", 2).then(() => null, (r) => r);
  assert.deepEqual(Object.keys(one), [limit1.keyPrefix], "only the limiter without enough points rejects");
  assert.equal(one[limit1.keyPrefix].remainingPoints, 0);
  const both = await union.consume("i", 3).then(() => null, (r) => r);
  assert.deepEqual(Object.keys(both).sort(), [limit1.keyPrefix, limit2.keyPrefix].sort());
  assert.throws(() => new RateLimiterUnion(limit1, {}), "all limiters have to be instance of RateLimiterAbstract");
});

// ---- RateLimiterQueue.test.js ----

test("rate-limiter-flexible Queue: remove tokens, remaining tokens, more than allowed, per-key queues", async () => {
  const l = flexible({ points: 2, duration: 60 });
  const queue = new RateLimiterQueue(l);
  assert.equal(await queue.removeTokens(1), 1, "remove 1 token works and 1 remaining");
  assert.equal(await queue.getTokensRemaining(), 1);
  assert.equal(await queue.removeTokens(1, "customkey"), 1, "creates internal instance by key");
  assert.equal(await queue.getTokensRemaining(), 1, "the default key still has its own");
  assert.equal(await queue.getTokensRemaining("unknown"), 2, "returns maximum if internal limiter by key does not exist");
  await assert.rejects(queue.removeTokens(3), (e) => e instanceof RateLimiterQueueError);
  const all = new RateLimiterQueue(flexible({ points: 2, duration: 60 }));
  assert.equal(await all.removeTokens(2), 0, "remove all tokens works and 0 remaining");
  // The default key blocked for a second: the next request waits in the queue (its one
  // place), and the one after is refused.
  const one = flexible({ points: 1, duration: 60 });
  const bounded = new RateLimiterQueue(one, { maxQueueSize: 1 });
  await one.block("limiter", 1);
  const waiting = bounded.removeTokens(1);
  await sleep(50);
  await assert.rejects(bounded.removeTokens(1), (e) => e instanceof RateLimiterQueueError, "queue length reaches maximum");
  assert.equal(await waiting, 0, "the queued request fired once the key could take it");
});

// ---- RLWrapperBlackAndWhite.test.js ----

test("rate-limiter-flexible BlackAndWhite: black and white lists over the limiter", async () => {
  const l = flexible({ points: 1, duration: 60 });
  const wrapped = new RLWrapperBlackAndWhite({ limiter: l, whiteList: ["white"], blackList: ["black", "white"],
    isBlackListed: (k) => k === "blackfn", isWhiteListed: (k) => k === "whitefn" });
  const res = await wrapped.consume("test");
  assert.deepEqual([res.remainingPoints, res.consumedPoints], [0, 1], "consume if not blacked");
  await assert.rejects(wrapped.consume("black"), (r) => r.remainingPoints === 0 && r.consumedPoints === 0);
  const blocked = await wrapped.block("b", 30);
  assert.ok(blocked.msBeforeNext > 1000 && blocked.msBeforeNext <= 30_000, "block if not blacked");
  assert.ok((await wrapped.block("black", 30)).msBeforeNext > 30_000, "block resolved if blacked");
  assert.equal((await wrapped.penalty("p")).consumedPoints, 1, "penalty if not blacked");
  await wrapped.consume("r");
  assert.equal((await wrapped.reward("r")).consumedPoints, 0, "reward if not blacked");
  await wrapped.consume("g");
  assert.equal((await wrapped.get("g")).consumedPoints, 1, "get if not blacked");
  for (const m of ["penalty", "reward", "get"]) {
    const r = await wrapped[m]("black");
    assert.deepEqual([r.consumedPoints, r.remainingPoints], [0, 0], `${m} resolved if blacked`);
  }
  assert.equal((await wrapped.consume("white", 3)).consumedPoints, 0, "resolve consume if whited (white wins over black)");
  assert.equal((await wrapped.get("white")).remainingPoints, Number.MAX_SAFE_INTEGER);
  assert.equal((await wrapped.consume("whitefn")).remainingPoints, Number.MAX_SAFE_INTEGER, "isWhiteListed");
  await assert.rejects(wrapped.consume("blackfn"), (r) => r.msBeforeNext === Number.MAX_SAFE_INTEGER, "isBlackListed");
  await wrapped.consume("d");
  assert.equal(await wrapped.delete("d"), true, "delete data straight on limiter");
});

/** Upstream cases this store answers otherwise, by its documented contract (README: "Where the
 * contract differs"); each is asserted above or below as the store answers it. */
export const DIFFERENCES = {
  "rate-limiter-flexible set / set points by key forever": "set is refused: a key changes only through its arithmetic",
  "rate-limiter-flexible execEvenly cases": "execEvenly is not offered (true throws)",
  "rate-limiter-flexible customDuration cases, BlackAndWhite options forwarding": "per-call options are refused by name",
  "rate-limiter-flexible a refused consume counts its points": "a denial takes nothing; it reports the points the library would hold",
  "rate-limiter-flexible get of a key with nothing used": "null, where the library returns a record of 0 points",
  "rate-limiter-flexible Queue timing cases (a request fired after 1 s)": "fixed windows start at a per-key phase, so the next window may begin sooner than a whole duration",
  "rate-limiter-flexible BlackAndWhite runActionAnyway cases": "upstream reads the store before its fire-and-forget call has landed",
  "express-rate-limit resetAll": "not offered",
};

test("the documented differences hold: set refused, execEvenly refused, a denial takes nothing", async () => {
  const l = flexible({ points: 2, duration: 60 });
  await assert.rejects(l.set("k", 1), /not supported/);
  await l.consume("k");
  await assert.rejects(l.consume("k", 2), (r) => r.consumedPoints === 3);
  assert.equal((await l.get("k")).consumedPoints, 1, "the refused consume took nothing");
  await l.reward("k", 1);
  assert.equal(await l.get("k"), null);
  assert.equal(typeof store().resetAll, "undefined");
});
