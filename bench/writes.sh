#!/usr/bin/env bash
# What a write limit costs a write (issue 67, docs/api.md "Limits on a table's writes"):
# pgbench -M prepared, one statement per transaction, synchronous_commit = on, CLIENTS (8)
# clients, DURATION s per run, medians of ROUNDS rounds (workloads taking turns), USERS users
# (100,000) picked at random, side by side in one run, for a durable and a memory limit of a
# million a second (every call granted):
#   explicit_1_<limit>    INSERT of one message FROM rate_limit(...) on the user's key, throws
#                         => true: the explicit call beside the write, in one statement
#   limited_1_<limit>     INSERT of one message into a table under limit_writes(key =>
#                         'user_id'): no call in the statement
#   explicit_100_<limit>  INSERT of 100 messages FROM rate_limit(..., count => 100)
#   limited_100_<limit>   INSERT of 100 messages into the limited table
# Prints a Markdown table with each limited write's requests per second over its explicit
# twin's. About 3 minutes.
source "$(dirname "$0")/../scripts/lib.sh"
DURATION=${DURATION:-6}
ROUNDS=${ROUNDS:-3}
USERS=${USERS:-100000}
CLIENTS=${CLIENTS:-8}
DB=rate_limiter_bench_writes
OUT=$ROOT/bench/out/writes
mkdir -p "$OUT"
: > "$OUT/raw.tsv"

setup 15
build_and_install >/dev/null
restart_cluster
fresh_database $DB
bench_sql() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$DB" "$@"; }
bench_sql <<'SQL'
SELECT rate_limiter.define('w_durable', 'token bucket', 1e6, '1 second');
SELECT rate_limiter.define('w_memory', 'token bucket', 1e6, '1 second', durable => false);
CREATE TABLE messages (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, user_id bigint NOT NULL, body text NOT NULL);
CREATE INDEX ON messages (user_id);
CREATE TABLE limited_durable (LIKE messages INCLUDING ALL);
CREATE TABLE limited_memory (LIKE messages INCLUDING ALL);
SELECT rate_limiter.limit_writes('limited_durable', 'w_durable', key => 'user_id');
SELECT rate_limiter.limit_writes('limited_memory', 'w_memory', key => 'user_id');
SQL
pick="\\set id random(1, $USERS)"
workload() { printf '%s\n%s;\n' "$pick" "$2" > "$OUT/$1.sql"; }
WORKLOADS=()
for d in durable memory; do
    limit="rate_limiter.rate_limit('w_$d', CAST(:id AS text), throws => true)"
    limit100="rate_limiter.rate_limit('w_$d', CAST(:id AS text), 100, throws => true)"
    workload "explicit_1_$d" "INSERT INTO messages (user_id, body) SELECT :id, 'hello' FROM $limit l"
    workload "limited_1_$d" "INSERT INTO limited_$d (user_id, body) VALUES (:id, 'hello')"
    workload "explicit_100_$d" "INSERT INTO messages (user_id, body) SELECT :id, 'hello' FROM $limit100 l, generate_series(1, 100)"
    workload "limited_100_$d" "INSERT INTO limited_$d (user_id, body) SELECT :id, 'hello' FROM generate_series(1, 100)"
    WORKLOADS+=("explicit_1_$d" "limited_1_$d" "explicit_100_$d" "limited_100_$d")
done

for round in $(seq "$ROUNDS"); do
    for w in "${WORKLOADS[@]}"; do
        bench_sql -c "TRUNCATE messages, limited_durable, limited_memory" -c "DELETE FROM rate_limiter.state" -c CHECKPOINT >/dev/null
        result=$(PGOPTIONS="-c synchronous_commit=on" pgbench -n -M prepared -c "$CLIENTS" -j 2 \
            -T "$DURATION" -f "$OUT/$w.sql" "$DB" 2>&1) || { echo "$result" >&2; exit 1; }
        tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$result")
        printf '%s\t%s\n' "$w" "$tps" >> "$OUT/raw.tsv"
        printf 'round %s %-20s %8.0f requests/s\n' "$round" "$w" "$tps"
    done
done
"$DEBIAN_PYTHON" - "$OUT/raw.tsv" "$CLIENTS" <<'PY'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().split("\n") if l]
def median(w):
    return statistics.median(float(r[1]) for r in rows if r[0] == w)
def spread(w):
    v = [float(r[1]) for r in rows if r[0] == w]
    return f"{min(v):,.0f}–{max(v):,.0f}"
print(f"| write, {sys.argv[2]} clients, synchronous_commit = on | explicit rate_limit() beside it | write limit (limit_writes) | limited / explicit |")
print("|---|---:|---:|---:|")
for limit in ("durable", "memory"):
    for rows_ in ("1", "100"):
        e, l = f"explicit_{rows_}_{limit}", f"limited_{rows_}_{limit}"
        print(f"| {rows_} row{'s' if rows_ != '1' else ''}, {limit} limit | {median(e):,.0f} ({spread(e)}) | "
              f"{median(l):,.0f} ({spread(l)}) | {median(l) / median(e):.2f} |")
PY
