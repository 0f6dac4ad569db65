// express-rate-limit with its counts in Postgres (rate-limiter-postgres/express), and a limit
// taken inside the request's own transaction (rate-limiter-postgres). Run from an install of
// the package (clients/node); it serves on loopback, asks three times each, and exits.
import express from "express";
import { rateLimit } from "express-rate-limit";
import pg from "pg";
import { RateLimiter } from "rate-limiter-postgres";
import { PostgresStore } from "rate-limiter-postgres/express";

const pool = new pg.Pool();
// An idle client that loses its server (a restart, a failover) emits 'error' on the pool:
// without a listener, Node ends the process.
pool.on("error", (error) => console.error("idle PostgreSQL client:", error.message));
const app = express();
const name = `example_${process.pid}`;

// 1. The library's middleware: two requests a minute per client, the store in Postgres.
app.get("/hello", rateLimit({ windowMs: 60_000, limit: 2, standardHeaders: "draft-7", legacyHeaders: false,
                              store: new PostgresStore({ db: pool, name }) }), (_req, res) => res.send("hello"));

// 3. The same middleware on a named limit: a customer's plan is the administrator's row, and
// changing it mid-window needs no change here (step 3 below).
app.get("/plan", rateLimit({ windowMs: 60_000, limit: 2, standardHeaders: "draft-7", legacyHeaders: false,
                             store: new PostgresStore({ db: pool, name: `${name}_plan`, named: true }) }), (_req, res) => res.send("hello"));

// 2. A limit inside the transaction that writes: a failed write gives the token back.
app.post("/messages", async (req, res) => {
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    const d = await new RateLimiter(client).limit(`${name}_send`, "alice", { config: { kind: "fixed window", rate: 1, period: 3600000 } });
    if (!d.ok) {
      await client.query("ROLLBACK");
      return res.status(429).set("Retry-After", String(Math.ceil(d.retryAfter / 1000))).send("slow down");
    }
    if (req.query.fail) throw new Error("the write failed");
    await client.query("COMMIT");
    res.send("sent");
  } catch {
    await client.query("ROLLBACK");
    res.status(500).send("failed");
  } finally {
    client.release();
  }
});

const server = app.listen(0, "127.0.0.1", async () => {
  const url = `http://127.0.0.1:${server.address().port}`;
  const hello = [];
  for (let i = 0; i < 3; i++) hello.push((await fetch(`${url}/hello`)).status);
  console.log(`1. express-rate-limit: ${hello.join(" ")}`);
  const sends = [];
  for (const path of ["/messages?fail=1", "/messages", "/messages"]) sends.push((await fetch(url + path, { method: "POST" })).status);
  console.log(`2. in the transaction: ${sends.join(" ")}`);
  // 3. Two requests in 30 days, then the client is moved to the 'pro' tier (5) mid-window:
  // the 2 it took still count.
  await pool.query("SELECT rate_limiter.define($1, 'sliding window', 2, '30 days')", [`${name}_plan`]);
  await pool.query("SELECT rate_limiter.define_tier($1, 'pro', rate => 5)", [`${name}_plan`]);
  const plan = [];
  for (let i = 0; i < 3; i++) plan.push((await fetch(`${url}/plan`)).status);
  await pool.query("SELECT rate_limiter.override($1, '127.0.0.1', tier => 'pro')", [`${name}_plan`]);
  plan.push("|");
  for (let i = 0; i < 4; i++) plan.push((await fetch(`${url}/plan`)).status);
  console.log(`3. a plan changed mid-window: ${plan.join(" ")}`);
  await pool.query("DELETE FROM rate_limiter.limits WHERE name = $1", [`${name}_plan`]);
  server.close();
  await pool.end();
});
