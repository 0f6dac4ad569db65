// The client itself, from the installed package: decisions, RL429 as RateLimitedError, and a
// limit that rolls back with the transaction it was taken in.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import pg from "pg";
import { RateLimiter, RateLimitedError } from "rate-limiter-postgres";
import { unique } from "./helpers.mjs";

const pool = new pg.Pool();
after(() => pool.end());

test("limit, check, credit, value and headers answer as the extension does", async () => {
  const rl = new RateLimiter(pool);
  const name = unique("client");
  await pool.query("SELECT rate_limiter.define($1, 'fixed window', 2, '1 hour')", [name]);
  const first = await rl.limit(name, "alice");
  assert.equal(first.ok, true);
  assert.equal(first.remaining, 1);
  assert.equal(first.granted, 1);
  assert.equal((await rl.check(name, "alice", { count: 2 })).ok, false);
  assert.equal((await rl.limit(name, "alice")).ok, true);
  const denied = await rl.limit(name, "alice");
  assert.deepEqual([denied.ok, denied.reason, denied.limitedBy], [false, "exhausted", name]);
  assert.ok(denied.retryAfter > 0);
  const headers = await rl.headers(name, denied);
  assert.equal(headers["RateLimit"], `"${name}";r=0;t=${Math.ceil(denied.resetAfter / 1000)}`);
  assert.equal(headers["Retry-After"], String(Math.ceil(denied.retryAfter / 1000)));
  assert.equal((await rl.credit(name, "alice")).granted, -1);
  assert.equal((await rl.value(name, "alice")).value, 1);
  await rl.reset(name, "alice");
  assert.equal((await rl.check(name, "alice", { count: 0 })).remaining, 2);
});

test("throws rejects with RateLimitedError carrying retryAfter", async () => {
  const rl = new RateLimiter(pool);
  const config = { kind: "token bucket", rate: 1, period: 60000 };
  const name = unique("throws");
  await rl.limit(name, "k", { config, throws: true });
  await assert.rejects(rl.limit(name, "k", { config, throws: true }), (e) => {
    assert.ok(e instanceof RateLimitedError);
    assert.equal(e.code, "RL429");
    assert.equal(e.limit, name);
    assert.ok(e.retryAfter > 59000 && e.retryAfter <= 60000, String(e.retryAfter));
    return true;
  });
});

test("inside BEGIN ... ROLLBACK the tokens come back", async () => {
  const name = unique("rollback");
  const config = { kind: "fixed window", rate: 1, period: 3600000 };
  const client = await pool.connect();
  try {
    const rl = new RateLimiter(client);
    await client.query("BEGIN");
    assert.equal((await rl.limit(name, "k", { config })).ok, true);
    await client.query("ROLLBACK");
    await client.query("BEGIN");
    assert.equal((await rl.limit(name, "k", { config })).ok, true, "the rolled-back token came back");
    await client.query("COMMIT");
    assert.equal((await rl.limit(name, "k", { config })).ok, false, "the committed one did not");
  } finally {
    client.release();
  }
});

test("a concurrency limit's lease is taken, renewed and released", async () => {
  const rl = new RateLimiter(pool);
  const name = unique("slots");
  await pool.query("SELECT rate_limiter.define($1, 'concurrency', 1, '1 second')", [name]);
  const lease = await rl.acquire(name, "team", { lease: 60000 });
  assert.equal(lease.ok, true);
  assert.match(lease.leaseId, /^[0-9a-f-]{36}$/);
  assert.equal((await rl.acquire(name, "team", { lease: 60000 })).ok, false);
  assert.equal(await rl.renew(name, "team", lease.leaseId, 120000), true);
  assert.equal(await rl.release(name, "team", lease.leaseId), true);
  assert.equal((await rl.acquire(name, "team")).ok, true);
});
