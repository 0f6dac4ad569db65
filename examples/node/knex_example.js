// rate_limiter from Knex (on node-postgres): knex.transaction() commits or rolls back the
// limit with the rows the query builder writes; RL429 becomes RateLimited.
// Connection: the libpq environment (PGHOST, PGPORT, PGUSER, PGDATABASE).
import knexFactory from "knex";

class RateLimited extends Error {
  constructor(retryAfterMs, cause) {
    super(`rate limited, retry after ${retryAfterMs} ms`, { cause });
    this.retryAfterMs = retryAfterMs;
  }
}

// With no connection settings, node-postgres reads the PG* environment.
const knex = knexFactory({ client: "pg", connection: {} });

async function take(trx, user, throws = false) {
  try {
    const { rows } = await trx.raw(
      "SELECT ok, remaining FROM rate_limiter.rate_limit('knex_send', ?, throws => ?)", [user, throws]);
    return rows[0];
  } catch (e) {
    if (e.code === "RL429") throw new RateLimited(JSON.parse(e.detail).retryAfter, e);
    throw e;
  }
}

async function remaining(user) {
  // count => 0: what is left now; rounded, as a token bucket refills continuously.
  const { rows } = await knex.raw(
    "SELECT remaining FROM rate_limiter.check_rate_limit('knex_send', ?, count => 0)", [user]);
  return rows[0].remaining.toFixed(2);
}

await knex.raw("SELECT rate_limiter.define('knex_send', 'token bucket', 3, '1 hour')");
await knex.raw("SELECT rate_limiter.reset_rate_limit('knex_send', 'alice')");
await knex.schema.dropTableIfExists("knex_messages");
await knex.schema.createTable("knex_messages", (t) => { t.text("author"); t.text("body"); });
const bodies = async () => (await knex("knex_messages").select("body")).map((r) => r.body);

// 1. The limit and the write commit together.
const decision = await knex.transaction(async (trx) => {
  const d = await take(trx, "alice");
  await trx("knex_messages").insert({ author: "alice", body: "hello" });
  return d;
});
console.log(`1. committed: ok=${decision.ok}, messages=${JSON.stringify(await bodies())}, remaining=${await remaining("alice")}`);

// 2. An application error after the limit was taken: both roll back.
try {
  await knex.transaction(async (trx) => {
    await take(trx, "alice");
    await trx("knex_messages").insert({ author: "alice", body: "lost" });
    throw new Error("the application failed");
  });
} catch (e) {
  if (e.message !== "the application failed") throw e;
}
console.log(`2. rolled back: messages=${JSON.stringify(await bodies())}, remaining=${await remaining("alice")}`);

// 3. Past the limit, throws => true raises RL429; the DETAIL's retryAfter comes along.
try {
  await knex.transaction(async (trx) => {
    for (let i = 0; i < 3; i++) await take(trx, "alice", true);
  });
} catch (e) {
  if (!(e instanceof RateLimited)) throw e;
  console.log(`3. RateLimited from SQLSTATE ${e.cause.code}: retry after ${Math.round(e.retryAfterMs / 1000)} s`);
}
await knex.destroy();
