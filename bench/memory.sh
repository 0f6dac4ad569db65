#!/usr/bin/env bash
# What a limit costs a request (issue 42, docs/memory-limits.md): pgbench -M prepared, one
# statement per transaction, synchronous_commit = on, 8 and 32 clients, DURATION s per run,
# medians of ROUNDS rounds (workloads taking turns), USERS users (100,000) picked at random:
#   read          SELECT of the user's row by primary key, no limit
#   read_durable  the same SELECT joined with rate_limit on the user's key, a durable
#                 token bucket of 10 a second (a row write, WAL and a flush at commit)
#   read_memory   the same with the same limit, durable => false
#   read_memory_tl the same read with the memory limit in its target list and WHERE clause
#                 rather than in FROM (a function scan of its own)
#   write         INSERT of one message for the user (a primary key and an index), no limit
#   write_durable the INSERT after rate_limit on the user's key, in one statement
#   write_memory  the same with the memory limit
# Every call is granted (10 a second per user, and each user is called every few seconds);
# after each memory run the script checks that no state row was written. Prints a Markdown
# table, then runs bench/memory_scale.sh. About 8 minutes. The default rate_limiter.memory_keys
# holds every user.
source "$(dirname "$0")/../scripts/lib.sh"
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-3}
USERS=${USERS:-100000}
DB=rate_limiter_bench_memory
OUT=$ROOT/bench/out/memory
mkdir -p "$OUT"
: > "$OUT/raw.tsv"

setup 15
build_and_install >/dev/null
stop_cluster 15
as_root rm -f "$(cluster_dir 15)/pg_stat/rate_limiter_memory.dat" # no memory limit's keys of before
restart_cluster
fresh_database $DB
bench_sql() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$DB" "$@"; }
bench_sql -v users="$USERS" <<'SQL'
SELECT rate_limiter.define('api_durable', 'token bucket', 10, '1 second');
SELECT rate_limiter.define('api_memory', 'token bucket', 10, '1 second', durable => false);
CREATE TABLE users (id bigint PRIMARY KEY, name text NOT NULL, plan text NOT NULL);
INSERT INTO users SELECT g, 'user ' || g, 'free' FROM generate_series(1, :users) g;
CREATE TABLE messages (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, user_id bigint NOT NULL, body text NOT NULL);
CREATE INDEX ON messages (user_id);
VACUUM ANALYZE;
SQL
pick="\\set id random(1, $USERS)"
printf '%s\nSELECT id, name, plan FROM users WHERE id = :id;\n' "$pick" > "$OUT/read.sql"
for d in durable memory; do
    printf '%s\nSELECT u.id, u.name, u.plan FROM rate_limiter.rate_limit(%s, CAST(:id AS text)) l, users u WHERE l.ok AND u.id = :id;\n' \
        "$pick" "'api_$d'" > "$OUT/read_$d.sql"
    printf '%s\nINSERT INTO messages (user_id, body) SELECT :id, %s FROM rate_limiter.rate_limit(%s, CAST(:id AS text)) l WHERE l.ok;\n' \
        "$pick" "'hello'" "'api_$d'" > "$OUT/write_$d.sql"
done
printf "%s\nINSERT INTO messages (user_id, body) VALUES (:id, 'hello');\n" "$pick" > "$OUT/write.sql"
printf '%s\nSELECT u.id, u.name, u.plan FROM users u WHERE u.id = :id AND (rate_limiter.rate_limit(%s, CAST(:id AS text))).ok;\n' \
    "$pick" "'api_memory'" > "$OUT/read_memory_tl.sql"

for round in $(seq "$ROUNDS"); do
    for CLIENTS in 8 32; do
        for w in read read_durable read_memory read_memory_tl write write_durable write_memory; do
            bench_sql -c "TRUNCATE messages" -c "DELETE FROM rate_limiter.state" -c CHECKPOINT >/dev/null
            result=$(PGOPTIONS="-c synchronous_commit=on" pgbench -n -M prepared -c "$CLIENTS" -j 2 \
                -T "$DURATION" -f "$OUT/$w.sql" "$DB" 2>&1) || { echo "$result" >&2; exit 1; }
            tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$result")
            if [[ $w == *_memory ]] && [ "$(bench_sql -c "SELECT count(*) FROM rate_limiter.state")" != 0 ]; then
                echo "$w wrote state rows" >&2
                exit 1
            fi
            printf '%s\t%s\t%s\n' "$CLIENTS" "$w" "$tps" >> "$OUT/raw.tsv"
            printf 'round %s clients %2s %-14s %8.0f requests/s\n' "$round" "$CLIENTS" "$w" "$tps"
        done
    done
done
"$DEBIAN_PYTHON" - "$OUT/raw.tsv" <<'PY'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().split("\n") if l]
def values(w, c):
    return [float(t) for n, k, t in rows if k == w and n == c]
print("| request, synchronous_commit = on | 8 clients | / no limit | 32 clients | / no limit |")
print("|---|---:|---:|---:|---:|")
for w in ("read", "read_durable", "read_memory", "read_memory_tl", "write", "write_durable", "write_memory"):
    base = w.split("_")[0]
    cells = []
    for c in ("8", "32"):
        v = values(w, c)
        ratio = statistics.median(v) / statistics.median(values(base, c))
        cells.append(f"{statistics.median(v):,.0f} ({min(v):,.0f}–{max(v):,.0f}) | {ratio:.2f}")
    print(f"| {w} | " + " | ".join(cells) + " |")
PY
# Then the table at 100,000, 1,000,000 and 10,000,000 keys: bytes per key, calls per second
# and the snapshot's WAL per second (issue 53); SCALE=0 leaves it out.
if [ "${SCALE:-1}" = 1 ]; then
    echo
    bash "$ROOT/bench/memory_scale.sh"
fi
