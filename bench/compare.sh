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

setup 15
BASE_TREE=$(mktemp -d)
git -C "$ROOT" worktree add -f "$BASE_TREE" "$BASE" >/dev/null
trap 'git -C "$ROOT" worktree remove --force "$BASE_TREE"' EXIT

source "$ROOT/bench/measure.sh"

install_from() { # tree: a release build of that tree, installed; the cluster restarted on it
    stop_cluster
    (cd "$1" && CARGO_TARGET_DIR="$ROOT/target/compare" cargo pgrx install --release --pg-config "$PG_CONFIG" 2>&1 \
        | grep -E 'error' || true)
    start_cluster
    prepare_bench_database
}

for round in $(seq "$ROUNDS"); do
    step "round $round: $BASE"
    install_from "$BASE_TREE"
    measure_a_and_in_process "$OUT/raw.tsv" before "$round"
    step "round $round: the working tree"
    install_from "$ROOT"
    measure_a_and_in_process "$OUT/raw.tsv" after "$round"
done
build_and_install >/dev/null
restart_cluster

step "medians of $ROUNDS rounds (calls/s for workload a; µs per call in process)"
"$DEBIAN_PYTHON" - "$OUT/raw.tsv" <<'PY'
import statistics, sys
rows = [line.split("\t") for line in open(sys.argv[1]).read().split("\n") if line]
for metric in ("a_on", "a_off", "inproc_insert_us", "inproc_update_us"):
    med = {who: statistics.median(float(v) for w, m, v in rows if w == who and m == metric) for who in ("before", "after")}
    print(f"{metric:18} before {med['before']:10.2f}  after {med['after']:10.2f}  after/before {med['after'] / med['before']:.3f}")
PY
