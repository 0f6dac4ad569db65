#!/usr/bin/env bash
# What a limit costs a request (issues 42 and 66, docs/memory-limits.md): pgbench -M prepared,
# one statement per transaction, synchronous_commit = on, 8 and 32 clients, DURATION s per
# run, medians of ROUNDS rounds (workloads taking turns), USERS users (100,000) picked at
# random, side by side in one run:
#   noop               SELECT CAST(:id AS text): a transaction that does nothing
#   memory_alone       SELECT ok FROM rate_limit(...): the memory limit alone, in FROM
#   memory_alone_tl    SELECT (rate_limit(...)).ok: the same in the target list
#   memory_ok          SELECT rate_limit_ok(...): the limit's ok alone, no decision row
#   read               SELECT of the user's row by primary key, no limit
#   read_c_function    the read joined with a trivial C function in FROM (int8abs): what
#                      PostgreSQL's function scan costs any function
#   read_memory_from   the read joined with rate_limit on the user's key in FROM, a memory
#                      token bucket of 10 a second (durable => false)
#   read_memory_where  the same limit in the read's WHERE clause
#   read_memory_tl     the same limit in the read's target list
#   read_memory_ok     the read with rate_limit_ok(...) in its WHERE clause
#   read_durable       read_memory_from with a durable limit (a row write, WAL and a flush)
#   write              INSERT of one message for the user (a primary key and an index)
#   write_memory       the INSERT after rate_limit on the user's key, in one statement
#   write_durable      the same with the durable limit
# WORKLOADS picks some (all by default). Each run also counts the machine's CPU time
# (/proc/stat, every process and the kernel: the server, pgbench, the sockets) per request:
# its difference to noop's is what the limit adds. Every call is granted (10 a second per
# user, and each user is called every few seconds); after each memory run the script checks
# that no state row was written. Prints a Markdown table, then runs bench/memory_scale.sh
# (SCALE=0 leaves it out). About 14 minutes. The default rate_limiter.memory_keys holds
# every user.
source "$(dirname "$0")/../scripts/lib.sh"
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-3}
USERS=${USERS:-100000}
WORKLOADS=${WORKLOADS:-noop memory_alone memory_alone_tl memory_ok read read_c_function read_memory_from read_memory_where read_memory_tl read_memory_ok read_durable write write_memory write_durable}
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
limit() { echo "rate_limiter.rate_limit('api_$1', CAST(:id AS text))"; }
workload() { printf '%s\n%s;\n' "$pick" "$2" > "$OUT/$1.sql"; }
workload noop "SELECT CAST(:id AS text)"
workload memory_alone "SELECT ok FROM $(limit memory)"
workload memory_alone_tl "SELECT ($(limit memory)).ok"
workload read "SELECT id, name, plan FROM users WHERE id = :id"
workload read_c_function "SELECT u.id, u.name, u.plan FROM int8abs(:id) a, users u WHERE u.id = a"
for d in durable memory; do
    from="SELECT u.id, u.name, u.plan FROM $(limit $d) l, users u WHERE l.ok AND u.id = :id"
    [ $d = memory ] && workload read_memory_from "$from" || workload read_durable "$from"
    workload "write_$d" "INSERT INTO messages (user_id, body) SELECT :id, 'hello' FROM $(limit $d) l WHERE l.ok"
done
workload read_memory_where "SELECT u.id, u.name, u.plan FROM users u WHERE u.id = :id AND ($(limit memory)).ok"
workload read_memory_tl "SELECT u.id, u.name, u.plan, ($(limit memory)).ok FROM users u WHERE u.id = :id"
workload memory_ok "SELECT rate_limiter.rate_limit_ok('api_memory', CAST(:id AS text))"
workload read_memory_ok "SELECT u.id, u.name, u.plan FROM users u WHERE u.id = :id AND rate_limiter.rate_limit_ok('api_memory', CAST(:id AS text))"
workload write "INSERT INTO messages (user_id, body) VALUES (:id, 'hello')"
busy_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; } # user nice system irq softirq steal
TICK_US=$((1000000 / $(getconf CLK_TCK)))

for round in $(seq "$ROUNDS"); do
    for CLIENTS in 8 32; do
        for w in $WORKLOADS; do
            bench_sql -c "TRUNCATE messages" -c "DELETE FROM rate_limiter.state" -c CHECKPOINT >/dev/null
            before=$(busy_ticks)
            result=$(PGOPTIONS="-c synchronous_commit=on" pgbench -n -M prepared -c "$CLIENTS" -j 2 \
                -T "$DURATION" -f "$OUT/$w.sql" "$DB" 2>&1) || { echo "$result" >&2; exit 1; }
            busy=$(($(busy_ticks) - before))
            tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$result")
            done_count=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$result")
            cpu_us=$(echo "$busy * $TICK_US / $done_count" | bc -l)
            if [[ $w == *memory* ]] && [ "$(bench_sql -c "SELECT count(*) FROM rate_limiter.state")" != 0 ]; then
                echo "$w wrote state rows" >&2
                exit 1
            fi
            printf '%s\t%s\t%s\t%s\n' "$CLIENTS" "$w" "$tps" "$cpu_us" >> "$OUT/raw.tsv"
            printf 'round %s clients %2s %-18s %8.0f requests/s %6.1f us of CPU each\n' "$round" "$CLIENTS" "$w" "$tps" "$cpu_us"
        done
    done
done
"$DEBIAN_PYTHON" - "$OUT/raw.tsv" <<'PY'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().split("\n") if l]
workloads = list(dict.fromkeys(r[1] for r in rows))
def median(w, c, column):
    return statistics.median(float(r[column]) for r in rows if r[1] == w and r[0] == c)
def spread(w, c):
    v = [float(r[2]) for r in rows if r[1] == w and r[0] == c]
    return f"{min(v):,.0f}–{max(v):,.0f}"
def base(w):  # what the workload is compared with
    return "noop" if w.startswith(("noop", "memory")) else w.split("_")[0]
print("| request, synchronous_commit = on | 8 clients | / base | µs CPU (+ over no-op) | 32 clients | / base | µs CPU (+ over no-op) |")
print("|---|---:|---:|---:|---:|---:|---:|")
for w in workloads:
    cells = []
    for c in ("8", "32"):
        tps, cpu = median(w, c, 2), median(w, c, 3)
        ratio = tps / median(base(w), c, 2) if base(w) in workloads else float("nan")
        over = cpu - median("noop", c, 3) if "noop" in workloads else float("nan")
        cells.append(f"{tps:,.0f} ({spread(w, c)}) | {ratio:.2f} | {cpu:.1f} (+{over:.1f})")
    print(f"| {w} | " + " | ".join(cells) + " |")
print()
print("Base: the no-op for noop and memory_alone*, the read for read*, the write for write*.")
PY
# Then the table at 100,000, 1,000,000 and 10,000,000 keys: bytes per key, calls per second
# and the snapshot's WAL per second (issue 53); SCALE=0 leaves it out.
if [ "${SCALE:-1}" = 1 ]; then
    echo
    bash "$ROOT/bench/memory_scale.sh"
fi
