#!/usr/bin/env bash
# Run every test tier: Rust unit tests and #[pg_test]s (cargo pgrx test), then the
# pg_isolation_regress specs and the multi-session and operations tests in tests/ against
# a throwaway cluster (the operations tests start more clusters of their own). Safe to run again.
source "$(dirname "$0")/lib.sh"
setup
step "tier 1 and 2: unit tests and #[pg_test]s"
as_root mkdir -p /tmp/rate_limiter_pgrx_test
as_root chown postgres: /tmp/rate_limiter_pgrx_test
(cd "$ROOT" && cargo pgrx test pg15 --runas postgres --pgdata /tmp/rate_limiter_pgrx_test/pg15)
# cargo pgrx test installed its test build; install the real one for the cluster tests.
build_and_install
# A preloading server keeps the library it started with: restart it.
restart_cluster
step "tier 3: deterministic interleavings (pg_isolation_regress)"
ISOLATION_OUT=/tmp/rate_limiter_isolation
rm -rf "$ISOLATION_OUT" && mkdir -p "$ISOLATION_OUT"
fresh_database rate_limiter_isolation
specs=$(cd "$ROOT/tests/isolation/specs" && ls *.spec | sed 's/\.spec$//')
"$($PG_CONFIG --pkglibdir)/pgxs/src/test/isolation/pg_isolation_regress" --use-existing \
    --host=/tmp --port="$PGPORT" --user=postgres --dbname=rate_limiter_isolation \
    --inputdir="$ROOT/tests/isolation" --outputdir="$ISOLATION_OUT" \
    $specs || { cat "$ISOLATION_OUT/regression.diffs" 2>/dev/null; exit 1; }
fresh_database rate_limiter_test
step "tier 4: multi-session and operations tests"
[ -x "$ROOT/.venv/bin/pip" ] || python3 -m venv "$ROOT/.venv"
# Every time: a no-op when the pinned versions are there, an update when they changed.
"$ROOT/.venv/bin/pip" install --quiet --disable-pip-version-check -r "$ROOT/tests/requirements.txt"
cd "$ROOT" && PGDATABASE=rate_limiter_test .venv/bin/pytest -q -p no:cacheprovider tests
