# What bench/compare.sh and bench/versions.sh measure, sourced by both: bench/run.sh's workload
# (a) (CLIENTS clients over 100,000 keys of a 10/s token bucket, synchronous_commit on and
# off, DURATION seconds each) and the in-process cost (1,000,000 calls in one statement,
# creating rows, then updating them), on database $DB of the cluster at PGPORT. Also the
# Redis that bench/run.sh and bench/hot.sh compare with.

# A fresh database $DB with the extension, the benchmark's helpers and 100,000 seeded keys.
prepare_bench_database() {
    psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB"
    bench_sql -c "CREATE EXTENSION rate_limiter"
    bench_sql -f "$ROOT/bench/competitors.sql"
    bench_sql -c "SELECT rate_limiter.define('bench', 'token bucket', 10, '1 second', 10)" \
        -c "SELECT bench.seed('bench', 100000, 10)" -c "VACUUM ANALYZE"
}

bench_sql() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$DB" "$@"; }

# Transactions per second of pgbench running script $1 with synchronous_commit $2 on $DB
# (CLIENTS clients, DURATION s); on failure pgbench's output, and a failing status that
# stops a caller assigning the result under set -e.
pgbench_tps() {
    local result
    if ! result=$(PGOPTIONS="-c synchronous_commit=$2" pgbench -n -M prepared -c "$CLIENTS" -j 2 \
        -T "$DURATION" -f "$1" "$DB" 2>&1); then
        echo "$result" >&2
        exit 1
    fi
    sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$result"
}

# Appends "label<TAB>metric<TAB>value" lines to $1 for label $2; $3 names this round's
# in-process limit.
measure_a_and_in_process() {
    local raw=$1 label=$2 round=$3 commit pass s tps
    printf '\\set k random(1, 100000)\nSELECT * FROM rate_limiter.rate_limit('"'bench'"', CAST(:k AS text));\n' > "$raw.a.sql"
    for commit in on off; do
        tps=$(pgbench_tps "$raw.a.sql" "$commit")  # a failed run stops the script here (set -e)
        printf '%s\ta_%s\t%s\n' "$label" "$commit" "$tps" >> "$raw"
    done
    bench_sql -c "SELECT rate_limiter.define('inproc_$round', 'token bucket', 10, '1 second', 10)"
    for pass in insert update; do
        s=$(seconds_in "$DB" "SELECT count(*) FROM generate_series(1, 1000000) g, LATERAL rate_limiter.rate_limit('inproc_$round', g::text)")
        printf '%s\tinproc_%s_us\t%s\n' "$label" "$pass" "$s" >> "$raw"
    done
}

# Starts Redis on loopback port $3 (REDIS_PORT by default) with its files in directory $1:
# durable (appendonly, appendfsync always) when $2 is on, appendonly with appendfsync
# everysec when it is everysec, else without persistence; the arguments after $3 go to
# redis-server as they are. Prints the SHA of bench/redis_bucket.lua, loaded for EVALSHA.
# Stop it with redis-cli shutdown.
start_redis() {
    local dir=$1 durability=$2 port=${3:-$REDIS_PORT} persist=(--save '' --appendonly no)
    shift $(($# < 3 ? $# : 3))
    case $durability in
    on) persist=(--save '' --appendonly yes --appendfsync always) ;;
    everysec) persist=(--save '' --appendonly yes --appendfsync everysec) ;;
    esac
    redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --daemonize yes "${persist[@]}" "$@" >/dev/null
    for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
    redis-cli -p "$port" SCRIPT LOAD "$(cat "$ROOT/bench/redis_bucket.lua")"
}
