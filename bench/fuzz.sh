#!/usr/bin/env bash
# The SQL-level fuzzer's long run (tests/fuzz.py; tests/test_fuzz.py runs 36 s of it): 6
# sessions of random transactions for MINUTES on a fresh database of the test command's
# cluster of VERSION (17: an assert-enabled build, so a failed assertion crashes a backend),
# with the date as seed. Then the server log written meanwhile is searched for assertion
# failures, backends killed by a signal and PANICs. Prints the figures; exits 1 on a fault
# (an internal error, SQLSTATE class XX, or a lost connection) or a log finding.
#   bash bench/fuzz.sh [MINUTES=30] [VERSION=ASSERT_MAJOR]
# Builds nothing: the library installed on that cluster is the one fuzzed.
source "$(dirname "$0")/../scripts/lib.sh"
MINUTES=${1:-30}
NN=${2:-$ASSERT_MAJOR}
SESSIONS=${SESSIONS:-6}
SEED=${SEED:-$(date +%Y%m%d)}
DB=rate_limiter_fuzz
PORT=$(cluster_port "$NN")
LOG=$(cluster_dir "$NN")/server.log

start_cluster "$NN"
fresh_database $DB "$NN"
# Only what the server logs from now on is searched.
LOG_FROM=$(($(as_root stat -c %s "$LOG") + 1))

step "fuzzing PostgreSQL $NN (port $PORT) for $MINUTES min: $SESSIONS sessions, seed $SEED"
status=0
"$ROOT/.venv/bin/python" "$ROOT/tests/fuzz.py" --conninfo "host=$PGHOST port=$PORT user=$PGUSER dbname=$DB" \
    --seconds "$(awk "BEGIN { print $MINUTES * 60 }")" --sessions "$SESSIONS" --seed "$SEED" --functions || status=1

step "the server log since the run started: TRAP, terminated by signal, PANIC"
FINDINGS=$(as_root tail -c +"$LOG_FROM" "$LOG" | grep -E "$SERVER_LOG_FAULTS" || true)
if [ -n "$FINDINGS" ]; then
    echo "$FINDINGS" | head -50
    echo "$(echo "$FINDINGS" | wc -l) log finding(s) in $LOG"
    status=1
else
    echo "none"
fi
[ $status = 0 ] && echo "no fault" || echo "FAULTS: see above (python tests/fuzz.py --seed $SEED --replay SESSION:TRANSACTION prints one again)"
exit $status
