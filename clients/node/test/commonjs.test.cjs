// The CommonJS build, as require() finds it, with its type declarations beside it.
const { test } = require("node:test");
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");

test("require() finds every entry point, with types", () => {
  const root = path.dirname(require.resolve("rate-limiter-postgres/package.json"));
  assert.equal(typeof require("rate-limiter-postgres").RateLimiter, "function");
  assert.equal(typeof require("rate-limiter-postgres/express").PostgresStore, "function");
  assert.equal(typeof require("rate-limiter-postgres/fastify").postgresStore, "function");
  assert.equal(typeof require("rate-limiter-postgres/flexible").RateLimiterPostgresExtension, "function");
  for (const entry of ["index", "express", "fastify", "flexible"]) {
    for (const build of ["esm", "cjs"]) assert.ok(fs.existsSync(path.join(root, "dist", build, `${entry}.d.ts`)), `${build}/${entry}.d.ts`);
  }
});
