#!/usr/bin/env bash
# rate_limiter against what users would otherwise run, on the project's throwaway cluster
# (restarted so that its benchmark settings apply) and a Redis on loopback: throughput
# per workload and per synchronous_commit setting, the in-process cost per call, bytes
# per row and backend memory. bare_answering is bare's UPDATE returning the seven columns
# of a decision: the floor of a call that tells its caller the answer. Writes
# bench/results.md and bench/chart.png. Competitors take turns, REPEATS rounds of DURATION
# seconds each per workload, and each reports its median: on two cores, autovacuum and the
# OS move single runs by 10% or more. About 15 minutes in all.
source "$(dirname "$0")/../scripts/lib.sh"
DURATION=${DURATION:-5}
REPEATS=${REPEATS:-3}
CLIENTS=${CLIENTS:-8}
REDIS_PORT=${REDIS_PORT:-6390}
REDIS_REQUESTS=${REDIS_REQUESTS:-200000}
DB=rate_limiter_bench
BENCH=$ROOT/bench
OUT=$BENCH/out
RAW=$OUT/raw.tsv
source "$BENCH/measure.sh"

setup 15
build_and_install
restart_cluster
install_debian_packages redis-server redis-tools
install_bench_python
fresh_database $DB
mkdir -p "$OUT"
: > "$RAW"
record() { printf '%s\n' "$(IFS=$'\t'; echo "$*")" >> "$RAW"; }
sql() { psql -X -q -At -v ON_ERROR_STOP=1 -d $DB "$@"; }

step "competitors and seed rows"
sql -f "$BENCH/competitors.sql"
# bench: the token bucket of the comparison (10/s, capacity 10) over 100,000 keys.
# hot: one key with a bucket so large that every call is allowed (the write path under
# contention). abuse: one key of the 10/s bucket, exhausted, so nearly every call is denied.
sql <<'SQL'
SELECT rate_limiter.define('bench', 'token bucket', 10, '1 second', 10);
SELECT rate_limiter.define('hot', 'token bucket', 1e9, '1 second', 1e9);
SELECT rate_limiter.define('abuse', 'token bucket', 10, '1 second', 10);
SELECT bench.seed('bench', 100000, 10);
SELECT bench.seed('hot', 1, 1e9);
SELECT bench.seed('abuse', 1, 10);
VACUUM ANALYZE;
SQL

# The statement each competitor runs for limit $1 (rate $2, capacity $3), key :k.
call() {
    case $4 in
    bare) echo "UPDATE bench.bare_state SET value = value - 1, ts = now() WHERE name = '$1' AND key = CAST(:k AS text);" ;;
    bare_answering) # the floor that also tells the caller: the decision's seven columns back
        echo "UPDATE bench.bare_state SET value = value - 1, ts = now() WHERE name = '$1' AND key = CAST(:k AS text) RETURNING value >= 0 AS ok, NULL::float8 AS retry_after, value AS remaining, 100::float8 AS reset_after, 1::float8 AS granted, NULL::text AS reason, NULL::text AS limited_by;" ;;
    plpgsql) echo "SELECT bench.plpgsql_limit('$1', CAST(:k AS text), $2, $3);" ;;
    upsert)
        local refilled="least($3, s.value + extract(epoch FROM excluded.ts - s.ts)::float8 * $2)"
        echo "INSERT INTO bench.upsert_state AS s (name, key, value, ts, ok) VALUES ('$1', CAST(:k AS text), $3 - 1, clock_timestamp(), true) ON CONFLICT (key, name) DO UPDATE SET value = CASE WHEN $refilled >= 1 THEN $refilled - 1 ELSE $refilled END, ts = excluded.ts, ok = $refilled >= 1 RETURNING ok;" ;;
    rate_limiter) echo "SELECT * FROM rate_limiter.rate_limit('$1', CAST(:k AS text));" ;;
    esac
}
script() { # workload competitor
    case $1 in
    a) printf '\\set k random(1, 100000)\n%s\n' "$(call bench 10 10 "$2")" ;;
    b) printf '\\set k 1\n%s\n' "$(call hot 1e9 1e9 "$2")" ;;
    c) printf '\\set k 1\n%s\n' "$(call abuse 10 10 "$2")" ;;
    d) printf '\\set k random(1, 100000)\nBEGIN;\n%s\nSELECT pg_sleep(0.001);\nCOMMIT;\n' "$(call bench 10 10 "$2")" ;;
    esac
}

for commit in on off; do
    for w in a b c d; do
        sql -c "VACUUM" # every workload starts from clean tables
        for round in $(seq "$REPEATS"); do
            for c in bare bare_answering plpgsql upsert rate_limiter; do
                script $w $c > "$OUT/$w-$c.sql"
                result=$(PGOPTIONS="-c synchronous_commit=$commit" pgbench -n -M prepared -c "$CLIENTS" -j 2 \
                    -T "$DURATION" -f "$OUT/$w-$c.sql" $DB 2>&1)
                tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$result")
                [ -n "$tps" ] || { echo "$result"; exit 1; }
                record tps "$commit" "$w" "$c" "$tps"
                printf 'synchronous_commit=%s workload %s round %s %-12s %10.0f calls/s\n' "$commit" "$w" "$round" "$c" "$tps"
            done
        done
    done
done

step "redis with the same token bucket in Lua (EVALSHA)"
REDIS_DIR=$(mktemp -d)
chmod 777 "$REDIS_DIR"
redis_run() { # durability: on = appendfsync always, off = no persistence
    local sha
    sha=$(start_redis "$REDIS_DIR" "$1")
    for w in a b c; do
        local args
        case $w in
        a) args=(rl:bench:__rand_int__ 10 10) ;;
        b) args=(rl:hot 1e9 1e9) ;;
        c) args=(rl:abuse 10 10) ;;
        esac
        local rps
        for _ in $(seq "$REPEATS"); do
            rps=$(redis-benchmark -p "$REDIS_PORT" -c "$CLIENTS" --threads 2 -n "$REDIS_REQUESTS" -r 100000 --csv \
                EVALSHA "$sha" 1 "${args[@]}" | tail -1 | cut -d, -f2 | tr -d '"')
            record tps "$1" "$w" redis "$rps"
            printf 'redis durability=%s workload %s %10.0f calls/s\n' "$1" "$w" "$rps"
        done
    done
    redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
}
redis_run on
redis_run off
rm -rf "$REDIS_DIR"

step "in-process cost: 1,000,000 calls in one statement, no network"
sql -c "SELECT rate_limiter.define('inproc', 'token bucket', 10, '1 second', 10)"
for pass in insert update; do
    record inproc rate_limiter "$pass" "$(seconds_in $DB "SELECT count(*) FROM generate_series(1, 1000000) g, LATERAL rate_limiter.rate_limit('inproc', g::text)")"
    record inproc plpgsql "$pass" "$(seconds_in $DB "SELECT count(*) FROM generate_series(1, 1000000) g, LATERAL bench.plpgsql_limit('inproc', g::text, 10, 10)")"
    if [ $pass = insert ]; then
        record storage rate_limiter "$(sql -c "SELECT pg_total_relation_size('rate_limiter.state'), pg_relation_size('rate_limiter.state'), (SELECT count(*) FROM rate_limiter.state)" | tr '|' '\t')"
    fi
done
sql -c "VACUUM rate_limiter.state"
record storage_after_update rate_limiter "$(sql -c "SELECT pg_total_relation_size('rate_limiter.state'), pg_relation_size('rate_limiter.state'), (SELECT count(*) FROM rate_limiter.state)" | tr '|' '\t')"

step "backend memory over 1,000,000 calls in one session"
# Private memory of the backend (RssAnon) and its memory contexts, after each 100,000 calls.
{
    echo "SELECT pg_backend_pid() AS pid \\gset"
    echo "\\setenv BACKEND_PID :pid"
    for i in $(seq 0 10); do
        [ "$i" -gt 0 ] && echo "SELECT count(*) FROM generate_series(1, 100000) g, LATERAL rate_limiter.rate_limit('bench', g::text);"
        echo "SELECT $((i * 100000)) || E'\\t' || sum(total_bytes) FROM pg_backend_memory_contexts;"
        echo "\\! awk '/RssAnon/ {print \$2 * 1024}' /proc/\$BACKEND_PID/status"
    done
} > "$OUT/memory.sql"
sql -f "$OUT/memory.sql" | grep -v '^100000$' | paste - - | while IFS=$'\t' read -r calls contexts rss; do
    record memory "$calls" "$contexts" "$rss"
done

step "writing bench/results.md and bench/chart.png"
"$ROOT/.venv-bench/bin/python" "$BENCH/report.py" "$RAW" "$BENCH" \
    "$(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, PostgreSQL $(psql -X -At -d $DB -c 'SHOW server_version'), redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'), $CLIENTS clients, median of $REPEATS rounds of ${DURATION} s"
echo "done: bench/results.md"
