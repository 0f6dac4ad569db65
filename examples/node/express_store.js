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
  server.close();
  await pool.end();
});
