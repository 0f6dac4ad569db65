#!/usr/bin/env bash
# The questions docs/hot-limits.md asks before the hot mode is wired to SQL, measured side
# by side in one run: does a transaction that writes a debit row of its own commit as fast
# as Redis with appendfsync always, where transactions on one row queue for it?
# synchronous_commit = on, 8 and 32 clients, DURATION s per run, medians of ROUNDS rounds
# (workloads taking turns, one server at a time), one key throughout:
#   shards_1      rate_limiter.rate_limit on one key, shards = 1 (exact, queues on its row)
#   shards_16     the same limit with shards = 16 (not exact: see the README's Sharding)
#   debit_row     INSERT of a debit row with a bigserial primary key: the hot mode's write
#   call_and_debit  rate_limit on a random key (no queue) and that debit row, in one
#                 statement: a call's decision and the hot mode's write, before its lock
#                 and transaction callbacks; an upper bound for the hot mode
#   redis         Redis 7, the same token bucket in Lua (EVALSHA), appendonly with
#                 appendfsync always, one key
# Prints a Markdown table. About 6 minutes.
source "$(dirname "$0")/../scripts/lib.sh"
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-3}
REDIS_PORT=${REDIS_PORT:-6390}
DB=rate_limiter_bench_hot
OUT=$ROOT/bench/out/hot
mkdir -p "$OUT"
: > "$OUT/raw.tsv"
source "$ROOT/bench/measure.sh"

setup 15
install_debian_packages redis-server redis-tools
build_and_install >/dev/null
restart_cluster
fresh_database $DB
psql -X -q -v ON_ERROR_STOP=1 -d $DB <<'SQL'
CREATE TABLE debits (seq bigserial PRIMARY KEY, name text, key text, at float8, count float8);
SELECT rate_limiter.define('hot_1', 'token bucket', 1e12, '1 second', 1e12);
SELECT rate_limiter.define('hot_16', 'token bucket', 1e12, '1 second', 1e12, shards => 16);
SELECT rate_limiter.define('many', 'token bucket', 1e12, '1 second', 1e12);
SQL
printf "SELECT * FROM rate_limiter.rate_limit('hot_1', 'k');\n" > "$OUT/shards_1.sql"
printf "SELECT * FROM rate_limiter.rate_limit('hot_16', 'k');\n" > "$OUT/shards_16.sql"
printf "INSERT INTO debits (name, key, at, count) VALUES ('hot', 'k', 0, 1);\n" > "$OUT/debit_row.sql"
# One statement, one round trip, as a hot call would be.
cat > "$OUT/call_and_debit.sql" <<'SQL'
\set k random(1, 1000000)
WITH debit AS (INSERT INTO debits (name, key, at, count) VALUES ('hot', 'k', 0, 1) RETURNING seq)
SELECT d.* FROM rate_limiter.rate_limit('many', CAST(:k AS text)) d, debit;
SQL

REDIS_DIR=$(mktemp -d)
chmod 777 "$REDIS_DIR"
trap 'redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$REDIS_DIR"' EXIT
SHA=$(start_redis "$REDIS_DIR" on)

for round in $(seq "$ROUNDS"); do
    for CLIENTS in 8 32; do
        for w in shards_1 shards_16 debit_row call_and_debit redis; do
            if [ $w = redis ]; then
                # As many calls as Redis makes in about DURATION seconds.
                tps=$(redis-benchmark -p "$REDIS_PORT" -c "$CLIENTS" --threads 2 -n $((15000 * DURATION)) --csv \
                    EVALSHA "$SHA" 1 rl:hot 1e12 1e12 | tail -1 | cut -d, -f2 | tr -d '"')
            else
                psql -X -q -d $DB -c CHECKPOINT
                tps=$(pgbench_tps "$OUT/$w.sql" on)
            fi
            printf '%s\t%s\t%s\n' "$CLIENTS" "$w" "$tps" >> "$OUT/raw.tsv"
            printf 'round %s clients %2s %-15s %8.0f calls/s\n' "$round" "$CLIENTS" "$w" "$tps"
        done
    done
done
python3 - "$OUT/raw.tsv" <<'PY'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().split("\n") if l]
print("| one key, synchronous_commit = on | 8 clients | 32 clients |")
print("|---|---:|---:|")
for w in ("shards_1", "shards_16", "debit_row", "call_and_debit", "redis"):
    cells = []
    for c in ("8", "32"):
        v = [float(t) for n, k, t in rows if k == w and n == c]
        cells.append(f"{statistics.median(v):,.0f} ({min(v):,.0f}–{max(v):,.0f})")
    print(f"| {w} | " + " | ".join(cells) + " |")
PY
