#!/usr/bin/env bash
# In-process cost per call of each kind and mode, and the row size of each: KEYS calls in one
# statement per pass, no network, median of ROUNDS rounds, on the project's throwaway cluster.
# Pass 1 creates every row, pass 2 takes again (allowed), pass 3 is denied (each limit holds
# 2 tokens an hour).
# Writes bench/kinds.md. About 6 minutes.
source "$(dirname "$0")/../scripts/lib.sh"
KEYS=${KEYS:-200000}
ROUNDS=${ROUNDS:-3}
DB=rate_limiter_bench_kinds
OUT=$ROOT/bench/kinds.md

setup 15
build_and_install
restart_cluster
fresh_database $DB
sql() { psql -X -q -At -v ON_ERROR_STOP=1 -d $DB "$@"; }

# name | define() arguments after the name
LIMITS="token_bucket|'token bucket', 2, '1 hour'
fixed_window|'fixed window', 2, '1 hour'
sliding_window|'sliding window', 2, '1 hour'
rolling_window_10|'rolling window', 2, '1 hour'
rolling_window_64|'rolling window', 2, '1 hour', buckets => 64
partial|'token bucket', 2, '1 hour', mode => 'partial'
penalize|'token bucket', 2, '1 hour', mode => 'penalize'
min_gap|'token bucket', 2, '1 hour', min_gap => '1 ms'
blocks_100k|'token bucket', 2, '1 hour'"

step "in-process cost, $KEYS keys per pass, $ROUNDS rounds"
RAW=$(mktemp)
# Rounds take turns over the limits, so drift (autovacuum, the page cache) spreads evenly.
for round in $(seq 1 "$ROUNDS"); do
    while IFS='|' read -r name args; do
        limit="${name}_$round"
        # The block lookup: none while the table is empty, an index probe per call otherwise.
        if [ "$name" = blocks_100k ]; then
            sql -c "INSERT INTO rate_limiter.blocks (name, key) SELECT 'elsewhere', 'b' || g FROM generate_series(1, 100000) g"
        fi
        sql -c "SELECT rate_limiter.define('$limit', $args)"
        call="SELECT count(*) FROM generate_series(1, $KEYS) g, LATERAL rate_limiter.rate_limit('$limit', g::text)"
        for pass in create allowed denied; do
            echo "$name $pass $(seconds_in $DB "$call")" >> "$RAW"
        done
        echo "$name bytes $(sql -c "SELECT avg(pg_column_size(s.*)) FROM rate_limiter.state s WHERE name = '$limit'")" >> "$RAW"
        sql -c "DELETE FROM rate_limiter.state WHERE name = '$limit'" -c "VACUUM rate_limiter.state"
        sql -c "TRUNCATE rate_limiter.blocks"
    done <<< "$LIMITS"
done
# The median of the rounds, in µs per call (bytes as they are).
median() { grep "^$1 $2 " "$RAW" | awk '{print $3}' | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
us() { echo "scale=2; $1 * 1000000 / $KEYS" | bc -l; }
{
    echo "# In-process cost per call, by kind and mode"
    echo
    echo "Written by \`bash bench/kinds.sh\` on $(nproc) cores, PostgreSQL $(sql -c 'SHOW server_version'):"
    echo "$KEYS calls in one statement (\`SELECT count(*) FROM generate_series(1, $KEYS) g, LATERAL"
    echo "rate_limiter.rate_limit(name, g::text)\`), each limit 2 tokens an hour, median of $ROUNDS rounds"
    echo "taken in turns. Pass 1 creates every row, pass 2 takes again (allowed), pass 3 is denied"
    echo "(in the penalize mode a denial writes). blocks_100k is the token bucket with 100,000 blocks of"
    echo "other keys in rate_limiter.blocks (the others run with none). Row bytes: \`pg_column_size(state.*)\` with a key of up"
    echo "to 6 characters (add 24 bytes of index entry and 4 of line pointer per row)."
    echo
    echo "| limit | create µs/call | allowed µs/call | denied µs/call | allowed / token bucket | row bytes |"
    echo "|---|---:|---:|---:|---:|---:|"
    base=$(us "$(median token_bucket allowed)")
    while IFS='|' read -r name args; do
        allowed=$(us "$(median "$name" allowed)")
        printf '| %s (%s) | %s | %s | %s | %s | %.0f |\n' "$name" "$args" "$(us "$(median "$name" create)")" \
            "$allowed" "$(us "$(median "$name" denied)")" "$(echo "scale=2; $allowed / $base" | bc -l)" \
            "$(median "$name" bytes)"
    done <<< "$LIMITS"
} > "$OUT"
rm -f "$RAW"
cat "$OUT"
