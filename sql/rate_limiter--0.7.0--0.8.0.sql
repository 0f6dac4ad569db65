-- rate_limiter 0.7.0 -> 0.8.0 (issue 64): what a key used carries across a change of its
-- numbers on every kind. A token bucket's or fixed window's row keeps, beside its level, the
-- capacity that level is left of (rate_limiter.state.counts, written by the library from its
-- next write on; a row of 0.7.0 is read at its level until then). No table changes shape.

\echo Use "ALTER EXTENSION rate_limiter UPDATE TO '0.8.0'" to load this file. \quit

COMMENT ON COLUMN rate_limiter.state.counts IS
    'Sliding window: {tokens taken in the window before ts, tokens taken in the window from ts} (a row 0.4.0 wrote holds the first only). Rolling window: tokens taken per counting cell, oldest first, the last starting at ts. Token bucket and fixed window: {-capacity}, the capacity value is what is left of, negated, so that a key whose numbers change keeps what it used (NULL in a row written before 0.8.0).';
