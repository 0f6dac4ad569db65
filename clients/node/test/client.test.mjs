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
  assert.equal(headers["RateLimit-Policy"], `"${name}";q=2;qu="requests";w=3600`);
  // A key's own numbers, its override's, when the key is given.
  await pool.query("SELECT rate_limiter.override($1, 'bob', rate => 5)", [name]);
  const bob = await rl.limit(name, "bob");
  assert.equal((await rl.headers(name, bob, { key: "bob" }))["RateLimit-Policy"], `"${name}";q=5;qu="requests";w=3600`);
  assert.equal((await rl.credit(name, "alice")).granted, -1);
  assert.equal((await rl.value(name, "alice")).value, 1);
  await rl.reset(name, "alice");
  assert.equal((await rl.check(name, "alice", { count: 0 })).remaining, 2);
});

test("limitOk is limit's ok, and takes as limit does (issue 66)", async () => {
  const rl = new RateLimiter(pool);
  const name = unique("ok");
  await pool.query("SELECT rate_limiter.define($1, 'fixed window', 3, '1 hour')", [name]);
  // Interleaved with limit on one key: one count, whichever asks.
  assert.equal(await rl.limitOk(name, "k"), true);
  assert.equal((await rl.limit(name, "k")).ok, true);
  assert.equal(await rl.limitOk(name, "k", { count: 2 }), false, "one left: denied, nothing taken");
  assert.equal(await rl.limitOk(name, "k"), true);
  assert.equal((await rl.check(name, "k", { count: 0 })).remaining, 0);
  assert.equal(await rl.limitOk(name, "k"), false);
  await assert.rejects(rl.limitOk(name, "k", { throws: true }), RateLimitedError);
  // An inline memory limit.
  const config = { kind: "token bucket", rate: 1, period: 3600000, durable: false };
  assert.equal(await rl.limitOk(name, "m", { config }), true);
  assert.equal(await rl.limitOk(name, "m", { config }), false);
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

test("creditBefore takes back a late credit of a durable limit and refuses a memory limit (issue 52, F7)", async () => {
  // A fixed window of 2 per 2 s starting 10 s ago by the real clock; the extension's clock is
  // put in the second window, so a credit for the first lands late (the real clock, which
  // creditBefore compares with `before`, is past the first window's end too).
  const start = Date.now() - 10_000;
  const client = await pool.connect();
  try {
    const rl = new RateLimiter(client);
    const at = (ms) => client.query("SELECT set_config('rate_limiter.fake_now', to_timestamp($1::float8 / 1000)::text, false)", [start + ms]);
    for (const durable of [true, false]) {
      const name = unique(durable ? "late_credit" : "late_credit_memory");
      const config = { kind: "fixed window", rate: 2, period: 2000, start, durable };
      await client.query("SELECT rate_limiter.define($1, 'fixed window', 2, '2 seconds', start => to_timestamp($2::float8 / 1000), durable => $3)",
                         [name, start, durable]);
      for (const [how, options] of [["named", {}], ["inline", { config }]]) {
        const key = `k_${how}`;
        await at(100);
        assert.equal((await rl.limit(name, key, options)).ok, true, "window 1's hit");
        await at(2100);
        assert.equal((await rl.limit(name, key, options)).ok, true);
        assert.equal((await rl.limit(name, key, options)).ok, true, "window 2 full");
        if (durable) {
          assert.equal(await rl.creditBefore(name, key, new Date(start + 2000), options), 0, "taken back");
        } else {
          await assert.rejects(rl.creditBefore(name, key, new Date(start + 2000), options), /is a memory limit \(durable: false\)/);
        }
        assert.equal((await rl.limit(name, key, options)).ok, false, `${how}: 2 admitted in a window of 2`);
      }
    }
  } finally {
    await client.query("RESET rate_limiter.fake_now");
    client.release();
  }
});
