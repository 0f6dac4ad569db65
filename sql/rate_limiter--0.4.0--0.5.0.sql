-- rate_limiter 0.4.0 -> 0.5.0: a hot (name, key)'s debits found by their own index, so that
-- loading its escrow or folding its log reads only its rows, however long the log is.
-- Run ALTER EXTENSION rate_limiter UPDATE after installing the library: until then, hot
-- calls in this database get SQLSTATE 55000 with that hint.
--
-- Runs as a superuser with search_path = rate_limiter; it names no operator or function.

CREATE INDEX debits_key ON rate_limiter.debits (name, key, seq);
COMMENT ON INDEX rate_limiter.debits_key IS
    'A hot (name, key)''s debits in seq order: what loading its escrow and folding read.';
