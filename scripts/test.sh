#!/usr/bin/env bash
# Run the test tiers: Rust unit tests and #[pg_test]s (cargo pgrx test: tiers 1 and 2, one
# run), then the pg_isolation_regress specs (3) and the multi-session and operations tests
# in tests/ (4) against a throwaway cluster (the operations tests start more clusters of
# their own). All tiers by default; `bash scripts/test.sh 3 4` runs those only. Safe to run
# again.
source "$(dirname "$0")/lib.sh"
tiers=" ${*:-1 2 3 4} "
wants() { for t in "$@"; do [[ $tiers == *" $t "* ]] && return 0; done; return 1; }
step "links between the Markdown files (README.md, docs/, examples/, bench/)"
python3 "$ROOT/scripts/check_links.py" "$ROOT"
setup
# cargo pgrx test --runas copies its build over the installed library with `sudo cp`, which
# rewrites the file that a running server has mapped (a backend of a preloading server died
# with SIGBUS or SIGSEGV that way): the throwaway cluster is stopped before any install and
# started again after it. Other servers on this machine that load the library should be
# stopped too; build_and_install itself replaces the file (a new inode) when run as root.
stop_cluster
if wants 1 2; then
    step "clippy, with undocumented unsafe denied (Cargo.toml [lints])"
    (cd "$ROOT" && cargo clippy --all-targets)
    step "tiers 1 and 2: unit tests and #[pg_test]s"
    as_root mkdir -p /tmp/rate_limiter_pgrx_test
    as_root chown postgres: /tmp/rate_limiter_pgrx_test
    (cd "$ROOT" && cargo pgrx test pg15 --runas postgres --pgdata /tmp/rate_limiter_pgrx_test/pg15)
fi
wants 3 4 || exit 0
# cargo pgrx test installed its test build; install the real one for the cluster tests.
build_and_install
start_cluster
if wants 3; then
    step "tier 3: deterministic interleavings (pg_isolation_regress)"
    ISOLATION_OUT=/tmp/rate_limiter_isolation
    rm -rf "$ISOLATION_OUT" && mkdir -p "$ISOLATION_OUT"
    fresh_database rate_limiter_isolation
    specs=$(cd "$ROOT/tests/isolation/specs" && ls *.spec | sed 's/\.spec$//')
    "$($PG_CONFIG --pkglibdir)/pgxs/src/test/isolation/pg_isolation_regress" --use-existing \
        --host=/tmp --port="$PGPORT" --user=postgres --dbname=rate_limiter_isolation \
        --inputdir="$ROOT/tests/isolation" --outputdir="$ISOLATION_OUT" \
        $specs || { cat "$ISOLATION_OUT/regression.diffs" 2>/dev/null; exit 1; }
fi
if wants 4; then
    # The Debian packages, for tests/test_package.py.
    bash "$ROOT/scripts/package.sh" >/dev/null
    fresh_database rate_limiter_test
    step "tier 4: multi-session and operations tests"
    [ -x "$ROOT/.venv/bin/pip" ] || python3 -m venv "$ROOT/.venv"
    # Every time: a no-op when the pinned versions are there, an update when they changed.
    "$ROOT/.venv/bin/pip" install --quiet --disable-pip-version-check -r "$ROOT/tests/requirements.txt"
    cd "$ROOT" && PGDATABASE=rate_limiter_test .venv/bin/pytest -q -p no:cacheprovider tests
fi
