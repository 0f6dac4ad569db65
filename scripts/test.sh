#!/usr/bin/env bash
# Run every test tier: Rust unit tests and #[pg_test]s (cargo pgrx test), then the
# multi-session tests in tests/ against a throwaway cluster. Safe to run again.
source "$(dirname "$0")/lib.sh"
setup
step "tier 1 and 2: unit tests and #[pg_test]s"
as_root mkdir -p /tmp/rate_limiter_pgrx_test
as_root chown postgres: /tmp/rate_limiter_pgrx_test
(cd "$ROOT" && cargo pgrx test pg15 --runas postgres --pgdata /tmp/rate_limiter_pgrx_test/pg15)
# cargo pgrx test installed its test build; install the real one for the cluster tests.
build_and_install
start_cluster
fresh_database rate_limiter_test
step "tier 3: multi-session tests"
if [ ! -x "$ROOT/.venv/bin/pytest" ]; then
    python3 -m venv "$ROOT/.venv"
    "$ROOT/.venv/bin/pip" install --quiet --disable-pip-version-check -r "$ROOT/tests/requirements.txt"
fi
cd "$ROOT" && PGDATABASE=rate_limiter_test .venv/bin/pytest -q -p no:cacheprovider tests
