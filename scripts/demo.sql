-- A short tour. The clock is pinned with rate_limiter.fake_now so the output is the same
-- every time; without it the limiter uses the real clock.
\set ECHO queries
\pset footer off
SET rate_limiter.fake_now = '2026-01-01 12:00:00+00';

-- A named limit: 10 messages per minute per user, bursts of up to 3.
SELECT rate_limiter.define('send_message', 'token bucket', rate => 10, period => '1 minute', capacity => 3);

-- Three calls are allowed, the fourth is denied with retry_after in milliseconds.
SELECT * FROM rate_limiter.rate_limit('send_message', key => 'alice');
SELECT * FROM rate_limiter.rate_limit('send_message', key => 'alice', count => 2);
SELECT * FROM rate_limiter.rate_limit('send_message', key => 'alice');

-- Six seconds later one token has flowed back in.
SET rate_limiter.fake_now = '2026-01-01 12:00:06+00';
SELECT * FROM rate_limiter.rate_limit('send_message', key => 'alice');

-- The limit is part of your transaction: roll back and the token comes back.
BEGIN;
SELECT ok, remaining FROM rate_limiter.rate_limit('send_message', key => 'bob', count => 3);
ROLLBACK;
SELECT ok, remaining FROM rate_limiter.check_rate_limit('send_message', key => 'bob', count => 3);

-- An inline limit (the Convex config object): a fixed window of 2 per second.
SELECT attempt, (d).ok, (d).retry_after, (d).remaining
FROM (SELECT attempt, rate_limiter.rate_limit('login', key => '10.0.0.7',
             config => '{"kind": "fixed window", "rate": 2, "period": 1000, "start": 0}') AS d
      FROM generate_series(1, 3) AS attempt) AS tries;

-- throws => true raises SQLSTATE RL429 instead of returning ok = false.
\set VERBOSITY verbose
SELECT * FROM rate_limiter.rate_limit('send_message', key => 'alice', throws => true);
\set VERBOSITY default

-- What is stored: one small row per (name, key).
SELECT value, ts, effective_config FROM rate_limiter.rate_limit_value('send_message', key => 'alice');
