-- The bucket arithmetic of src/bucket/, file by file, operation for operation (the same float8
-- rounding): times in ms since the Unix epoch, durations in ms. No table; IMMUTABLE but where a
-- calendar window reads its time zone's rules (STABLE, and never in a parallel worker: the zone
-- is looked up as SET TimeZone does).
--
-- What it is about (bucket/types.rs).

-- One shard's state, as bucket::State: counts are the sliding window's {previous, current},
-- the rolling window's cells, or a token bucket's and fixed window's {-capacity}, the capacity
-- its value is what is left of, negated (NULL in a row written before 0.8.0).
CREATE TYPE rate_limiter._state AS (value double precision, ts double precision, granted_at double precision,
                                    counts double precision[]);

-- The config the arithmetic reads, as bucket::Config (per shard; split: one shard's share of a
-- limit of several, whose state keeps no capacity mark).
CREATE TYPE rate_limiter._config AS (
    kind text, rate double precision, period double precision, capacity double precision,
    max_reserved double precision, start double precision, min_gap double precision, buckets integer,
    mode text, cal_unit text, cal_n integer, cal_zone text, cal_anchor double precision, shards integer,
    split boolean);

-- bucket::Check: what taking `count` from a state at `now` gives.
CREATE TYPE rate_limiter._check AS (
    ok boolean, value double precision, ts double precision, available double precision,
    retry_after double precision, granted_at double precision, reason text, counts double precision[]);
