#!/usr/bin/env bash
# Would an in-memory "denied until" cache (Upstash's ephemeral cache) make a denied call
# faster? Builds the extension with bench/deny_cache_probe.patch: a per-backend map of
# (name, key) -> denied until, consulted before the state is read, on when the session sets
# deny_cache_probe.on. That is cheaper than any shared-memory cache could be (no lock, no
# atomics), so its speed-up bounds what a shipped cache could give. Each session warms with
# one pass, then a measured pass of KEYS denied calls, with the probe off and on in turns,
# ROUNDS rounds; medians. Reinstalls the real build at the end.
# Writes bench/deny_cache.md. About 8 minutes (two release builds).
source "$(dirname "$0")/../scripts/lib.sh"
KEYS=${KEYS:-100000}
ROUNDS=${ROUNDS:-7}
DB=rate_limiter_bench_deny_cache
OUT=$ROOT/bench/deny_cache.md

setup
PROBE=$(mktemp -d)
trap 'git -C "$ROOT" worktree remove --force "$PROBE" 2>/dev/null || true' EXIT
git -C "$ROOT" worktree add -q --detach "$PROBE" HEAD
git -C "$PROBE" apply "$ROOT/bench/deny_cache_probe.patch"
step "building and installing the probe build"
# The same target directory: only the crate itself is rebuilt.
(cd "$PROBE" && CARGO_TARGET_DIR="$ROOT/target" cargo pgrx install --release --pg-config "$PG_CONFIG" 2>&1 | grep -E 'Finished|error' || true)
as_root cp "$ROOT"/sql/archive/rate_limiter--*.sql "$($PG_CONFIG --sharedir)/extension/"
restart_cluster
fresh_database $DB
sql() { psql -X -q -At -v ON_ERROR_STOP=1 -d $DB "$@"; }

sql -c "SELECT rate_limiter.define('denied', 'token bucket', 1, '1 hour')" \
    -c "CREATE FUNCTION timed(q text) RETURNS double precision LANGUAGE plpgsql AS \$\$
        DECLARE t0 timestamptz := clock_timestamp();
        BEGIN EXECUTE q; RETURN extract(epoch FROM clock_timestamp() - t0); END \$\$"
CALL="SELECT count(*) FROM generate_series(1, $KEYS) g, LATERAL rate_limiter.rate_limit('denied', g::text) d WHERE NOT d.ok"
sql -c "${CALL/NOT d.ok/d.ok}" -c "VACUUM ANALYZE rate_limiter.state" >/dev/null # takes every key's token

step "probe off and on, $KEYS denied calls per pass, $ROUNDS rounds"
RAW=$(mktemp)
for round in $(seq 1 "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then order="off on"; else order="on off"; fi
    for setting in $order; do
        sql -c CHECKPOINT
        t=$(sql -c "SET deny_cache_probe.on = $setting" -c "SELECT timed(\$q\$$CALL\$q\$)" \
                -c "SELECT timed(\$q\$$CALL\$q\$)" | tail -1)
        echo "$setting $t" >> "$RAW"
    done
done
# Every measured call was a denial, in both settings.
test "$(sql -c "SET deny_cache_probe.on = on" -c "$CALL" -c "$CALL" | tail -1)" = "$KEYS"
median() { grep "^$1 " "$RAW" | awk '{print $2}' | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
us() { echo "scale=2; $1 * 1000000 / $KEYS" | bc -l; }
off=$(us "$(median off)")
on=$(us "$(median on)")
speedup=$(echo "scale=2; $off / $on" | bc -l)
{
    echo "# An in-memory deny cache: measured, then decided"
    echo
    echo "Written by \`bash bench/deny_cache.sh\` on $(nproc) cores, PostgreSQL $(sql -c 'SHOW server_version'):"
    echo "$KEYS denied calls in one statement over rows that exist, each session warmed by one"
    echo "pass, the probe cache (bench/deny_cache_probe.patch, per backend, no locks) off and on in"
    echo "turns, median of $ROUNDS rounds. With it on, every measured call is answered from the map"
    echo "without reading the state."
    echo
    echo "| denied call | µs/call |"
    echo "|---|---:|"
    echo "| reads the state (as shipped) | $off |"
    echo "| answered from the cache | $on |"
    echo "| speed-up | ${speedup}x |"
    echo
    if [ "$(echo "$speedup >= 1.5" | bc -l)" = 1 ]; then
        echo "Decision: the speed-up reaches the 1.5x bar."
    else
        echo "Decision: below the 1.5x bar, so no cache ships; a denied call stays a lock-free,"
        echo "write-free read of one row, always exact and never stale."
    fi
    echo
    echo "Every measured pass, in µs per call:"
    echo
    echo '```'
    awk -v keys="$KEYS" '{printf "%s %.2f\n", $1, $2 * 1000000 / keys}' "$RAW"
    echo '```'
} > "$OUT"
rm -f "$RAW"
step "reinstalling the real build"
build_and_install
restart_cluster
cat "$OUT"
