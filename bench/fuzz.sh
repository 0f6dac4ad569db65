#!/usr/bin/env bash
# The SQL-level fuzzer's long run (tests/fuzz.py; tests/test_fuzz.py runs 24 s of it): 6
# sessions of random transactions for MINUTES on a throwaway cluster of VERSION (by default
# the assert-enabled server, so a failed assertion crashes a backend), with the library
# preloaded and its workers on, and the date as seed. The cluster listens on a socket only,
# so the test command may run meanwhile. Then its log is judged (a failed assertion, a process
# ended by a signal, a PANIC). Prints the figures; exits 1 on a fault (an internal error,
# SQLSTATE class XX, or a lost connection) or a finding in the log.
#   bash bench/fuzz.sh [MINUTES=30] [VERSION=ASSERT_MAJOR]
# Builds nothing: the library installed for that version is the one fuzzed.
source "$(dirname "$0")/../scripts/lib.sh"
MINUTES=${1:-30}
NN=${2:-$ASSERT_MAJOR}
SESSIONS=${SESSIONS:-6}
SEED=${SEED:-$(date +%Y%m%d)}
BIN=$(pg_bin "$NN")
DIR=/tmp/rate_limiter_fuzz_$NN
PORT=$((5600 + ${NN%%-*}))
server() { sudo -u postgres "$BIN/pg_ctl" -D "$DIR" "$@" >/dev/null; }

as_root rm -rf "$DIR" && as_root mkdir -p "$DIR" && as_root chown postgres: "$DIR"
sudo -u postgres "$BIN/initdb" -D "$DIR" -A trust -U postgres --no-sync >/dev/null
trap 'server -m immediate stop 2>/dev/null || true' EXIT
server -l "$DIR/server.log" -w start -o "-p $PORT -k /tmp -c listen_addresses= -c fsync=off -c max_connections=50 \
    -c shared_preload_libraries=rate_limiter -c rate_limiter.prune_interval=10s -c rate_limiter.memory_snapshot=1000"
"$BIN/psql" -X -q -h /tmp -p "$PORT" -U postgres -d postgres -c "CREATE DATABASE fuzz"
"$BIN/psql" -X -q -h /tmp -p "$PORT" -U postgres -d fuzz -c "CREATE EXTENSION rate_limiter"

test_venv  # the tests' virtualenv, made if this checkout has none yet
step "fuzzing PostgreSQL $NN for $MINUTES min: $SESSIONS sessions, seed $SEED"
status=0
"$ROOT/.venv/bin/python" "$ROOT/tests/fuzz.py" --conninfo "host=/tmp port=$PORT user=postgres dbname=fuzz" \
    --seconds "$(awk "BEGIN { print $MINUTES * 60 }")" --sessions "$SESSIONS" --seed "$SEED" --functions || status=1

step "the server's log: TRAP, a process ended by a signal, PANIC"
server -w -m fast stop
check_server_log "$DIR/server.log" "the fuzzed PostgreSQL $NN" && echo "nothing" || status=1
[ $status = 0 ] && echo "no fault" || echo "FAULTS: see above (python tests/fuzz.py --seed $SEED --replay SESSION:TRANSACTION prints one again)"
exit $status
