#!/usr/bin/env bash
# Before and after: bench/run.sh's workload (a) (8 clients over 100,000 keys of a 10/s token
# bucket, synchronous_commit on and off) and its in-process cost (1,000,000 calls in one
# statement, creating rows, then updating them), for the library built from COMMIT and for
# the working tree, taking turns, ROUNDS rounds each; prints the medians. For a change that
# must not move the figures (a reshaping). About 10 minutes.
# Usage: bash bench/compare.sh COMMIT
source "$(dirname "$0")/../scripts/lib.sh"
BASE=${1:?usage: bench/compare.sh COMMIT}
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
CLIENTS=${CLIENTS:-8}
DB=rate_limiter_bench_compare
OUT=$ROOT/bench/out/compare
mkdir -p "$OUT"
: > "$OUT/raw.tsv"
sql() { psql -X -q -At -v ON_ERROR_STOP=1 -d $DB "$@"; }

setup
BASE_TREE=$(mktemp -d)
git -C "$ROOT" worktree add -f "$BASE_TREE" "$BASE" >/dev/null
trap 'git -C "$ROOT" worktree remove --force "$BASE_TREE"' EXIT

install_from() { # tree: a release build of that tree, installed; the cluster restarted on it
    stop_cluster
    (cd "$1" && CARGO_TARGET_DIR="$ROOT/target/compare" cargo pgrx install --release --pg-config "$PG_CONFIG" 2>&1 \
        | grep -E 'error' || true)
    start_cluster
    psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB"
    sql -c "CREATE EXTENSION rate_limiter"
    sql -f "$ROOT/bench/competitors.sql"
    sql -c "SELECT rate_limiter.define('bench', 'token bucket', 10, '1 second', 10)" \
        -c "SELECT bench.seed('bench', 100000, 10)" -c "VACUUM ANALYZE"
}

measure() { # label
    printf '\\set k random(1, 100000)\nSELECT * FROM rate_limiter.rate_limit('"'bench'"', CAST(:k AS text));\n' > "$OUT/a.sql"
    for commit in on off; do
        local result tps
        result=$(PGOPTIONS="-c synchronous_commit=$commit" pgbench -n -M prepared -c "$CLIENTS" -j 2 \
            -T "$DURATION" -f "$OUT/a.sql" $DB 2>&1)
        tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$result")
        [ -n "$tps" ] || { echo "$result"; exit 1; }
        printf '%s\ta_%s\t%s\n' "$1" "$commit" "$tps" >> "$OUT/raw.tsv"
    done
    sql -c "SELECT rate_limiter.define('inproc_$2', 'token bucket', 10, '1 second', 10)"
    for pass in insert update; do
        local s
        s=$(seconds_in $DB "SELECT count(*) FROM generate_series(1, 1000000) g, LATERAL rate_limiter.rate_limit('inproc_$2', g::text)")
        printf '%s\tinproc_%s_us\t%s\n' "$1" "$pass" "$(awk -v s="$s" 'BEGIN { print s }')" >> "$OUT/raw.tsv"
    done
}

for round in $(seq "$ROUNDS"); do
    step "round $round: $BASE"
    install_from "$BASE_TREE"
    measure before "$round"
    step "round $round: the working tree"
    install_from "$ROOT"
    measure after "$round"
done
build_and_install >/dev/null
restart_cluster

step "medians of $ROUNDS rounds (calls/s for workload a; µs per call in process)"
python3 - "$OUT/raw.tsv" <<'PY'
import statistics, sys
rows = [line.split("\t") for line in open(sys.argv[1]).read().split("\n") if line]
for metric in ("a_on", "a_off", "inproc_insert_us", "inproc_update_us"):
    med = {who: statistics.median(float(v) for w, m, v in rows if w == who and m == metric) for who in ("before", "after")}
    print(f"{metric:18} before {med['before']:10.2f}  after {med['after']:10.2f}  after/before {med['after'] / med['before']:.3f}")
PY
