#!/usr/bin/env bash
# Does the PostgreSQL version change the cost? bench/run.sh's workload (a) and the in-process
# cost (bench/measure.sh) on each supported major (15, 16, 17, 18), one run, the versions taking
# turns, ROUNDS rounds each; one cluster runs at a time, with the benchmark settings of
# scripts/lib.sh. Writes bench/versions.md. About 8 minutes.
source "$(dirname "$0")/../scripts/lib.sh"
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
CLIENTS=${CLIENTS:-8}
DB=rate_limiter_bench_versions
OUT=$ROOT/bench/out/versions
mkdir -p "$OUT"
: > "$OUT/raw.tsv"
source "$ROOT/bench/measure.sh"

setup "${SUPPORTED_MAJORS[@]}"
# Whatever happens, leave only the usual cluster running.
trap 'for NN in "${SUPPORTED_MAJORS[@]}"; do stop_cluster "$NN"; done; start_cluster' EXIT
for NN in "${SUPPORTED_MAJORS[@]}"; do
    stop_cluster "$NN"
    build_and_install "$NN"
done
for round in $(seq "$ROUNDS"); do
    for NN in "${SUPPORTED_MAJORS[@]}"; do
        step "round $round: PostgreSQL $NN"
        start_cluster "$NN"
        PGPORT=$(cluster_port "$NN") prepare_bench_database
        PGPORT=$(cluster_port "$NN") measure_a_and_in_process "$OUT/raw.tsv" "$NN" "$round"
        stop_cluster "$NN"
    done
done

step "medians of $ROUNDS rounds"
{
    echo "# rate_limiter on each PostgreSQL version"
    echo
    echo "\`bash bench/versions.sh\`: $(nproc) cores, $CLIENTS clients, $DURATION s per run, medians of $ROUNDS rounds, the versions taking turns, one server running at a time."
    echo
    for NN in "${SUPPORTED_MAJORS[@]}"; do
        echo "- PostgreSQL $NN: $("$(pg_bin "$NN")/pg_config" --version), from $(if [ "$NN" = 15 ]; then echo "Debian 12's package"; else echo "\`$(stamp_source "$(pg_prefix "$NN")" | cut -d' ' -f1-3)\` (scripts/servers.sh)"; fi); built against $(pg_headers_origin "$NN" | cut -d' ' -f1-3)."
    done
    echo
    "$DEBIAN_PYTHON" - "$OUT/raw.tsv" "${SUPPORTED_MAJORS[@]}" <<'PY'
import statistics, sys
rows = [line.split("\t") for line in open(sys.argv[1]).read().split("\n") if line]
versions = sys.argv[2:]
metrics = [("a_on", "workload (a), `synchronous_commit = on`, calls/s", "{:,.0f}"),
           ("a_off", "workload (a), `synchronous_commit = off`, calls/s", "{:,.0f}"),
           ("inproc_insert_us", "in process, creating a row, µs per call", "{:.2f}"),
           ("inproc_update_us", "in process, updating a row, µs per call", "{:.2f}")]
print("| | " + " | ".join(f"PostgreSQL {v}" for v in versions) + " |")
print("|---|" + "---:|" * len(versions))
for metric, label, fmt in metrics:
    cells = []
    for v in versions:
        values = [float(x) for who, m, x in rows if who == v and m == metric]
        cells.append(f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})")
    print(f"| {label} | " + " | ".join(cells) + " |")
PY
    echo
    echo "In parentheses: the lowest and highest round. The servers are different builds as well as different versions: all are compiled with -O2; Debian's 15 adds a stack protector and frame pointers; 17 and 18 are built without ICU and readline, which these workloads do not use."
} > "$ROOT/bench/versions.md"
cat "$ROOT/bench/versions.md"
