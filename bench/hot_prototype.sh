#!/usr/bin/env bash
# The first question of docs/hot-limits.md, measured before anything is built: does a
# transaction that inserts a row of its own commit as fast as transactions on many keys
# (group commit sharing WAL flushes), where transactions updating one row queue for it?
# CLIENTS clients, synchronous_commit = on, DURATION s, medians of ROUNDS rounds taking turns:
#   one_row        UPDATE of one row (what an exact limit on one key does)
#   rate_limit     rate_limiter.rate_limit on one key, shards = 1
#   insert         INSERT of one row into a table without index (a debit of its own)
#   insert_seq     the same with a bigserial key and its btree (a right-growing index)
# Prints a Markdown table. About 3 minutes.
source "$(dirname "$0")/../scripts/lib.sh"
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-3}
CLIENTS=${CLIENTS:-8}
DB=rate_limiter_bench_hot
OUT=$ROOT/bench/out/hot
mkdir -p "$OUT"
: > "$OUT/raw.tsv"
source "$ROOT/bench/measure.sh"

setup 15
build_and_install >/dev/null
restart_cluster
fresh_database $DB
psql -X -q -v ON_ERROR_STOP=1 -d $DB <<'SQL'
CREATE TABLE one_row (id int PRIMARY KEY, v bigint);
INSERT INTO one_row VALUES (1, 0);
CREATE TABLE debits (name text, key text, amount float8, at timestamptz DEFAULT now());
CREATE TABLE debits_seq (seq bigserial PRIMARY KEY, name text, key text, amount float8, at timestamptz DEFAULT now());
SELECT rate_limiter.define('hot', 'token bucket', 1e12, '1 second', 1e12);
SQL
printf 'UPDATE one_row SET v = v + 1 WHERE id = 1;\n' > "$OUT/one_row.sql"
printf "SELECT * FROM rate_limiter.rate_limit('hot', 'k');\n" > "$OUT/rate_limit.sql"
printf "INSERT INTO debits (name, key, amount) VALUES ('hot', 'k', 1);\n" > "$OUT/insert.sql"
printf "INSERT INTO debits_seq (name, key, amount) VALUES ('hot', 'k', 1);\n" > "$OUT/insert_seq.sql"
for round in $(seq "$ROUNDS"); do
    for w in one_row rate_limit insert insert_seq; do
        psql -X -q -d $DB -c CHECKPOINT
        tps=$(pgbench_tps "$OUT/$w.sql" on)
        printf '%s\t%s\n' "$w" "$tps" >> "$OUT/raw.tsv"
        printf 'round %s %-11s %8.0f transactions/s\n' "$round" "$w" "$tps"
    done
done
python3 - "$OUT/raw.tsv" <<'PY'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().split("\n") if l]
print("| one transaction per call, 8 clients | transactions/s (median, range) |")
print("|---|---:|")
for w in ("one_row", "rate_limit", "insert", "insert_seq"):
    v = [float(t) for k, t in rows if k == w]
    print(f"| {w} | {statistics.median(v):,.0f} ({min(v):,.0f}–{max(v):,.0f}) |")
PY
