#!/usr/bin/env bash
# What memory limits' snapshots cost (issues 42 and 53, docs/memory-limits.md "Restarts and
# crashes"): N keys of a memory limit each take a token, then the background worker's next
# round appends their records to rate_limiter.memory_snapshot, packed into rows. For N =
# 1,000, 10,000 and 100,000 changed keys, ROUNDS rounds each (the first of new keys, the
# others of the same keys changed, as a steady load does): the WAL bytes of the round
# (pg_current_wal_lsn before and after, nothing else running; one checkpoint before the
# first round, so that the first round brings the full page images a checkpoint costs)
# and how long after the calls the round's records were all there. At the default interval
# of 1 s, a round's bytes are the WAL per second of N keys changed each second. Then the
# case that pays for the full copies most: 100,000 keys of which 10,000 change each round,
# for COPY_ROUNDS rounds at an interval of 200 ms (a full copy of all 100,000 every 31
# rounds): the WAL of them all per changed key. Prints two Markdown tables; about a minute.
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

keys_after() { # records written after the instant $1
    q -c "SELECT COALESCE(sum(keys), 0) FROM rate_limiter.memory_snapshot WHERE kind IN ('full', 'changed') AND saved_at > to_timestamp($1)"
}
echo "| changed keys | round | WAL bytes | bytes per key | records written after the calls |"
echo "|---:|---:|---:|---:|---:|"
for n in 1000 10000 100000; do
    q -c "SELECT rate_limiter.define('snap_$n', 'token bucket', 1000, '1 hour', durable => false)" >/dev/null
    q -c CHECKPOINT
    for round in $(seq "$ROUNDS"); do
        sleep 1.2  # a round with nothing to write in between
        before=$(q -c "SELECT pg_current_wal_lsn()")
        q -c "SELECT count(*) FROM generate_series(1, $n) g, rate_limiter.rate_limit('snap_$n', g::text) r WHERE r.ok" >/dev/null
        called=$(date +%s.%N)
        until [ "$(keys_after "$called")" -ge "$n" ]; do
            sleep 0.05
        done
        landed=$(date +%s.%N)
        bytes=$(q -c "SELECT pg_current_wal_lsn() - '$before'::pg_lsn")
        printf '| %s | %s | %s | %s | %.2f s |\n' "$n" "$round" "$bytes" "$((bytes / n))" "$("$DEBIAN_PYTHON" -c "print($landed - $called)")"
    done
done

# The full copies' share: 100,000 keys, 10,000 of them changed a round.
COPY_ROUNDS=${COPY_ROUNDS:-40}
CLUSTER_SETTINGS+=" -c rate_limiter.memory_snapshot=200"
restart_cluster
fresh_database $DB
q -c "SELECT rate_limiter.define('copied', 'fixed window', 1000000, '1 day', durable => false)" >/dev/null
q -c "SELECT count(*) FROM generate_series(1, 100000) g, rate_limiter.rate_limit('copied', g::text) r WHERE r.ok" >/dev/null
sleep 1
q -c CHECKPOINT
before=$(q -c "SELECT pg_current_wal_lsn()")
for round in $(seq 0 $((COPY_ROUNDS - 1))); do
    from=$((round % 10 * 10000 + 1))
    q -c "SELECT count(*) FROM generate_series($from, $((from + 9999))) g, rate_limiter.rate_limit('copied', g::text) r WHERE r.ok" >/dev/null
    called=$(date +%s.%N)
    until [ "$(keys_after "$called")" -ge 10000 ]; do
        sleep 0.02
    done
done
bytes=$(q -c "SELECT pg_current_wal_lsn() - '$before'::pg_lsn")
copies=$(q -c "SELECT count(DISTINCT date_trunc('second', saved_at)) FROM rate_limiter.memory_snapshot WHERE kind = 'full'")
rows=$(q -c "SELECT count(*) || ' rows, ' || sum(keys) || ' records' FROM rate_limiter.memory_snapshot")
echo
echo "| live keys | changed a round | rounds | WAL bytes | bytes per changed key | log left |"
echo "|---:|---:|---:|---:|---:|---:|"
printf '| 100000 | 10000 | %s | %s | %s | %s (last full copy %s) |\n' "$COPY_ROUNDS" "$bytes" "$((bytes / (COPY_ROUNDS * 10000)))" "$rows" \
    "$( [ "$copies" -gt 0 ] && echo "in the log" || echo "none yet")"
