#!/usr/bin/env bash
# What a limit adds to the application's own transaction, a read (the user's row by primary
# key) and a write (insert a message), against Redis beside Postgres: bench/app/src/main.rs
# runs each variant as a closed loop of 8 and 32 connections, synchronous_commit = on,
# APP_DURATION s after 1 s of warm-up, variants taking turns, APP_ROUNDS rounds, and checks
# a ledger after every run (tokens used = requests that committed = messages committed, for
# the write). Variants: no limit; rate_limiter.rate_limit inside the transaction on 100,000
# users' keys, durable and as a memory limit (durable => false); for the write also on one
# hot key and on one key of 16 shards; Redis 7's token bucket in Lua (bench/redis_bucket.lua)
# before the transaction, appendfsync always and everysec. Each as statements (BEGIN, limit,
# the work, COMMIT: a round trip each) and as one round trip (one statement in autocommit;
# for Redis, EVALSHA then the work). Redis
# rewrites no AOF during the runs, as PostgreSQL checkpoints only between them. Writes
# bench/app.md and bench/app.png. About 30 minutes with the default 3 rounds.
source "$(dirname "$0")/../../scripts/lib.sh"
source "$ROOT/bench/measure.sh"
export APP_DURATION=${APP_DURATION:-8} APP_ROUNDS=${APP_ROUNDS:-3}
DB=rate_limiter_bench_app
OUT=$ROOT/bench/out/app
REDIS_ALWAYS=6391 REDIS_EVERYSEC=6392

setup 15
install_debian_packages redis-server redis-tools
install_bench_python
build_and_install >/dev/null
# Room for every user's key of the memory limit, which never refills during a run.
CLUSTER_SETTINGS+=" -c rate_limiter.memory_keys=400000 -c rate_limiter.memory_keys_per_database=400000"
restart_cluster
fresh_database $DB
psql -X -q -v ON_ERROR_STOP=1 -d $DB -f "$ROOT/bench/app/schema.sql" >/dev/null

step "building the load generator"
cargo build --release --locked --quiet --manifest-path "$ROOT/bench/app/Cargo.toml"

step "starting Redis on 127.0.0.1:$REDIS_ALWAYS (appendfsync always) and :$REDIS_EVERYSEC (everysec)"
REDIS_DIR=$(mktemp -d)
chmod 777 "$REDIS_DIR"
stop_redis() {
    redis-cli -p $REDIS_ALWAYS shutdown nosave >/dev/null 2>&1 || true
    redis-cli -p $REDIS_EVERYSEC shutdown nosave >/dev/null 2>&1 || true
    rm -rf "$REDIS_DIR"
}
trap stop_redis EXIT
for port in $REDIS_ALWAYS $REDIS_EVERYSEC; do
    durability=on
    [ $port = $REDIS_EVERYSEC ] && durability=everysec
    mkdir -p "$REDIS_DIR/$port"
    APP_REDIS_SHA=$(start_redis "$REDIS_DIR/$port" $durability $port --auto-aof-rewrite-percentage 0)
    # Every user's bucket already there, full, as the Postgres rows are (schema.sql).
    redis-cli -p $port EVAL "local t = redis.call('TIME')[1]
        for i = 1, tonumber(ARGV[1]) do redis.call('HSET', 'app:' .. i, 'v', ARGV[2], 'ts', t) end" \
        0 "${APP_USERS:-100000}" 1e12 >/dev/null
done
export APP_REDIS_SHA
export APP_POSTGRES="host=$PGHOST port=$PGPORT user=$PGUSER dbname=$DB"
export APP_REDIS_ALWAYS=redis://127.0.0.1:$REDIS_ALWAYS/ APP_REDIS_EVERYSEC=redis://127.0.0.1:$REDIS_EVERYSEC/
export APP_OUT=$OUT

step "running: 12 variants x 2 forms x 2 connection counts x $APP_ROUNDS rounds of ${APP_DURATION} s"
"$ROOT/bench/app/target/release/rate_limiter_app_bench"

step "writing bench/app.md and bench/app.png"
"$ROOT/.venv-bench/bin/python" "$ROOT/bench/app/report.py" "$OUT" "$ROOT/bench" \
    "$(nproc) cores, PostgreSQL $(psql -X -At -d $DB -c 'SHOW server_version'), Redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'), synchronous_commit = on, medians of $APP_ROUNDS rounds of ${APP_DURATION} s"
echo "done: bench/app.md"
