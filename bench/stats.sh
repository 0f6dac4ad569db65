#!/usr/bin/env bash
# What statistics cost: the in-process time per call with rate_limiter.track_stats on and
# off, on the allowed path (every call writes its row) and the denied path (no write, and
# with statistics on, the key goes into the top_denied sketch under its name's lock).
# One session per path runs PAIRS pairs of passes of KEYS calls each (one statement per
# pass), on and off back to back in alternating order, timed inside the server; the
# figure is the median of the pairs' ratios, so drift slower than a pair (bloat,
# autovacuum, a busy neighbour on the host) cancels out.
# Writes bench/stats.md. About 3 minutes.
source "$(dirname "$0")/../scripts/lib.sh"
KEYS=${KEYS:-10000}
PAIRS=${PAIRS:-81}
DB=rate_limiter_bench_stats
OUT=$ROOT/bench/stats.md

setup 15
build_and_install
restart_cluster
fresh_database $DB
sql() { psql -X -q -At -v ON_ERROR_STOP=1 -d $DB "$@"; }
test "$(sql -c 'SHOW shared_preload_libraries')" = rate_limiter

# 'allowed' never runs out; 'denied' has 1 token an hour, taken by the first pass.
sql -c "SELECT rate_limiter.define('allowed', 'token bucket', 1e12, '1 hour')" \
    -c "SELECT rate_limiter.define('denied', 'token bucket', 1, '1 hour')"
call() { echo "SELECT count(*) FROM generate_series(1, $KEYS) g, LATERAL rate_limiter.rate_limit('$1', g::text)"; }
sql -c "$(call allowed)" -c "$(call denied)" -c "VACUUM ANALYZE rate_limiter.state" >/dev/null

# A procedure, so that each pass commits (an allowed pass's updates become prunable, as in
# an application's own transactions).
sql -c "CREATE TABLE timings (path text, pair int, setting text, seconds double precision)" \
    -c "CREATE PROCEDURE pairs(path text, q text, pairs int) LANGUAGE plpgsql AS \$\$
        DECLARE t0 timestamptz; seconds double precision; setting text;
        BEGIN
            FOR p IN 1 .. pairs LOOP
                FOREACH setting IN ARRAY CASE WHEN p % 2 = 1 THEN '{on,off}'::text[] ELSE '{off,on}' END LOOP
                    PERFORM set_config('rate_limiter.track_stats', setting, false);
                    t0 := clock_timestamp();
                    EXECUTE q;
                    seconds := extract(epoch FROM clock_timestamp() - t0);
                    INSERT INTO timings VALUES (path, p, setting, seconds);
                    COMMIT;
                END LOOP;
            END LOOP;
        END \$\$"

step "track_stats on and off, $PAIRS pairs of $KEYS calls per path"
for path in allowed denied; do
    sql -c CHECKPOINT -c "CALL pairs('$path', \$q\$$(call "$path")\$q\$, $PAIRS)"
done
RAW=$(mktemp)
sql -F ' ' -c "SELECT path, pair, setting, seconds FROM timings ORDER BY path, pair, setting" > "$RAW"
# Per path: median µs per call for each setting, and the median of the pairs' on/off ratios.
summary() {
    awk -v keys="$KEYS" -v path="$1" '$1 == path { t[$2 " " $3] = $4 }
        END { for (k in t) { split(k, a, " "); if (a[2] == "on") print t[k] * 1e6 / keys, t[a[1] " off"] * 1e6 / keys, t[k] / t[a[1] " off"] } }' "$RAW" |
    "$DEBIAN_PYTHON" -c 'import sys, statistics as s; r = [list(map(float, l.split())) for l in sys.stdin]
print("%.2f %.2f %.3f" % tuple(s.median(c[i] for c in r) for i in (1, 0, 2)))'
}
counted=$(sql -c "SELECT calls FROM rate_limiter.stats WHERE name = 'denied'")
{
    echo "# What statistics cost per call"
    echo
    echo "Written by \`bash bench/stats.sh\` on $(nproc) cores, PostgreSQL $(sql -c 'SHOW server_version'),"
    echo "library preloaded: $KEYS calls in one statement (\`SELECT count(*) FROM generate_series(1, $KEYS) g,"
    echo "LATERAL rate_limiter.rate_limit(name, g::text)\`) over rows that exist, with"
    echo "\`rate_limiter.track_stats\` on and off back to back, in alternating order, $PAIRS pairs of passes"
    echo "per path in one session, each pass its own transaction, timed inside the server. On the allowed"
    echo "path every call writes its row; on the denied path nothing is written and, with statistics on,"
    echo "the key is counted in the name's top_denied sketch. (The denied limit counted $counted calls:"
    echo "the first pass and the passes with track_stats on.)"
    echo
    echo "| path | off µs/call | on µs/call | on / off (median of the pairs) |"
    echo "|---|---:|---:|---:|"
    for path in allowed denied; do
        read -r off on ratio <<< "$(summary $path)"
        echo "| $path | $off | $on | $ratio |"
    done
    echo
    echo "Every pass, in µs per call (path, pair, setting):"
    echo
    echo '```'
    awk -v keys="$KEYS" '{printf "%s %s %s %.2f\n", $1, $2, $3, $4 * 1000000 / keys}' "$RAW"
    echo '```'
} > "$OUT"
rm -f "$RAW"
cat "$OUT"
