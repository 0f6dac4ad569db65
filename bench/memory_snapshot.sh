#!/usr/bin/env bash
# What memory limits' snapshots cost (issue 42, docs/memory-limits.md "Restarts and
# crashes"): N keys of a memory limit each take a token, then the background worker's next
# round writes their rows to rate_limiter.memory_snapshot. For N = 1,000, 10,000 and
# 100,000 changed keys, ROUNDS rounds each (the first inserts the rows, the others update
# them, as a steady load does): the WAL bytes of the round (pg_current_wal_lsn before and
# after, nothing else running; one checkpoint before the first round, so that the first
# round's rows bring the full page images a checkpoint costs) and how long after the calls
# the round's rows were all there. At the default interval of 1 s, a round's bytes are the WAL per second of N keys
# changed each second. Prints a Markdown table; about a minute.
source "$(dirname "$0")/../scripts/lib.sh"
ROUNDS=${ROUNDS:-4}
DB=rate_limiter_bench_snapshot
OUT=$ROOT/bench/out/memory_snapshot
mkdir -p "$OUT"

setup 15
build_and_install >/dev/null
CLUSTER_SETTINGS+=" -c rate_limiter.memory_keys=300000 -c rate_limiter.memory_keys_per_database=300000"
restart_cluster
fresh_database $DB
q() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$DB" "$@"; }

echo "| changed keys | round | WAL bytes | bytes per key | rows written after the calls |"
echo "|---:|---:|---:|---:|---:|"
for n in 1000 10000 100000; do
    q -c "SELECT rate_limiter.define('snap_$n', 'token bucket', 1000, '1 hour', durable => false)" >/dev/null
    q -c CHECKPOINT
    for round in $(seq "$ROUNDS"); do
        sleep 1.2  # a round with nothing to write in between
        before=$(q -c "SELECT pg_current_wal_lsn()")
        q -c "SELECT count(*) FROM generate_series(1, $n) g, rate_limiter.rate_limit('snap_$n', g::text) r WHERE r.ok" >/dev/null
        called=$(date +%s.%N)
        # Every key's row written after the calls.
        until [ "$(q -c "SELECT count(*) FROM rate_limiter.memory_snapshot WHERE saved_at > to_timestamp($called)")" -ge "$n" ]; do
            sleep 0.05
        done
        landed=$(date +%s.%N)
        bytes=$(q -c "SELECT pg_current_wal_lsn() - '$before'::pg_lsn")
        printf '| %s | %s | %s | %s | %.2f s |\n' "$n" "$round" "$bytes" "$((bytes / n))" "$("$DEBIAN_PYTHON" -c "print($landed - $called)")"
    done
done
