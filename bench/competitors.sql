-- The alternatives rate_limiter is measured against, each a token bucket on its own table
-- laid out as rate_limiter.state is (texts in COLLATE "C", unique index leading with key,
-- fillfactor 90), without the shard column. rate and capacity are arguments, so every
-- competitor runs the same limits.
CREATE SCHEMA bench;

CREATE TABLE bench.bare_state (
    name text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    value float8 NOT NULL,
    ts timestamptz NOT NULL,
    PRIMARY KEY (key, name)
) WITH (fillfactor = 90);
CREATE TABLE bench.plpgsql_state (LIKE bench.bare_state INCLUDING ALL) WITH (fillfactor = 90);
-- ok records the last decision: RETURNING sees only the new row.
CREATE TABLE bench.upsert_state (LIKE bench.bare_state INCLUDING ALL, ok boolean) WITH (fillfactor = 90);

-- What users write by hand: lock the row, do the math, write back when allowed.
CREATE FUNCTION bench.plpgsql_limit(p_name text, p_key text, p_rate float8, p_capacity float8)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v float8;
    t timestamptz;
    now_ts timestamptz := clock_timestamp();
BEGIN
    SELECT value, ts INTO v, t FROM bench.plpgsql_state
        WHERE name = p_name AND key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO bench.plpgsql_state VALUES (p_name, p_key, p_capacity - 1, now_ts)
            ON CONFLICT DO NOTHING;
        RETURN true;
    END IF;
    v := least(p_capacity, v + extract(epoch FROM now_ts - t)::float8 * p_rate);
    IF v < 1 THEN
        RETURN false;
    END IF;
    UPDATE bench.plpgsql_state SET value = v - 1, ts = now_ts
        WHERE name = p_name AND key = p_key;
    RETURN true;
END
$$;

-- Fill each competitor's table (and rate_limiter.state) with the keys a workload uses, so
-- every competitor updates an existing row, as in steady state.
CREATE FUNCTION bench.seed(p_name text, p_keys int, p_capacity float8) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO bench.bare_state SELECT p_name, g::text, p_capacity, now() FROM generate_series(1, p_keys) g;
    INSERT INTO bench.plpgsql_state SELECT p_name, g::text, p_capacity, now() FROM generate_series(1, p_keys) g;
    INSERT INTO bench.upsert_state SELECT p_name, g::text, p_capacity, now(), true FROM generate_series(1, p_keys) g;
    SELECT count(*) FROM generate_series(1, p_keys) g, LATERAL rate_limiter.rate_limit(p_name, g::text);
$$;
