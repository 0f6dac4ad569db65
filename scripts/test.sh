#!/usr/bin/env bash
# Run the test tiers on every supported PostgreSQL (15, 16, 17, 18; scripts/servers.sh obtains
# 16, 17 and 18 once): every download of every version checked against its pin (tier 0),
# Rust unit tests and #[pg_test]s (cargo pgrx test: tiers 1 and 2, one run per version),
# then the pg_isolation_regress specs (3) on each version's throwaway cluster, and the
# multi-session and operations tests in tests/ (4), which run on 15 and, where the write path
# differs between versions, on 16, 17 and 18 too (a parameter of each such test), several at
# once (RATE_LIMITER_TEST_WORKERS, 4 by default). All tiers by default; `bash scripts/test.sh
# 3 4` runs those only; RATE_LIMITER_PG_VERSIONS="15" runs on fewer versions. Ends with the
# time each step took. Safe to run again.
source "$(dirname "$0")/lib.sh"
# Tier 4's pytest adds a line "VERSION SECONDS TEST" per test to this file, kept after the run.
TIER4_TIMINGS=$ROOT/target/tier4_times.txt
mkdir -p "$ROOT/target" && : > "$TIER4_TIMINGS"
tier4_timings() {
    local pg seconds
    while read -r pg seconds; do
        TIMINGS+=("$(minutes_seconds "$seconds")  tier 4 on $pg: its tests' time, summed over the workers")
    done < <(awk '{ t[$1] += $2 } END { for (v in t) printf "%s %d\n", v, t[v] + 0.5 }' "$TIER4_TIMINGS" | sort -n)
}
slowest_tests() {
    [ -s "$TIER4_TIMINGS" ] || return 0
    step "the 20 slowest tests of tier 4 (seconds, PostgreSQL version, test)"
    # Not head, which would end sort with SIGPIPE (and, under pipefail, the run with 141).
    sort -k2,2 -g -r "$TIER4_TIMINGS" | awk 'NR <= 20 { printf "%7.1f  %-11s %s\n", $2, $1, $3 }'
}
# The throwaway clusters of tiers 3 and 4 stay up after the run; their logs are judged at its
# end (a crash or failed assertion fails the run, whatever the tests said).
STARTED=()
judge_running_clusters() {
    local NN status=0
    for NN in "${STARTED[@]}"; do
        check_server_log "$(cluster_dir "$NN")/server.log" "PostgreSQL $NN's throwaway cluster" || status=1
    done
    return $status
}
trap 'status=$?; tier4_timings; slowest_tests; print_timings; judge_running_clusters || status=1; exit $status' EXIT
tiers=" ${*:-0 1 2 3 4} "
wants() { for t in "$@"; do [[ $tiers == *" $t "* ]] && return 0; done; return 1; }
read -r -a VERSIONS <<< "${RATE_LIMITER_PG_VERSIONS:-${SUPPORTED_MAJORS[*]}}"
export RATE_LIMITER_PG_VERSIONS="${VERSIONS[*]}"
if [[ " ${VERSIONS[*]} " != *" 15 "* ]]; then
    echo "RATE_LIMITER_PG_VERSIONS must include 15: tier 4 runs whole on it" >&2
    exit 2
fi
WORKERS=${RATE_LIMITER_TEST_WORKERS:-4}

# Tiers 1 and 2 build the crate twice, as cargo test's harness and (inside it) as the
# extension's library, and clippy lints both builds as they compile (clippy-driver as the
# crate's compiler, undocumented unsafe denied by Cargo.toml's [lints]): a separate `cargo
# clippy` compiled every dependency once more. cargo-pgrx links the library with
# --no-gc-sections, a rustflag that gave it dependencies of its own, compiled a second time
# beside the harness's; its schema section survives without it here (x86_64, GNU ld), and
# a library that lost it fails to install, so tier 2 fails rather than passes without it.
unit_and_pg_tests() {
    step "tiers 1 and 2 on PostgreSQL $1: unit tests and #[pg_test]s, linted by clippy as they build"
    as_root mkdir -p /tmp/rate_limiter_pgrx_test
    as_root chown postgres: /tmp/rate_limiter_pgrx_test
    (cd "$ROOT" && RUSTC_WORKSPACE_WRAPPER=$(command -v clippy-driver) CARGO_PGRX_DISABLE_GC_SECTIONS_WORKAROUND=1 \
        cargo pgrx test "pg$1" --runas postgres --pgdata "/tmp/rate_limiter_pgrx_test/pg$1")
}

isolation() {
    local NN=$1 out=/tmp/rate_limiter_isolation_$1 specs pg_config
    step "tier 3 on PostgreSQL $NN: deterministic interleavings (pg_isolation_regress)"
    rm -rf "$out" && mkdir -p "$out"
    fresh_database rate_limiter_isolation "$NN"
    specs=$(cd "$ROOT/tests/isolation/specs" && ls *.spec | sed 's/\.spec$//')
    pg_config=$(pg_bin "$NN")/pg_config
    "$($pg_config --pkglibdir)/pgxs/src/test/isolation/pg_isolation_regress" --use-existing \
        --bindir="$(pg_bin "$NN")" --host=/tmp --port="$(cluster_port "$NN")" --user=postgres \
        --dbname=rate_limiter_isolation --inputdir="$ROOT/tests/isolation" --outputdir="$out" \
        $specs || { cat "$out/regression.diffs" 2>/dev/null; return 1; }
}

test_runtimes() {
    obtain_node
    test_venv
}

# Both checks, each reporting what fails.
tier0() {
    local status=0
    check_every_source || status=1
    check_test_runtimes || status=1
    return $status
}

# Tier 4's pytest on Debian's Python and Node, with each test's time written where
# print_timings and slowest_tests find it.
tier4() {
    (cd "$ROOT" && PATH="$NODE_BIN:$PATH" PGDATABASE=rate_limiter_test RATE_LIMITER_TIMINGS="$TIER4_TIMINGS" \
        .venv/bin/pytest -q -p no:cacheprovider "$@" tests)
}

step "links between the Markdown files (README.md, docs/, examples/, bench/)"
timed "links" "$DEBIAN_PYTHON" "$ROOT/scripts/check_links.py" "$ROOT"
step "the layers of src/ (docs/layout.md): no module or file imports back up"
timed "layers" "$DEBIAN_PYTHON" "$ROOT/scripts/layers.py" >/dev/null
step "the SQL surface of the extension, the edition, the router and the clients against contract/functions.json"
timed "contract" "$DEBIAN_PYTHON" "$ROOT/scripts/check_contract.py"
# 15-upstream is the start of the major-version upgrade test.
timed "obtaining what is missing (packages, PostgreSQL servers, cargo-pgrx)" setup "${VERSIONS[@]}" 15-upstream
if wants 0 4; then
    step "the tests' interpreters: Debian's Python (tier 4's virtualenv) and Node"
    timed "the tests' Python and Node" test_runtimes
fi
if wants 0; then
    step "tier 0: every download of every PostgreSQL version, checked against its pin; the tests' interpreters Debian's"
    timed "tier 0" tier0
fi
if wants 1; then
    for NN in "${VERSIONS[@]}"; do
        step "tier 1 on PostgreSQL $NN: the SQL-only edition on a stock server gives contract/vectors.json's answers"
        timed "the edition's vectors on $NN" bash "$ROOT/scripts/edition_vectors.sh" "$NN"
    done
fi
# cargo pgrx test --runas copies its build over the installed library with `sudo cp`, which
# rewrites the file that a running server has mapped (a backend of a preloading server died
# with SIGBUS or SIGSEGV that way): the throwaway clusters are stopped before any install and
# started again after it. Other servers on this machine that load the library should be
# stopped too; build_and_install itself replaces the file (a new inode).
for NN in "${VERSIONS[@]}"; do stop_cluster "$NN" previous; done
if wants 1 2; then
    for NN in "${VERSIONS[@]}"; do
        timed "tiers 1 and 2 on $NN, with clippy" unit_and_pg_tests "$NN"
    done
fi
wants 3 4 || exit 0
# cargo pgrx test installed its test build; install the real one for the cluster tests. The
# clusters run without fsync, as PostgreSQL's own tests do: no test cuts the power, and a
# checkpoint (each DROP DATABASE asks for one) need not wait for the disk.
CLUSTER_SETTINGS="$CLUSTER_SETTINGS -c fsync=off"
for NN in "${VERSIONS[@]}"; do
    timed "release build and install on $NN" build_and_install "$NN"
    start_cluster "$NN"
    STARTED+=("$NN")
done
if wants 3; then
    for NN in "${VERSIONS[@]}"; do timed "tier 3 on $NN" isolation "$NN"; done
fi
if wants 4; then
    # The major-version upgrade test starts from an upstream build of 15.
    build_and_install 15-upstream
    # The Debian packages, for tests/test_package.py, under a group-writable umask as on a
    # shared build machine: the packages' modes must not follow it.
    timed "Debian packages" bash -c "umask 002 && bash '$ROOT/scripts/package.sh' --prebuilt ${VERSIONS[*]} >/dev/null"
    for NN in "${VERSIONS[@]}"; do fresh_database rate_limiter_test "$NN"; done
    # First those that replace the installed library (dpkg), which no other test may load
    # meanwhile; then the rest, several at once, each worker with its own ports and clusters.
    step "tier 4: the tests that replace installed files, alone"
    timed "tier 4, alone" tier4 -m alone
    step "tier 4: multi-session and operations tests, $WORKERS at a time"
    timed "tier 4, $WORKERS at a time" tier4 -n "$WORKERS" --dist loadgroup -m "not alone"
fi
