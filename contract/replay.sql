-- The vectors' calls through SQL (contract/vectors.json, docs/testing.md): the extension's
-- #[pg_test] and the SQL-only edition's replay (scripts/replay_vectors.sh) create this function
-- and list what it returns, each answer that differs from the file's. Each case starts from an
-- empty rate_limiter.state; each step moves rate_limiter.fake_now to the vectors' start plus
-- its "at" (ms) and makes its call with the case's inline config, an error answered as its
-- SQLSTATE and message. A decision is compared as jsonb, so 5 and 5.0 are one number and
-- every float8 is compared by its shortest exact text (extra_float_digits 1).
CREATE FUNCTION pg_temp.vector_mismatches(vectors jsonb)
RETURNS TABLE (about text, step integer, expected jsonb, answered jsonb)
LANGUAGE plpgsql
SET extra_float_digits = 1
AS $replay$
DECLARE
    c jsonb;
    s jsonb;
    ms numeric;
    k text;
    answer jsonb;
    st text;
    msg text;
BEGIN
    FOR c IN SELECT value FROM pg_catalog.jsonb_array_elements(vectors -> 'cases') LOOP
        DELETE FROM rate_limiter.state;
        step := 0;
        FOR s IN SELECT value FROM pg_catalog.jsonb_array_elements(c -> 'steps') LOOP
            step := step + 1;
            ms := (vectors ->> 'start')::numeric + (s ->> 'at')::numeric;
            -- Whole days and the seconds of the last: exact to the microsecond.
            PERFORM pg_catalog.set_config('rate_limiter.fake_now',
                (timestamptz 'epoch' + make_interval(days => pg_catalog.div(ms, 86400000)::int,
                                                     secs => (pg_catalog.mod(ms, 86400000) / 1000)::float8))::text,
                false);
            k := CASE WHEN s ? 'key' THEN s ->> 'key' ELSE c ->> 'key' END;
            BEGIN
                CASE coalesce(s ->> 'call', 'rate_limit')
                WHEN 'rate_limit' THEN
                    SELECT to_jsonb(d) INTO answer FROM rate_limiter.rate_limit(c ->> 'name', k,
                        coalesce((s ->> 'count')::float8, 1), coalesce((s ->> 'reserve')::boolean, false),
                        config => c -> 'config') d;
                WHEN 'check_rate_limit' THEN
                    SELECT to_jsonb(d) INTO answer FROM rate_limiter.check_rate_limit(c ->> 'name', k,
                        coalesce((s ->> 'count')::float8, 1), coalesce((s ->> 'reserve')::boolean, false),
                        config => c -> 'config') d;
                WHEN 'credit' THEN
                    SELECT to_jsonb(d) INTO answer FROM rate_limiter.credit(c ->> 'name', k,
                        coalesce((s ->> 'count')::float8, 1), c -> 'config') d;
                END CASE;
            EXCEPTION WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
                answer := pg_catalog.jsonb_build_object('sqlstate', st, 'message', msg);
            END;
            IF answer IS DISTINCT FROM s -> 'expect' THEN
                about := c ->> 'about';
                expected := s -> 'expect';
                answered := answer;
                RETURN NEXT;
            END IF;
        END LOOP;
    END LOOP;
END
$replay$;
