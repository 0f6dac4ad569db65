#!/usr/bin/env bash
# What the deny cache saves on a denied call: the in-process time per denied call of a limit
# without deny_cache (the state row is read) and of the same limit with it (answered from
# shared memory). One session runs PAIRS pairs of passes of KEYS denied calls (one
# statement per pass, each its own transaction), the two limits back to back in alternating
# order, timed inside the server; medians, and the median of the pairs' ratios. The cluster
# runs with 2^20 slots, so few keys share one (a shared slot misses).
# Writes bench/deny_cache.md. About 3 minutes.
source "$(dirname "$0")/../scripts/lib.sh"
KEYS=${KEYS:-10000}
PAIRS=${PAIRS:-41}
DB=rate_limiter_bench_deny_cache
OUT=$ROOT/bench/deny_cache.md

setup 15
build_and_install
CLUSTER_SETTINGS="$CLUSTER_SETTINGS -c rate_limiter.deny_cache_slots=1048576" restart_cluster
fresh_database $DB
sql() { psql -X -q -At -v ON_ERROR_STOP=1 -d $DB "$@"; }

sql -c "SELECT rate_limiter.define('read', 'token bucket', 1, '1 hour')" \
    -c "SELECT rate_limiter.define('cached', 'token bucket', 1, '1 hour', deny_cache => '1 hour')"
call() { echo "SELECT count(*) FROM generate_series(1, $KEYS) g, LATERAL rate_limiter.rate_limit('$1', g::text) d WHERE NOT d.ok"; }
# The first pass takes every key's token, the second is denied (and fills the cache).
sql -c "$(call read)" -c "$(call cached)" -c "$(call read)" -c "$(call cached)" -c "VACUUM ANALYZE rate_limiter.state" >/dev/null

sql -c "CREATE TABLE timings (pair int, limit_name text, seconds double precision, denied bigint)" \
    -c "CREATE PROCEDURE pairs(pairs int) LANGUAGE plpgsql AS \$\$
        DECLARE t0 timestamptz; seconds double precision; denied bigint; limit_name text;
        BEGIN
            FOR p IN 1 .. pairs LOOP
                FOREACH limit_name IN ARRAY CASE WHEN p % 2 = 1 THEN '{read,cached}'::text[] ELSE '{cached,read}' END LOOP
                    t0 := clock_timestamp();
                    EXECUTE replace(\$q\$$(call NAME)\$q\$, 'NAME', limit_name) INTO denied;
                    seconds := extract(epoch FROM clock_timestamp() - t0);
                    INSERT INTO timings VALUES (p, limit_name, seconds, denied);
                    COMMIT;
                END LOOP;
            END LOOP;
        END \$\$"
step "denied calls read and cached, $PAIRS pairs of $KEYS calls"
sql -c CHECKPOINT -c "CALL pairs($PAIRS)"
# Every measured call was denied, for both limits.
test "$(sql -c "SELECT count(*) FROM timings WHERE denied <> $KEYS")" = 0
read -r read cached ratio <<< "$(sql -F ' ' -c "
    SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY r.seconds)::numeric * 1e6 / $KEYS, 2),
           round(percentile_cont(0.5) WITHIN GROUP (ORDER BY c.seconds)::numeric * 1e6 / $KEYS, 2),
           round(percentile_cont(0.5) WITHIN GROUP (ORDER BY r.seconds / c.seconds)::numeric, 2)
    FROM timings r JOIN timings c USING (pair) WHERE r.limit_name = 'read' AND c.limit_name = 'cached'")"
{
    echo "# An in-memory deny cache: measured, then decided"
    echo
    echo "Written by \`bash bench/deny_cache.sh\` on $(nproc) cores, PostgreSQL $(sql -c 'SHOW server_version'),"
    echo "library preloaded with \`rate_limiter.deny_cache_slots = 1048576\`: $KEYS denied calls in one"
    echo "statement (\`SELECT count(*) FROM generate_series(1, $KEYS) g, LATERAL rate_limiter.rate_limit(name,"
    echo "g::text) d WHERE NOT d.ok\`) over exhausted rows, for a token bucket without \`deny_cache\` (the row"
    echo "is read) and one with \`deny_cache => '1 hour'\` (warmed by one pass), back to back in alternating"
    echo "order, $PAIRS pairs in one session, each pass its own transaction, timed inside the server."
    echo
    echo "| denied call | µs/call (median) |"
    echo "|---|---:|"
    echo "| reads the state row | $read |"
    echo "| answered from the deny cache | $cached |"
    echo "| speed-up (median of the pairs' ratios) | ${ratio}x |"
    echo
    echo "Every pass, in µs per call (pair, limit):"
    echo
    echo '```'
    sql -F ' ' -c "SELECT pair, limit_name, round((seconds * 1e6 / $KEYS)::numeric, 2) FROM timings ORDER BY pair, limit_name"
    echo '```'
} > "$OUT"
restart_cluster # the usual settings again
cat "$OUT"
