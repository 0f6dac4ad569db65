#!/usr/bin/env bash
# Calls per second on one global limit with 16 clients whose transactions hold the row
# about 2 ms after the call, for shards = 1, 4, 16, and the same workload over 10,000
# distinct keys. Uses the project's throwaway cluster (started if needed); loopback only,
# bounded by DURATION seconds per run. Prints a markdown table.
source "$(dirname "$0")/../scripts/lib.sh"
DURATION=${DURATION:-10}
CLIENTS=16
setup 15
build_and_install
start_cluster
fresh_database rate_limiter_bench
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

psql -X -q -d rate_limiter_bench <<'SQL'
-- Rates so high nothing is ever denied: the run measures lock queueing, not limiting.
SELECT rate_limiter.define('global_' || s, 'token bucket', 1e12, '1 second', shards => s) FROM unnest(ARRAY[1, 4, 16]) s;
SELECT rate_limiter.define('per_key', 'token bucket', 1e12, '1 second');
SQL

run() { # label, pgbench script
    printf '%s\n' "$2" > "$work/script.sql"
    local tps
    tps=$(pgbench -n -M prepared -c $CLIENTS -j 2 -T "$DURATION" -f "$work/script.sql" rate_limiter_bench 2>&1 |
        sed -n 's/^tps = \([0-9.]*\) .*/\1/p')
    printf '| %s | %.0f |\n' "$1" "$tps"
}

hold='SELECT pg_sleep(0.002);'
echo
echo "| workload ($CLIENTS clients, row held ~2 ms, ${DURATION}s each) | calls/s |"
echo "|---|---:|"
for s in 1 4 16; do
    run "one global limit, shards = $s" "BEGIN; SELECT ok FROM rate_limiter.rate_limit('global_$s'); $hold COMMIT;"
done
run "10,000 distinct keys, shards = 1" "\\set k random(1, 10000)
BEGIN; SELECT ok FROM rate_limiter.rate_limit('per_key', CAST(:k AS text)); $hold COMMIT;"
