// rate_limiter from node-postgres (pg): the limit and the application's write in one
// transaction (BEGIN/COMMIT on one client from the pool); RL429 becomes RateLimited.
// Connection: the libpq environment (PGHOST, PGPORT, PGUSER, PGDATABASE).
import pg from "pg";

class RateLimited extends Error {
  constructor(retryAfterMs, cause) {
    super(`rate limited, retry after ${retryAfterMs} ms`, { cause });
    this.retryAfterMs = retryAfterMs;
  }
}

async function take(client, user, throws = false) {
  try {
    const { rows } = await client.query(
      "SELECT ok, remaining FROM rate_limiter.rate_limit('pg_send', $1, throws => $2)", [user, throws]);
    return rows[0];
  } catch (e) {
    if (e.code === "RL429") throw new RateLimited(JSON.parse(e.detail).retryAfter, e);
    throw e;
  }
}

async function remaining(client, user) {
  // count => 0: what is left now; rounded, as a token bucket refills continuously.
  const { rows } = await client.query(
    "SELECT remaining FROM rate_limiter.check_rate_limit('pg_send', $1, count => 0)", [user]);
  return rows[0].remaining.toFixed(2);
}

async function inTransaction(pool, work) {
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    const result = await work(client);
    await client.query("COMMIT");
    return result;
  } catch (e) {
    await client.query("ROLLBACK");
    throw e;
  } finally {
    client.release();
  }
}

const pool = new pg.Pool();
// An idle client that loses its server (a restart, a failover) emits 'error' on the pool:
// without a listener, Node ends the process.
pool.on("error", (error) => console.error("idle PostgreSQL client:", error.message));
await pool.query("SELECT rate_limiter.define('pg_send', 'token bucket', 3, '1 hour')");
await pool.query("SELECT rate_limiter.reset_rate_limit('pg_send', 'alice')");
await pool.query("DROP TABLE IF EXISTS pg_messages");
await pool.query("CREATE TABLE pg_messages (author text, body text)");
const bodies = async () => (await pool.query("SELECT body FROM pg_messages")).rows.map((r) => r.body);

// 1. The limit and the write commit together.
const decision = await inTransaction(pool, async (client) => {
  const d = await take(client, "alice");
  await client.query("INSERT INTO pg_messages VALUES ($1, $2)", ["alice", "hello"]);
  return d;
});
console.log(`1. committed: ok=${decision.ok}, messages=${JSON.stringify(await bodies())}, remaining=${await remaining(pool, "alice")}`);

// 2. An application error after the limit was taken: both roll back.
try {
  await inTransaction(pool, async (client) => {
    await take(client, "alice");
    await client.query("INSERT INTO pg_messages VALUES ($1, $2)", ["alice", "lost"]);
    throw new Error("the application failed");
  });
} catch (e) {
  if (e.message !== "the application failed") throw e;
}
console.log(`2. rolled back: messages=${JSON.stringify(await bodies())}, remaining=${await remaining(pool, "alice")}`);

// 3. Past the limit, throws => true raises RL429; the DETAIL's retryAfter comes along.
try {
  await inTransaction(pool, async (client) => {
    for (let i = 0; i < 3; i++) await take(client, "alice", true);
  });
} catch (e) {
  if (!(e instanceof RateLimited)) throw e;
  console.log(`3. RateLimited from SQLSTATE ${e.cause.code}: retry after ${Math.round(e.retryAfterMs / 1000)} s`);
}
await pool.end();
