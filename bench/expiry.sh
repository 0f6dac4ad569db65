#!/usr/bin/env bash
# State that expires, and the table it leaves behind: the share of HOT updates under
# sustained load per fillfactor (with the bytes per key each costs), prune throughput over
# 1,000,000 expired keys, the table's size under churn with pruning, and what a running
# prune costs concurrent calls. On the project's throwaway cluster (restarted so that its
# benchmark settings apply). Writes bench/expiry.md. About 9 minutes.
source "$(dirname "$0")/../scripts/lib.sh"
DURATION=${DURATION:-15}
CLIENTS=${CLIENTS:-8}
DB=rate_limiter_expiry
OUT=$ROOT/bench/expiry.md

setup 15
build_and_install
restart_cluster
sql() { psql -X -q -At -v ON_ERROR_STOP=1 -d $DB "$@"; }
bench() { # script-file -> tps
    pgbench -n -M prepared -c "$CLIENTS" -j 2 -T "$DURATION" -f "$1" $DB 2>&1 | sed -n 's/^tps = \([0-9.]*\) .*/\1/p'
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
{
    echo "# rate_limiter: expiry, pruning and HOT updates"
    echo
    echo "\`bash bench/expiry.sh\`: $(nproc) cores, PostgreSQL $(psql -X -At -d postgres -c 'SHOW server_version'), $CLIENTS clients, ${DURATION} s per run."
} > "$OUT"

step "HOT updates per fillfactor"
# spread: 100,000 existing keys of a 10/s bucket. hot: one key of a bucket that never runs
# dry. churn: keys drawn from 2,000,000, so a third of the calls create a row.
printf '\\set k random(1, 100000)\nSELECT ok FROM rate_limiter.rate_limit(%s, CAST(:k AS text));\n' "'spread'" > "$work/spread.sql"
printf 'SELECT ok FROM rate_limiter.rate_limit(%s, %s);\n' "'hot'" "'1'" > "$work/hot.sql"
printf '\\set k random(1, 2000000)\nSELECT ok FROM rate_limiter.rate_limit(%s, CAST(:k AS text));\n' "'churn'" > "$work/churn.sql"
{
    echo
    echo "## HOT updates"
    echo
    echo "Share of updates of \`rate_limiter.state\` that were HOT (\`n_tup_hot_upd / n_tup_upd\`), and the table's bytes per key (heap and index, after the spread run's keys were created)."
    echo
    echo "| fillfactor | spread | hot key | churn | bytes per key |"
    echo "|---:|---:|---:|---:|---:|"
} >> "$OUT"
for ff in 90 75 60 50; do
    fresh_database $DB
    sql -c "ALTER TABLE rate_limiter.state SET (fillfactor = $ff)"
    sql -c "SELECT rate_limiter.define('spread', 'token bucket', 10, '1 second', 10)" \
        -c "SELECT rate_limiter.define('hot', 'token bucket', 1e9, '1 second', 1e9)" \
        -c "SELECT rate_limiter.define('churn', 'token bucket', 10, '1 second', 10)" \
        -c "SELECT count(*) FROM generate_series(1, 100000) g, LATERAL rate_limiter.rate_limit('spread', g::text)"
    bytes=$(sql -c "SELECT round(pg_total_relation_size('rate_limiter.state') / count(*)::numeric, 1) FROM rate_limiter.state")
    row="| $ff"
    for w in spread hot churn; do
        sql -c "SELECT pg_stat_reset_single_table_counters('rate_limiter.state'::regclass)"
        bench "$work/$w.sql" >/dev/null
        sleep 1 # statistics are sent when a backend goes idle
        hot=$(sql -c "SELECT round(100.0 * n_tup_hot_upd / greatest(n_tup_upd, 1), 1) FROM pg_stat_user_tables WHERE relid = 'rate_limiter.state'::regclass")
        echo "fillfactor $ff $w: $hot% HOT"
        row="$row | $hot%"
    done
    echo "$row | $bytes |" >> "$OUT"
done

step "prune throughput over 1,000,000 expired keys"
fresh_database $DB
sql <<'SQL'
SET rate_limiter.fake_now = '2030-01-01';
SELECT rate_limiter.define('once', 'token bucket', 10, '1 minute', 10);
SELECT count(*) FROM generate_series(1, 1000000) g, LATERAL rate_limiter.rate_limit('once', g::text);
SQL
before=$(sql -c "SELECT count(*) || ' rows, ' || pg_size_pretty(pg_total_relation_size('rate_limiter.state')) FROM rate_limiter.state")
t0=$(date +%s.%N)
# Past the longest period: every row has refilled. Batches of 10,000, as the worker runs them.
sql -c "SET rate_limiter.fake_now = '2030-01-01 00:02'" -c "DO \$\$ BEGIN LOOP EXIT WHEN rate_limiter.prune(10000) < 10000; COMMIT; END LOOP; END \$\$"
t1=$(date +%s.%N)
sql -c "VACUUM rate_limiter.state"
after=$(sql -c "SELECT count(*) || ' rows, ' || pg_size_pretty(pg_total_relation_size('rate_limiter.state')) FROM rate_limiter.state")
rate=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", 1000000 / (b - a) }')
{
    echo
    echo "## Pruning"
    echo
    echo "1,000,000 distinct keys touched once, the clock moved past the period, then \`prune(10000)\` in a loop, committing after each batch: $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s, **$rate rows/s**. Before: $before. After, and a VACUUM: $after."
} >> "$OUT"

step "table size under churn, with the background worker"
# Preloaded, so that the worker prunes (and vacuums) every second.
CLUSTER_SETTINGS="$CLUSTER_SETTINGS -c shared_preload_libraries=rate_limiter -c rate_limiter.prune_interval=1s" restart_cluster
fresh_database $DB
sql -c "SELECT rate_limiter.define('visit', 'token bucket', 5, '2 seconds', 5)"
# Every call a new key (about one per call), each idle after: rows stay only one period.
printf '\\set k random(1, 1000000000)\nSELECT ok FROM rate_limiter.rate_limit(%s, CAST(:k AS text));\n' "'visit'" > "$work/visit.sql"
(pgbench -n -M prepared -c 4 -j 2 -T 150 -f "$work/visit.sql" $DB > "$work/visit.out" 2>&1) &
load=$!
{
    echo
    echo "## Size under churn"
    echo
    echo "4 clients, every call a new key of a 5 per 2 s bucket (rows expire 0.4 s after their call), 150 s, with \`shared_preload_libraries = 'rate_limiter'\` and \`rate_limiter.prune_interval = 1s\`: the worker prunes and then vacuums the table every second (autovacuum runs counted beside):"
    echo
    echo "| second | rows | table + index | autovacuum runs |"
    echo "|---:|---:|---:|---:|"
} >> "$OUT"
for s in $(seq 1 150); do
    sleep 1
    if [ $((s % 15)) = 0 ]; then
        echo "| $s | $(sql -c "SELECT (SELECT count(*) FROM rate_limiter.state) || ' | ' || pg_size_pretty(pg_total_relation_size('rate_limiter.state')) || ' | ' || autovacuum_count FROM pg_stat_user_tables WHERE relid = 'rate_limiter.state'::regclass") |" >> "$OUT"
    fi
done
wait $load
echo >> "$OUT"
echo "Calls: $(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$work/visit.out")." >> "$OUT"
restart_cluster # without the worker again

step "a running prune and concurrent calls"
fresh_database $DB
sql -c "SELECT rate_limiter.define('spread', 'token bucket', 10, '1 second', 10)" \
    -c "SELECT count(*) FROM generate_series(1, 100000) g, LATERAL rate_limiter.rate_limit('spread', g::text)"
quiet=$(printf "%.0f" "$(bench "$work/spread.sql")")
# 1,000,000 expired rows of another limit, pruned while the calls run.
sql -c "SET rate_limiter.fake_now = '2020-01-01'" \
    -c "SELECT count(*) FROM generate_series(1, 1000000) g, LATERAL rate_limiter.rate_limit('old', g::text, config => '{\"kind\":\"token bucket\",\"rate\":1,\"period\":1000}')"
(sql -c "DO \$\$ BEGIN LOOP EXIT WHEN rate_limiter.prune(10000) < 10000; COMMIT; END LOOP; END \$\$") &
pruner=$!
busy=$(printf "%.0f" "$(bench "$work/spread.sql")")
wait $pruner
{
    echo
    echo "## Calls while a prune runs"
    echo
    echo "Workload spread (100,000 keys): $quiet calls/s alone, $busy calls/s while one session prunes 1,000,000 expired rows in batches of 10,000 (ratio $(awk -v a="$busy" -v b="$quiet" 'BEGIN { printf "%.2f", a / b }'))."
} >> "$OUT"
echo "done: $OUT"
