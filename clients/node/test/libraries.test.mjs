// The stores driven by the libraries themselves: express-rate-limit and @fastify/rate-limit
// over real HTTP on loopback, rate-limiter-flexible through its own wrappers.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import express from "express";
import { rateLimit } from "express-rate-limit";
import Fastify from "fastify";
import fastifyRateLimit from "@fastify/rate-limit";
import rlf from "rate-limiter-flexible";
import pg from "pg";
import { PostgresStore } from "rate-limiter-postgres/express";
import { postgresStore } from "rate-limiter-postgres/fastify";
import { RateLimiterPostgresExtension } from "rate-limiter-postgres/flexible";
import { unique } from "./helpers.mjs";

const { RateLimiterRes, RateLimiterUnion, RateLimiterQueue, RLWrapperBlackAndWhite } = rlf;
const pool = new pg.Pool();
after(() => pool.end());

async function serve(app) {
  const server = await new Promise((resolve) => {
    const s = app.listen(0, "127.0.0.1", () => resolve(s));
  });
  // Node 18's close() waits for fetch's kept-alive connections to time out (19 and later
  // close the idle ones): closed here, as Debian 12's Node needs.
  const close = () => new Promise((r) => {
    server.close(r);
    server.closeIdleConnections();
  });
  return { url: `http://127.0.0.1:${server.address().port}`, close };
}

test("express-rate-limit answers 429 with its headers once the window in Postgres is spent", async () => {
  const app = express();
  const name = unique("express");
  app.use(rateLimit({ windowMs: 60_000, limit: 2, standardHeaders: "draft-7", legacyHeaders: false,
                      store: new PostgresStore({ db: pool, name }) }));
  app.get("/", (_req, res) => res.send("hello"));
  const { url, close } = await serve(app);
  try {
    const answers = [];
    for (let i = 0; i < 3; i++) answers.push(await fetch(url));
    assert.deepEqual(answers.map((r) => r.status), [200, 200, 429]);
    assert.match(answers[0].headers.get("ratelimit"), /^limit=2, remaining=1, reset=\d+$/);
    assert.match(answers[2].headers.get("ratelimit"), /^limit=2, remaining=0, reset=\d+$/);
    assert.ok(Number(answers[2].headers.get("retry-after")) > 0);
    // The count is the extension's: the two granted requests are in its state, the denied one took nothing.
    const [row] = (await pool.query("SELECT value FROM rate_limiter.rate_limit_value($1, '127.0.0.1', $2::jsonb)",
      [name, JSON.stringify({ kind: "fixed window", rate: 2, period: 60000 })])).rows;
    assert.equal(row.value, 0);
  } finally {
    await close();
  }
});

test("express-rate-limit on a named limit: a customer's plan is the administrator's row, changed mid-window with its count kept", async () => {
  const app = express();
  const name = unique("express_named");
  await pool.query("SELECT rate_limiter.define($1, 'sliding window', 2, '30 days')", [name]);
  app.use(rateLimit({ windowMs: 60_000, limit: 2, standardHeaders: "draft-7", legacyHeaders: false,
                      store: new PostgresStore({ db: pool, name, named: true }) }));
  app.get("/", (_req, res) => res.send("hello"));
  const { url, close } = await serve(app);
  try {
    const statuses = async (n) => {
      const got = [];
      for (let i = 0; i < n; i++) got.push((await fetch(url)).status);
      return got;
    };
    assert.deepEqual(await statuses(3), [200, 200, 429], "the limit's 2");
    await pool.query("SELECT rate_limiter.define_tier($1, 'pro', rate => 5)", [name]);
    await pool.query("SELECT rate_limiter.override($1, '127.0.0.1', tier => 'pro')", [name]);
    assert.deepEqual(await statuses(4), [200, 200, 200, 429], "the tier's 5, less the 2 taken");
    await pool.query("SELECT rate_limiter.remove_override($1, '127.0.0.1')", [name]);
    assert.deepEqual(await statuses(1), [429], "5 taken against the limit's 2");
    // No inline config's row: the count is the named limit's.
    const { rows } = await pool.query("SELECT DISTINCT name FROM rate_limiter.state WHERE split_part(name, '#', 1) = $1", [name]);
    assert.deepEqual(rows.map((r) => r.name), [name]);
  } finally {
    await close();
  }
});

test("express-rate-limit: a failed request keeps its hit unless skipFailedRequests says otherwise", async () => {
  const app = express();
  app.use(rateLimit({ windowMs: 60_000, limit: 2, store: new PostgresStore({ db: pool, name: unique("express_fail") }) }));
  app.get("/missing", (_req, res) => res.status(404).send("no such invite"));
  app.get("/broken", () => { throw new Error("the handler failed after its hit was counted"); });
  const { url, close } = await serve(app);
  try {
    const codes = [];
    for (const path of ["/missing", "/broken", "/missing"]) codes.push((await fetch(url + path)).status);
    assert.deepEqual(codes, [404, 500, 429]);
  } finally {
    await close();
  }
});

test("express-rate-limit's skipFailedRequests gives failed requests back through decrement", async () => {
  const app = express();
  app.use(rateLimit({ windowMs: 60_000, limit: 1, skipFailedRequests: true,
                      store: new PostgresStore({ db: pool, name: unique("express_skip") }) }));
  app.get("/fail", (_req, res) => res.status(500).send("no"));
  app.get("/ok", (_req, res) => res.send("yes"));
  const { url, close } = await serve(app);
  try {
    for (let i = 0; i < 3; i++) {
      assert.equal((await fetch(`${url}/fail`)).status, 500);
      // decrement runs after the response is sent: give it its turn.
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.equal((await fetch(`${url}/ok`)).status, 200);
    // Each denial's own 429 is a failed request: its decrement must give nothing back.
    const after = [];
    for (let i = 0; i < 6; i++) {
      after.push((await fetch(`${url}/ok`)).status);
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.deepEqual(after, [429, 429, 429, 429, 429, 429]);
  } finally {
    await close();
  }
});

test("express-rate-limit with a limit function: a denial is over any limit it returns", async () => {
  const app = express();
  app.use(rateLimit({ windowMs: 60_000, limit: () => 1000, store: new PostgresStore({ db: pool, name: unique("express_fn"), limit: 2 }) }));
  app.get("/", (_req, res) => res.send("hello"));
  const { url, close } = await serve(app);
  try {
    const answers = [];
    for (let i = 0; i < 4; i++) answers.push((await fetch(url)).status);
    assert.deepEqual(answers, [200, 200, 429, 429]);
  } finally {
    await close();
  }
});

const sleep = (ms) => new Promise((r) => setTimeout(r, Math.max(ms, 0)));

/** The first hit of `key` on `store`, early in its window (the key's windows have a phase of their own). */
async function earlyInWindow(store, key) {
  let first = await store.increment(key);
  while (first.resetTime - Date.now() < 500) {
    await sleep(first.resetTime - Date.now() + 20);
    await store.resetKey(key);
    first = await store.increment(key);
  }
  assert.equal(first.totalHits, 1);
  return first;
}

test("express-rate-limit's decrement after the window has moved on gives back nothing", async () => {
  const store = new PostgresStore({ db: pool, name: unique("express_late") });
  store.init({ windowMs: 1000, limit: 2 });
  const first = await earlyInWindow(store, "k");
  assert.equal((await store.increment("k")).totalHits, 2);
  await sleep(first.resetTime - Date.now() + 50);
  await store.decrement("k");  // the hit it gives back was the last window's
  assert.deepEqual([(await store.increment("k")).totalHits, (await store.increment("k")).totalHits,
                    (await store.increment("k")).totalHits], [1, 2, 3], "the new window holds 2, no more");
  assert.equal((await store.get("k")).totalHits, 2);
  await store.resetKey("k");
  assert.equal(await store.get("k"), undefined);
});

test("express-rate-limit's decrement sent in its window that reaches the key after the window ended gives back nothing", async () => {
  // Issue 41: a decrement of a window-1 hit that landed in window 2 gave back one of window 2's
  // hits, so that window 2 admitted one more than the limit.
  const name = unique("express_straddle");
  const store = new PostgresStore({ db: pool, name });
  store.init({ windowMs: 1000, limit: 3 });
  const config = JSON.stringify({ kind: "fixed window", rate: 3, period: 1000 });
  const take = (db) => db.query("SELECT ok FROM rate_limiter.rate_limit($1, 'k', 1, false, false, $2::jsonb)", [name, config]);
  const first = await earlyInWindow(store, "k");
  assert.equal((await store.increment("k")).totalHits, 2);
  // Another transaction takes the window's last hit and holds the key's row over the window's
  // end, so that the decrement, sent while its window is current (as express-rate-limit sends
  // it), reaches the key in the next.
  const holder = await pool.connect();
  try {
    await holder.query("BEGIN");
    assert.equal((await take(holder)).rows[0].ok, true);
    const decremented = store.decrement("k");
    await sleep(first.resetTime - Date.now() + 50);
    assert.equal((await take(holder)).rows[0].ok, true, "the holder takes one hit of window 2");
    await holder.query("COMMIT");
    await decremented;
  } finally {
    holder.release();
  }
  const hits = [];
  for (let i = 0; i < 3; i++) hits.push((await store.increment("k")).totalHits);
  assert.deepEqual(hits, [2, 3, 4], "window 2 holds the holder's hit and two more");
});

test("express-rate-limit's store forgets the denials it answered once their windows have ended", async () => {
  // Issue 41: 1,995 of 2,000 denied client-chosen keys stayed in process memory for good.
  const store = new PostgresStore({ db: pool, name: unique("express_denials") });
  store.init({ windowMs: 200, limit: 0 });
  for (let i = 0; i < 2000; i++) await store.increment(`client-${i}`);
  assert.equal(store.counted.size, 2000);
  await new Promise((r) => setTimeout(r, 450));
  await store.increment("one more");
  assert.equal(store.counted.size, 1, "only the denial whose window has not ended");
});

test("@fastify/rate-limit answers 429 with retry-after from the store in Postgres, per route", async () => {
  // Its close() otherwise waits out fetch's kept-alive connections on Node 18 (72 s each).
  const fastify = Fastify({ forceCloseConnections: true });
  await fastify.register(fastifyRateLimit, { max: 2, timeWindow: 60_000, store: postgresStore({ db: pool, name: unique("fastify") }) });
  fastify.get("/", async () => "hello");
  fastify.get("/strict", { config: { rateLimit: { max: 1, timeWindow: 60_000 } } }, async () => "strict");
  fastify.get("/failing", { config: { rateLimit: { max: 1, timeWindow: 60_000 } } }, async () => {
    throw new Error("the handler failed after its hit was counted");
  });
  await fastify.listen({ port: 0, host: "127.0.0.1" });
  const url = `http://127.0.0.1:${fastify.server.address().port}`;
  try {
    const answers = [];
    for (let i = 0; i < 3; i++) answers.push(await fetch(url));
    assert.deepEqual(answers.map((r) => r.status), [200, 200, 429]);
    assert.equal(answers[0].headers.get("x-ratelimit-remaining"), "1");
    assert.equal(answers[2].headers.get("x-ratelimit-remaining"), "0");
    assert.ok(Number(answers[2].headers.get("retry-after")) > 0);
    // The route's own limit counts apart.
    assert.deepEqual([(await fetch(`${url}/strict`)).status, (await fetch(`${url}/strict`)).status], [200, 429]);
    // A handler that throws keeps its hit.
    assert.deepEqual([(await fetch(`${url}/failing`)).status, (await fetch(`${url}/failing`)).status], [500, 429]);
  } finally {
    await fastify.close();
  }
});

test("@fastify/rate-limit and rate-limiter-flexible, unchanged, honour the administrator's override of their name", async () => {
  // The stores pass their numbers inline; the key's override under that name decides all the
  // same (docs/api.md, Overrides). A fixed window moved up keeps its level, so the plan is
  // given before the window starts.
  const name = unique("fastify_plan");
  await pool.query("SELECT rate_limiter.define($1, 'fixed window', 2, '1 minute')", [name]);
  await pool.query("SELECT rate_limiter.override($1, '127.0.0.1', rate => 4, note => 'plan: pro')", [name]);
  const fastify = Fastify({ forceCloseConnections: true });
  await fastify.register(fastifyRateLimit, { max: 2, timeWindow: 60_000, store: postgresStore({ db: pool, name }) });
  fastify.get("/", async () => "hello");
  await fastify.listen({ port: 0, host: "127.0.0.1" });
  const url = `http://127.0.0.1:${fastify.server.address().port}`;
  try {
    const answers = [];
    for (let i = 0; i < 5; i++) answers.push((await fetch(url)).status);
    assert.deepEqual(answers, [200, 200, 200, 200, 429], "the key's 4, not the store's 2");
  } finally {
    await fastify.close();
  }
  const keyPrefix = unique("rlf_plan");
  await pool.query("SELECT rate_limiter.define($1, 'fixed window', 2, '1 minute')", [keyPrefix]);
  await pool.query("SELECT rate_limiter.override($1, 'pro', rate => 3)", [keyPrefix]);
  const limiter = new RateLimiterPostgresExtension({ db: pool, keyPrefix, points: 2, duration: 60 });
  for (let i = 0; i < 3; i++) await limiter.consume("pro");
  await assert.rejects(limiter.consume("pro"), (res) => res instanceof RateLimiterRes && res.remainingPoints === 0);
  await limiter.consume("free");
  await limiter.consume("free");
  await assert.rejects(limiter.consume("free"), (res) => res instanceof RateLimiterRes);
});

test("rate-limiter-flexible: consume, get, reward, penalty, block and delete keep its contract", async () => {
  const limiter = new RateLimiterPostgresExtension({ db: pool, keyPrefix: unique("rlf"), points: 3, duration: 60 });
  const first = await limiter.consume("u", 2);
  assert.ok(first instanceof RateLimiterRes);
  assert.deepEqual([first.remainingPoints, first.consumedPoints, first.isFirstInDuration], [1, 2, true]);
  await assert.rejects(limiter.consume("u", 2), (res) => res instanceof RateLimiterRes && res.remainingPoints === 0 && res.consumedPoints === 4);
  assert.equal((await limiter.get("u")).remainingPoints, 1, "the refused consume took nothing");
  assert.equal((await limiter.get("u")).consumedPoints, 2);
  assert.equal((await limiter.reward("u", 1)).remainingPoints, 2);
  assert.equal((await limiter.consume("u", -1)).remainingPoints, 3, "negative points are a reward, down to none taken");
  assert.equal((await limiter.consume("u", -5)).remainingPoints, 3, "never more than the window holds");
  const fined = await limiter.penalty("u", 9);
  assert.deepEqual([fined.remainingPoints, fined.consumedPoints], [0, 6], "as much as the window and one window's debt hold");
  await assert.rejects(limiter.consume("u"), (res) => res instanceof RateLimiterRes);
  await limiter.block("v", 30);
  await assert.rejects(limiter.consume("v"), (res) => res.msBeforeNext > 29_000);
  assert.equal(await limiter.delete("v"), true);
  assert.equal((await limiter.consume("v")).remainingPoints, 2);
  assert.equal(await limiter.get("never"), null);
  await assert.rejects(limiter.consume("w", 4), (res) => res instanceof RateLimiterRes, "more than the points, refused");
});

test("rate-limiter-flexible's RateLimiterUnion, RateLimiterQueue and RLWrapperBlackAndWhite take it", async () => {
  // Hour-long windows: no window ends while the test runs.
  const tight = new RateLimiterPostgresExtension({ db: pool, keyPrefix: unique("tight"), points: 2, duration: 3600 });
  const perMinute = new RateLimiterPostgresExtension({ db: pool, keyPrefix: unique("minute"), points: 3, duration: 3600 });
  const union = new RateLimiterUnion(tight, perMinute);
  const both = await union.consume("k");
  assert.deepEqual(Object.keys(both).sort(), [perMinute.keyPrefix, tight.keyPrefix].sort());
  await union.consume("k");
  const refused = await union.consume("k").then(() => null, (r) => r);
  assert.ok(refused[tight.keyPrefix] instanceof RateLimiterRes, "the tighter limit refused");

  const queued = new RateLimiterPostgresExtension({ db: pool, keyPrefix: unique("queue"), points: 2, duration: 1 });
  const queue = new RateLimiterQueue(queued, { maxQueueSize: 10 });
  // Five tokens at two a window need three windows: at least one is waited for, wherever the
  // key's windows begin.
  const started = Date.now();
  for (let i = 0; i < 5; i++) await queue.removeTokens(1);
  assert.ok(Date.now() - started > 10, "a token waited for the next window");

  const wrapped = new RLWrapperBlackAndWhite({ limiter: perMinute, whiteList: ["trusted"], blackList: ["evil"] });
  for (let i = 0; i < 5; i++) await wrapped.consume("trusted");
  await assert.rejects(wrapped.consume("evil"));
  assert.equal(await perMinute.get("trusted"), null, "a white-listed key never reached Postgres");
});

test("durable: false keeps each store's windows in the server's shared memory: the same answers, no row", async () => {
  const rows = async (prefix) =>
    Number((await pool.query("SELECT count(*) AS n FROM rate_limiter.state WHERE name LIKE $1 || '%'", [prefix])).rows[0].n);
  const expressName = unique("express_mem");
  const app = express();
  app.use(rateLimit({ windowMs: 60_000, limit: 2, standardHeaders: "draft-7", legacyHeaders: false,
                      store: new PostgresStore({ db: pool, name: expressName, durable: false }) }));
  app.get("/", (_req, res) => res.send("hello"));
  const { url, close } = await serve(app);
  try {
    const answers = [];
    for (let i = 0; i < 3; i++) answers.push(await fetch(url));
    assert.deepEqual(answers.map((r) => r.status), [200, 200, 429]);
    assert.match(answers[0].headers.get("ratelimit"), /^limit=2, remaining=1, reset=\d+$/);
  } finally {
    await close();
  }
  // A give-back of a memory limit counts once committed, and could land in the next window.
  const refusing = new PostgresStore({ db: pool, durable: false });
  refusing.init({ windowMs: 60_000, limit: 2, skipFailedRequests: true });
  await assert.rejects(refusing.increment("k"), /durable: false does not go with skipFailedRequests/);

  const fastifyName = unique("fastify_mem");
  // Its close() otherwise waits out fetch's kept-alive connections on Node 18 (72 s each).
  const fastify = Fastify({ forceCloseConnections: true });
  await fastify.register(fastifyRateLimit, { max: 2, timeWindow: 60_000, store: postgresStore({ db: pool, name: fastifyName, durable: false }) });
  fastify.get("/", async () => "hello");
  await fastify.listen({ port: 0, host: "127.0.0.1" });
  try {
    const base = `http://127.0.0.1:${fastify.server.address().port}`;
    const answers = [];
    for (let i = 0; i < 3; i++) answers.push(await fetch(base));
    assert.deepEqual(answers.map((r) => r.status), [200, 200, 429]);
  } finally {
    await fastify.close();
  }

  const flexiblePrefix = unique("rlf_mem");
  const limiter = new RateLimiterPostgresExtension({ db: pool, keyPrefix: flexiblePrefix, points: 3, duration: 60, durable: false });
  assert.equal((await limiter.consume("u", 2)).remainingPoints, 1);
  await assert.rejects(limiter.consume("u", 2), (res) => res instanceof RateLimiterRes && res.remainingPoints === 0 && res.consumedPoints === 4);
  assert.equal((await limiter.get("u")).remainingPoints, 1, "the refused consume took nothing");
  assert.equal((await limiter.reward("u", 1)).remainingPoints, 2);
  assert.equal((await limiter.penalty("u", 9)).remainingPoints, 0);

  for (const prefix of [expressName, fastifyName, flexiblePrefix]) {
    assert.equal(await rows(prefix), 0, `${prefix}: counted in shared memory, not in rate_limiter.state`);
  }
});

test("a store whose role lacks a grant its options need fails at its first call, naming the GRANT", async () => {
  const role = unique("rl_app");
  await pool.query(`CREATE ROLE ${role} LOGIN`);
  await pool.query(`GRANT USAGE ON SCHEMA rate_limiter TO ${role}`);
  // What docs/api.md's privileges example grants an application: the two calls, no credit.
  await pool.query(`DO $$ DECLARE f regprocedure; BEGIN
    FOR f IN SELECT p.oid FROM pg_proc p WHERE p.pronamespace = 'rate_limiter'::regnamespace
      AND p.proname IN ('rate_limit', 'check_rate_limit') LOOP
      EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO ${role}', f);
    END LOOP; END $$`);
  const app = new pg.Pool({ user: role, max: 2 });
  try {
    const skipping = new PostgresStore({ db: app, name: unique("express_grants") });
    skipping.init({ windowMs: 60_000, limit: 5, skipFailedRequests: true });
    await assert.rejects(skipping.increment("k"), (e) =>
      /may not execute rate_limiter\.credit \(decrement, which skipFailedRequests/.test(e.message) &&
      e.message.includes(`GRANT EXECUTE ON FUNCTION rate_limiter.credit TO ${role};`));
    const plain = new PostgresStore({ db: app, name: unique("express_grants") });
    plain.init({ windowMs: 60_000, limit: 5 });
    assert.equal((await plain.increment("k")).totalHits, 1, "without the skip options, rate_limit is enough");
    const blocking = new RateLimiterPostgresExtension({ db: app, keyPrefix: unique("rlf_grants"), points: 1, duration: 60, blockDuration: 10 });
    await assert.rejects(blocking.consume("k"), /may not execute rate_limiter\.block \(consume with blockDuration\)/);
    const flexible = new RateLimiterPostgresExtension({ db: app, keyPrefix: unique("rlf_grants"), points: 1, duration: 60 });
    assert.equal((await flexible.consume("k")).remainingPoints, 0);
  } finally {
    await app.end();
    await pool.query(`DROP OWNED BY ${role}`);
    await pool.query(`DROP ROLE ${role}`);
  }
});

test("the README's pool outlives its idle clients' server ending them (a restart, a failover), as its error handler lets it", async () => {
  const app = `rl_readme_${process.pid}`;
  const readmePool = new pg.Pool({ application_name: app, max: 2 });
  const errors = [];
  // The README's handler (clients/node/README.md, "The client"): without it, the 'error' an
  // idle client emits ends the process, and this test file with it.
  readmePool.on("error", (error) => errors.push(error.message));
  try {
    const limiter = new RateLimiterPostgresExtension({ db: readmePool, keyPrefix: unique("readme"), points: 5, duration: 60 });
    await limiter.consume("k");
    await pool.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", [app]);
    for (let i = 0; i < 50 && errors.length === 0; i++) await new Promise((r) => setTimeout(r, 20));
    assert.ok(errors.length > 0, "the idle client's error reached the pool");
    assert.equal((await limiter.consume("k")).consumedPoints, 2, "the next call runs on a new client");
  } finally {
    await readmePool.end();
  }
});
