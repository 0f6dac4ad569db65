#!/usr/bin/env bash
# Instructions per call of the in-process update pass (bench/run.sh's, N calls over N keys of
# a 10/s token bucket, rows created by a first pass), counted by callgrind in a single-user
# backend of a throwaway cluster, for each COMMIT's release build (WORK for the working
# tree). Counted instructions do not move with the machine's load as timings on two cores
# do, so a bisection of a few percent is decided by one run per commit. Also prints the
# instructions by source file of the extension (release builds with line tables), the
# answer to "where did they go". About 5 minutes per commit (mostly its fat-LTO build).
# Usage: [WITH_OVERRIDE=1] bash bench/instructions.sh COMMIT|WORK...
source "$(dirname "$0")/../scripts/lib.sh"
N=${N:-50000}
DATA=/tmp/rate_limiter_instructions
OUT=$DATA.out # written by postgres, under callgrind
as_root install -d -o postgres "$OUT"
setup 15
install_debian_packages valgrind

single_user() { # statement; runs in a single-user backend of $DATA, under $VALGRIND if set
    sudo -u postgres ${VALGRIND:-} "$PG_BIN/postgres" --single -D "$DATA" -c shared_preload_libraries=rate_limiter \
        -c rate_limiter.prune_interval=0 -c shared_buffers=256MB postgres <<<"$1" >/dev/null 2>>"$OUT/stderr.log"
}

measure() { # commit label
    local tree=$ROOT label=$2 log
    if [ "$1" != WORK ]; then
        tree=$(mktemp -d)
        git -C "$ROOT" worktree add -f "$tree" "$1" >/dev/null
    fi
    log=$(mktemp)
    # The commits share the target directory, and so the library's path: cargo, finding the
    # fingerprint of this tree's last build fresh, would install another commit's library.
    # The crate is built again each time (its dependencies stay built).
    rm -rf "$ROOT"/target/instructions/release/.fingerprint/rate_limiter-* "$ROOT/target/instructions/release/librate_limiter.so"
    (cd "$tree" && CARGO_TARGET_DIR="$ROOT/target/instructions" CARGO_PROFILE_RELEASE_DEBUG=line-tables-only \
        cargo pgrx install --release --pg-config "$PG_CONFIG") >"$log" 2>&1 || { cat "$log"; exit 1; }
    rm -f "$log"
    [ "$1" = WORK ] || git -C "$ROOT" worktree remove --force "$tree"
    as_root rm -rf "$DATA"
    as_root install -d -o postgres "$DATA"
    sudo -u postgres "$PG_BIN/initdb" -D "$DATA" -A trust -U postgres >/dev/null
    single_user "CREATE EXTENSION rate_limiter"
    single_user "SELECT rate_limiter.define('inproc', 'token bucket', 10, '1 second', 10)"
    # WITH_OVERRIDE=1: another key has an override, so each call looks its own key up (once a
    # backend: the pass calls each key once, the worst case).
    if [ -n "${WITH_OVERRIDE:-}" ]; then
        single_user "SELECT rate_limiter.override('inproc', 'another', rate => 20)"
    fi
    local calls="SELECT count(*) FROM generate_series(1, $N) g, LATERAL rate_limiter.rate_limit('inproc', g::text)"
    single_user "$calls" # the insert pass
    # Only the executor's run is counted: the update pass, against the same statement's
    # generate_series and count alone.
    VALGRIND="valgrind --tool=callgrind --toggle-collect=standard_ExecutorRun --callgrind-out-file=$OUT/$label.out" \
        single_user "$calls"
    VALGRIND="valgrind --tool=callgrind --toggle-collect=standard_ExecutorRun --callgrind-out-file=$OUT/$label.base.out" \
        single_user "SELECT count(*) FROM generate_series(1, $N) g, LATERAL (SELECT g::text) k"
    local total base
    total=$(callgrind_annotate "$OUT/$label.out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
    base=$(callgrind_annotate "$OUT/$label.base.out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
    printf '%s\t%s\t%.0f\n' "$label" "$1" "$(echo "($total - $base) / $N" | bc -l)" | tee -a "$OUT/per_call.tsv"
}

: > "$OUT/per_call.tsv"
for commit in "$@"; do
    measure "$commit" "$(echo "$commit" | tr -c 'A-Za-z0-9\n' _)"
done
build_and_install >/dev/null # the working tree's library back in place
step "instructions per call of the update pass (N = $N); by file: callgrind_annotate $OUT/LABEL.out"
cat "$OUT/per_call.tsv"
