#!/usr/bin/env bash
# Instructions per *transaction* of a request as an application makes it (issue 66): one
# prepared statement per transaction, with and without a limit, counted by callgrind in a
# single-user backend of PostgreSQL 15 (each statement its own transaction, parse-free
# EXECUTE of a PREPAREd statement). bench/instructions.sh counts a call inside a loop of
# 50,000 in one statement, which hides what is paid once per statement or transaction; this
# counts everything from the statement's start to its commit.
#
# Each request runs twice, in a backend of its own: 2N transactions on keys 1..2N (the memory
# table's entries and the durable rows created, caches loaded), then N more on keys 1..N;
# and the same with 2N more. The difference of the two whole processes' counts over N is the
# cost of one transaction on an existing key: start-up, the first calls and the shutdown
# (which saves the same 2N memory keys) cancel. Debian's server is stripped: its static
# functions are counted under the exported function before them. Prints a table (instructions per transaction and
# over the no-op) and, for REQUESTS in PROFILE, the functions with the most inclusive
# instructions per transaction (callgrind_annotate --inclusive, the same difference).
# About 3 minutes plus a release build.
# Usage: [N=2000] [ONLY="noop memory_alone"] [PROFILE="memory_alone"] bash bench/request_instructions.sh
source "$(dirname "$0")/../scripts/lib.sh"
N=${N:-2000}
PROFILE=${PROFILE:-memory_alone read_memory_from}
DATA=/tmp/rate_limiter_request_instructions
OUT=$DATA.out # written by postgres, under callgrind
as_root install -d -o postgres "$OUT"
setup 15
install_debian_packages valgrind
build_and_install >/dev/null

single_user() { # runs stdin in a single-user backend of $DATA, under $VALGRIND if set
    sudo -u postgres ${VALGRIND:-} "$PG_BIN/postgres" --single -D "$DATA" -c shared_preload_libraries=rate_limiter \
        -c rate_limiter.prune_interval=0 -c rate_limiter.memory_snapshot=0 -c shared_buffers=256MB postgres \
        >/dev/null 2>>"$OUT/stderr.log"
}

as_root rm -rf "$DATA"
as_root install -d -o postgres "$DATA"
sudo -u postgres "$PG_BIN/initdb" -D "$DATA" -A trust -U postgres >/dev/null
single_user <<SQL
CREATE EXTENSION rate_limiter
SELECT rate_limiter.define('api_durable', 'token bucket', 10, '1 second')
SELECT rate_limiter.define('api_memory', 'token bucket', 10, '1 second', durable => false)
CREATE TABLE users (id bigint PRIMARY KEY, name text NOT NULL, plan text NOT NULL)
INSERT INTO users SELECT g, 'user ' || g, 'free' FROM generate_series(1, $((2 * N))) g
CREATE TABLE messages (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, user_id bigint NOT NULL, body text NOT NULL)
CREATE INDEX ON messages (user_id)
CREATE TABLE bare_state (name text, key text, value float8 NOT NULL, ts timestamptz NOT NULL, PRIMARY KEY (key, name))
INSERT INTO bare_state SELECT 'api', g::text, 10, now() FROM generate_series(1, $((2 * N))) g
VACUUM ANALYZE
SQL

# name and statement, $1 the user's id
REQUESTS=(
    "noop|SELECT \$1::text"
    "read|SELECT id, name, plan FROM users WHERE id = \$1"
    "read_c_function_from|SELECT u.id, u.name, u.plan FROM int8abs(\$1) a, users u WHERE u.id = a"
    "memory_alone|SELECT ok FROM rate_limiter.rate_limit('api_memory', CAST(\$1 AS text))"
    "memory_alone_tl|SELECT (rate_limiter.rate_limit('api_memory', CAST(\$1 AS text))).ok"
    "read_memory_from|SELECT u.id, u.name, u.plan FROM rate_limiter.rate_limit('api_memory', CAST(\$1 AS text)) l, users u WHERE l.ok AND u.id = \$1"
    "read_memory_where|SELECT u.id, u.name, u.plan FROM users u WHERE u.id = \$1 AND (rate_limiter.rate_limit('api_memory', CAST(\$1 AS text))).ok"
    "read_memory_tl|SELECT u.id, u.name, u.plan, (rate_limiter.rate_limit('api_memory', CAST(\$1 AS text))).ok FROM users u WHERE u.id = \$1"
    "memory_ok_alone|SELECT rate_limiter.rate_limit_ok('api_memory', CAST(\$1 AS text))"
    "read_memory_ok_where|SELECT u.id, u.name, u.plan FROM users u WHERE u.id = \$1 AND rate_limiter.rate_limit_ok('api_memory', CAST(\$1 AS text))"
    "update_bare|UPDATE bare_state SET value = value - 1, ts = now() WHERE name = 'api' AND key = CAST(\$1 AS text)"
    "durable_alone|SELECT ok FROM rate_limiter.rate_limit('api_durable', CAST(\$1 AS text))"
    "write|INSERT INTO messages (user_id, body) VALUES (\$1, 'hello')"
    "write_memory|INSERT INTO messages (user_id, body) SELECT \$1, 'hello' FROM rate_limiter.rate_limit('api_memory', CAST(\$1 AS text)) l WHERE l.ok"
)

run() { # name statement count: 2N + count transactions; prints the process's total
    local name=$1 statement=$2 count=$3 file=$OUT/$1.$3.out
    as_root rm -f "$DATA/pg_stat/rate_limiter_memory.dat" # each run starts with no memory keys
    {
        echo "PREPARE q(bigint) AS $statement"
        seq 1 $((2 * N)) | sed 's/.*/EXECUTE q(&)/'
        seq 1 "$count" | sed 's/.*/EXECUTE q(&)/'
    } | VALGRIND="valgrind --tool=callgrind --callgrind-out-file=$file" single_user
    callgrind_annotate "$file" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
}

: > "$OUT/per_transaction.tsv"
for request in "${REQUESTS[@]}"; do
    name=${request%%|*} statement=${request#*|}
    [[ -z ${ONLY:-} || " $ONLY " == *" $name "* ]] || continue
    one=$(run "$name" "$statement" "$N")
    two=$(run "$name" "$statement" $((2 * N)))
    printf '%s\t%.0f\n' "$name" "$(echo "($two - $one) / $N" | bc -l)" | tee -a "$OUT/per_transaction.tsv"
done

step "instructions per transaction (N = $N on existing keys; PostgreSQL 15, single-user backend)"
"$DEBIAN_PYTHON" - "$OUT/per_transaction.tsv" <<'PY'
import sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().splitlines() if l]
cost = {name: float(v) for name, v in rows}
cost.setdefault("noop", 0.0)
print("| request | instructions per transaction | over the no-op |")
print("|---|---:|---:|")
for name, v in rows:
    print(f"| {name} | {float(v):,.0f} | {float(v) - cost['noop']:,.0f} |")
PY

profile() { # name: inclusive instructions per transaction, by function
    "$DEBIAN_PYTHON" - "$N" <(callgrind_annotate --inclusive=yes --threshold=100 "$OUT/$1.$N.out" 2>/dev/null) \
        <(callgrind_annotate --inclusive=yes --threshold=100 "$OUT/$1.$((2 * N)).out" 2>/dev/null) <<'PY'
import re, sys
n = int(sys.argv[1])
def read(path):
    costs = {}
    for line in open(path):
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S+)", line) or re.match(r"\s*([\d,]+)\s+(\S+)", line)
        if m and ":" in m.group(2):
            costs[m.group(2).split(" ")[0]] = int(m.group(1).replace(",", ""))
    return costs
one, two = read(sys.argv[2]), read(sys.argv[3])
rows = sorted(((two[f] - one.get(f, 0)) / n, f) for f in two)
for cost, f in reversed(rows[-40:]):
    if cost >= 50:
        print(f"{cost:10,.0f}  {f}")
PY
}
for name in $PROFILE; do
    step "$name: inclusive instructions per transaction, by function"
    profile "$name"
done
