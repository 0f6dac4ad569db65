-- The application of bench/app/run.sh: a messages table, as an app that sends messages
-- has, its users (what a read request reads), and the limits the harness calls inside its
-- transaction. Each limit refills
-- one token per ten years and holds more than any run takes, so every call is granted and
-- its tokens used are the calls committed (the ledger).
CREATE SCHEMA app;
CREATE TABLE app.messages (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id bigint NOT NULL,
    body text NOT NULL,
    sent_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX messages_user ON app.messages (user_id);
CREATE TABLE app.users (id bigint PRIMARY KEY, name text NOT NULL, plan text NOT NULL);
INSERT INTO app.users SELECT g, 'user ' || g, 'free' FROM generate_series(1, 100000) g;

SELECT rate_limiter.define('app_per_user', 'token bucket', 1, '3650 days', 1e12);
SELECT rate_limiter.define('app_memory', 'token bucket', 1, '3650 days', 1e12, durable => false);
SELECT rate_limiter.define('app_hot', 'token bucket', 1, '3650 days', 1e12, hot => true);
SELECT rate_limiter.define('app_sharded', 'token bucket', 1, '3650 days', 1e12, shards => 16);
-- Every user has a row already, as in an application that has been running.
SELECT count(*) FROM generate_series(1, 100000) g,
    LATERAL rate_limiter.rate_limit('app_per_user', g::text, 0);
VACUUM ANALYZE;
