#!/usr/bin/env bash
# Memory limits at the scale of a real API's keys (issue 53, docs/memory-limits.md): for N
# = 100,000, 1,000,000 and 10,000,000 keys, a server with rate_limiter.memory_keys = N x 1.2
# (one database holds 7/8 of the table: N x 1.05 of room for its keys) and the snapshots on
# (1 s). Every key takes a token of a fixed window of 1,000 an hour (so
# that it stays counted), one call per transaction, inside the server; then pgbench -M
# prepared calls random keys of the N for DURATION s (8 clients, the call alone, in the
# target list). Reports the shared memory the table takes per key (shared_memory_size
# against a server with memory limits off), calls per second, the WAL per second (the
# snapshot worker's rounds: a memory call writes none) and the keys counted in rows (0:
# every key fit). Prints a Markdown table; about 6 minutes.
source "$(dirname "$0")/../scripts/lib.sh"
DURATION=${DURATION:-8}
KEYS=${KEYS:-"100000 1000000 10000000"}
DB=rate_limiter_bench_scale

setup 15
build_and_install >/dev/null
BASE_SETTINGS=$CLUSTER_SETTINGS
q() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$DB" "$@"; }
mb() { # shared_memory_size in MB
    psql -X -q -At -d postgres -c "SHOW shared_memory_size" | sed 's/MB$//'
}
restart_empty() { # with no memory limit's keys of before (the file of the last clean shutdown)
    stop_cluster 15
    as_root rm -f "$(cluster_dir 15)/pg_stat/rate_limiter_memory.dat"
    restart_cluster
}

CLUSTER_SETTINGS="$BASE_SETTINGS -c rate_limiter.memory_keys=0"
restart_empty
off=$(mb)

printf '%s\nSELECT (rate_limiter.rate_limit(%s, CAST(:id AS text))).ok;\n' '\set id random(1, :keys)' "'m'" > /tmp/rate_limiter_scale.sql
: > /tmp/rate_limiter_scale.sizes
echo "| keys | memory_keys | shared memory for them | bytes per key | calls/s (8 clients) | WAL/s | WAL per call | keys in rows |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
for n in $KEYS; do
    entries=$((n * 6 / 5))
    CLUSTER_SETTINGS="$BASE_SETTINGS -c rate_limiter.memory_keys=$entries"
    restart_empty
    on=$(mb)
    echo "$entries $on" >> /tmp/rate_limiter_scale.sizes
    fresh_database $DB
    q <<SQL >/dev/null
SELECT rate_limiter.define('m', 'fixed window', 1000, '1 hour', durable => false);
CREATE PROCEDURE fill(n int) LANGUAGE plpgsql AS \$\$
BEGIN
    FOR g IN 1..n LOOP
        PERFORM rate_limiter.rate_limit('m', g::text);
        COMMIT;
    END LOOP;
END \$\$;
CALL fill($n);
SQL
    sleep 3 # the rounds that write the filled keys
    before=$(q -c "SELECT pg_current_wal_lsn()")
    result=$(pgbench -n -M prepared -c 8 -j 2 -T "$DURATION" -D keys="$n" -f /tmp/rate_limiter_scale.sql "$DB" 2>&1) \
        || { echo "$result" >&2; exit 1; }
    wal=$(q -c "SELECT pg_current_wal_lsn() - '$before'::pg_lsn")
    tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$result")
    rows=$(q -c "SELECT count(*) FROM rate_limiter.state")
    "$DEBIAN_PYTHON" - "$n" "$entries" "$on" "$off" "$tps" "$wal" "$DURATION" "$rows" <<'PY'
import sys
n, entries, on, off, tps, wal, duration, rows = sys.argv[1:]
n, entries, tps, wal, duration = int(n), int(entries), float(tps), int(wal), float(duration)
table = (float(on) - float(off)) * 1024 * 1024
print(f"| {n:,} | {entries:,} | {table / 1024 / 1024:,.0f} MB | {table / entries:.0f} | {tps:,.0f} | "
      f"{wal / duration / 1024 / 1024:.1f} MB | {wal / duration / tps:.0f} B | {int(rows):,} |")
PY
done
# What one more entry costs, without the pool of escrows in flight (a share per backend,
# whatever the table's size): the slope between the smallest and the largest table.
"$DEBIAN_PYTHON" - /tmp/rate_limiter_scale.sizes <<'PY'
import sys
sizes = [tuple(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
(e0, m0), (e1, m1) = sizes[0], sizes[-1]
if e1 > e0:
    print(f"\nShared memory per entry beyond the pool: {(m1 - m0) * 1024 * 1024 / (e1 - e0):.1f} bytes "
          f"(shared_memory_size from {e0:,.0f} to {e1:,.0f} entries).")
PY
CLUSTER_SETTINGS=$BASE_SETTINGS
restart_cluster
