#!/usr/bin/env bash
# One hot key, side by side in one run (docs/hot-limits.md): synchronous_commit = on, 8 and
# 32 clients, DURATION s per run, medians of ROUNDS rounds (workloads taking turns, one
# server at a time), every call granted:
#   shards_1   rate_limiter.rate_limit on one key, shards = 1 (exact, queues on its row)
#   shards_16  the same limit with shards = 16 (not exact: see the README's Sharding)
#   hot        the same limit with hot => true (exact, no queue)
#   redis      Redis 7, the same token bucket in Lua (EVALSHA), appendonly with appendfsync
#              always, one key
#   insert     no limit: a bare one-row INSERT with a primary key, the floor of any design
#              that commits a row per call (issue 34's bar: hot at 0.95x of it)
#   log_sql    no limit: the rows a hot call writes, by SQL: a row shaped as a debit into a
#              table with the log's two indexes, and every 1,000th call deletes the 1,000
#              before it, as the fold does
# After every PostgreSQL run the ledger is checked: the tokens the limit counts as used (its
# state rows, and for hot its debit log) equal the transactions pgbench committed; the
# script stops if they differ. Prints a Markdown table. About 5 minutes.
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
# One token per ten years and more than any run takes: every call is granted, and the tokens
# used are the calls counted (to a billionth of a token). The clock is the real one, as in
# production (rate_limiter.fake_now would parse its text at every call).
psql -X -q -v ON_ERROR_STOP=1 -d $DB <<SQL
SELECT rate_limiter.define('shards_1', 'token bucket', 1, '3650 days', 1e12);
SELECT rate_limiter.define('shards_16', 'token bucket', 1, '3650 days', 1e12, shards => 16);
SELECT rate_limiter.define('hot', 'token bucket', 1, '3650 days', 1e12, hot => true);
CREATE TABLE floor_insert (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, count float8 NOT NULL);
CREATE TABLE floor_log (LIKE rate_limiter.debits INCLUDING ALL);
CREATE SEQUENCE floor_log_seq;
SQL
for w in shards_1 shards_16 hot; do
    printf "SELECT * FROM rate_limiter.rate_limit('%s', 'k');\n" $w > "$OUT/$w.sql"
done
echo "INSERT INTO floor_insert (count) VALUES (1);" > "$OUT/insert.sql"
cat > "$OUT/log_sql.sql" <<'PGBENCH'
INSERT INTO floor_log VALUES (nextval('floor_log_seq'), 'log_sql', 'k', now(), 1) RETURNING seq \gset
\if :seq % 1000 = 0
DELETE FROM floor_log WHERE seq <= :seq - 1000;
\endif
PGBENCH

# Tokens limit $1 counts as used on key k: its state rows' (per shard) and its debit log's.
used() {
    bench_sql -c "SELECT coalesce((SELECT sum(l.capacity / l.shards - s.value) FROM rate_limiter.state s
                                   JOIN rate_limiter.limits l USING (name) WHERE name = '$1'), 0)
                       + coalesce((SELECT sum(count) FROM rate_limiter.debits WHERE name = '$1'), 0)"
}

REDIS_DIR=$(mktemp -d)
chmod 777 "$REDIS_DIR"
trap 'redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$REDIS_DIR"' EXIT
SHA=$(start_redis "$REDIS_DIR" on)

for round in $(seq "$ROUNDS"); do
    for CLIENTS in 8 32; do
        for w in insert shards_1 shards_16 hot log_sql redis; do
            if [ $w = redis ]; then
                # As many calls as Redis makes in about DURATION seconds.
                tps=$(redis-benchmark -p "$REDIS_PORT" -c "$CLIENTS" --threads 2 -n $((15000 * DURATION)) --csv \
                    EVALSHA "$SHA" 1 rl:hot 3.168808781402895e-9 1e12 | tail -1 | cut -d, -f2 | tr -d '"')
                ledger="-"
            else
                log_seq_before=$(bench_sql -c "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM floor_log_seq")
                case $w in
                insert | log_sql) bench_sql -c CHECKPOINT >/dev/null ;;
                *) bench_sql -c "SELECT rate_limiter.reset_rate_limit('$w', 'k')" -c CHECKPOINT >/dev/null ;;
                esac
                result=$(PGOPTIONS="-c synchronous_commit=on" pgbench -n -M prepared -c "$CLIENTS" -j 2 \
                    -T "$DURATION" -f "$OUT/$w.sql" "$DB" 2>&1) || { echo "$result" >&2; exit 1; }
                tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$result")
                committed=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$result")
                counted=$(used $w)
                [ $w = insert ] && counted=$(bench_sql -c "SELECT count(*) FROM floor_insert" -c "TRUNCATE floor_insert" | head -1)
                if [ $w = log_sql ]; then  # rows numbered by its sequence, some deleted since
                    counted=$(($(bench_sql -c "SELECT last_value FROM floor_log_seq") - log_seq_before))
                fi
                if [ "$("$DEBIAN_PYTHON" -c "print(round(float('$counted')) == int('$committed'))")" != True ]; then
                    echo "ledger: $w counts $counted tokens used, pgbench committed $committed calls" >&2
                    exit 1
                fi
                ledger="$committed = $counted"
            fi
            printf '%s\t%s\t%s\n' "$CLIENTS" "$w" "$tps" >> "$OUT/raw.tsv"
            printf 'round %s clients %2s %-10s %8.0f calls/s  ledger %s\n' "$round" "$CLIENTS" "$w" "$tps" "$ledger"
        done
    done
done
"$DEBIAN_PYTHON" - "$OUT/raw.tsv" <<'PY'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().split("\n") if l]
print("| one key, synchronous_commit = on | 8 clients | / insert | 32 clients | / insert |")
print("|---|---:|---:|---:|---:|")
def median(w, c):
    return statistics.median(float(t) for n, k, t in rows if k == w and n == c)
for w in ("insert", "log_sql", "shards_1", "shards_16", "hot", "redis"):
    cells = []
    for c in ("8", "32"):
        v = [float(t) for n, k, t in rows if k == w and n == c]
        cells.append(f"{statistics.median(v):,.0f} ({min(v):,.0f}–{max(v):,.0f}) | {median(w, c) / median('insert', c):.2f}")
    print(f"| {w} | " + " | ".join(cells) + " |")
PY
