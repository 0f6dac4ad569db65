#!/usr/bin/env bash
# What statistics cost: the in-process time per call with rate_limiter.track_stats on and
# off, on the allowed path (every call writes its row) and the denied path (no write, and
# with statistics on, the key goes into the top_denied sketch under its name's lock).
# KEYS calls in one statement per pass, timed inside one session per round (no connection
# or checkpoint in the measure); ROUNDS rounds that alternate which setting goes first, so
# drift (bloat, autovacuum, the page cache) falls on both alike; medians.
# Writes bench/stats.md. About 4 minutes.
source "$(dirname "$0")/../scripts/lib.sh"
KEYS=${KEYS:-50000}
ROUNDS=${ROUNDS:-21}
DB=rate_limiter_bench_stats
OUT=$ROOT/bench/stats.md

setup
build_and_install
restart_cluster
fresh_database $DB
sql() { psql -X -q -At -v ON_ERROR_STOP=1 -d $DB "$@"; }
test "$(sql -c 'SHOW shared_preload_libraries')" = rate_limiter

# 'allowed' never runs out; 'denied' has 1 token an hour, taken by the first pass.
sql -c "SELECT rate_limiter.define('allowed', 'token bucket', 1e12, '1 hour')" \
    -c "SELECT rate_limiter.define('denied', 'token bucket', 1, '1 hour')"
call() { echo "SELECT count(*) FROM generate_series(1, $KEYS) g, LATERAL rate_limiter.rate_limit('$1', g::text)"; }
sql -c "$(call allowed)" -c "$(call denied)" -c "VACUUM ANALYZE rate_limiter.state" >/dev/null

sql -c "CREATE FUNCTION timed(setting text, q text) RETURNS double precision LANGUAGE plpgsql AS \$\$
        DECLARE t0 timestamptz;
        BEGIN
            PERFORM set_config('rate_limiter.track_stats', setting, false);
            t0 := clock_timestamp();
            EXECUTE q;
            RETURN extract(epoch FROM clock_timestamp() - t0);
        END \$\$"

step "track_stats on and off, $KEYS calls per pass, $ROUNDS rounds"
RAW=$(mktemp)
for round in $(seq 1 "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then order="'on', 'off'"; else order="'off', 'on'"; fi
    sql -c CHECKPOINT
    for path in allowed denied; do
        sql -F ' ' -c "SELECT '$path', s, timed(s, \$q\$$(call "$path")\$q\$) FROM unnest(ARRAY[$order]) s" >> "$RAW"
    done
done
median() { grep "^$1 $2 " "$RAW" | awk '{print $3}' | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
us() { echo "scale=2; $1 * 1000000 / $KEYS" | bc -l; }
counted=$(sql -c "SELECT calls FROM rate_limiter.stats WHERE name = 'denied'")
{
    echo "# What statistics cost per call"
    echo
    echo "Written by \`bash bench/stats.sh\` on $(nproc) cores, PostgreSQL $(sql -c 'SHOW server_version'),"
    echo "library preloaded: $KEYS calls in one statement (\`SELECT count(*) FROM generate_series(1, $KEYS) g,"
    echo "LATERAL rate_limiter.rate_limit(name, g::text)\`) over rows that exist, with"
    echo "\`rate_limiter.track_stats\` on and off in turns, median of $ROUNDS rounds. On the allowed path"
    echo "every call writes its row; on the denied path nothing is written and, with statistics on, the"
    echo "key is counted in the name's top_denied sketch. (The denied limit counted $counted calls"
    echo "with statistics on: the first pass and the rounds with track_stats on.)"
    echo
    echo "| path | off µs/call | on µs/call | on / off |"
    echo "|---|---:|---:|---:|"
    for path in allowed denied; do
        off=$(us "$(median $path off)")
        on=$(us "$(median $path on)")
        printf '| %s | %s | %s | %s |\n' "$path" "$off" "$on" "$(echo "scale=3; $on / $off" | bc -l)"
    done
    echo
    echo "Every pass, in µs per call (path, setting, round order):"
    echo
    echo '```'
    awk -v keys="$KEYS" '{printf "%s %s %.2f\n", $1, $2, $3 * 1000000 / keys}' "$RAW"
    echo '```'
} > "$OUT"
rm -f "$RAW"
cat "$OUT"
