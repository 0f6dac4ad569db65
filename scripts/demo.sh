#!/usr/bin/env bash
# Install what is missing, build and install the extension, start a throwaway cluster and
# play a short demo. Safe to run again.
source "$(dirname "$0")/lib.sh"
setup 15
build_and_install
start_cluster
fresh_database rate_limiter_demo
step "demo"
psql -X -d rate_limiter_demo -f "$ROOT/scripts/demo.sql"
cat <<MSG

Continue with:
  psql -h $PGHOST -p $PGPORT -U $PGUSER rate_limiter_demo
MSG
