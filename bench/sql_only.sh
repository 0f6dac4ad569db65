#!/usr/bin/env bash
# The SQL-only edition beside the extension, on the project's throwaway cluster (PostgreSQL
# 15): pgbench's calls per second of bench/run.sh's workload (a) (CLIENTS clients over
# 100,000 keys of a 10/s token bucket, one call per transaction, synchronous_commit on and
# off), of the application's write transaction (insert a message, the limit inside it), and
# the in-process cost (N calls in one statement, creating rows, then updating them). The two
# take turns, ROUNDS rounds of DURATION seconds, medians. Writes bench/sql_only.md. About 5
# minutes.
source "$(dirname "$0")/../scripts/lib.sh"
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
CLIENTS=${CLIENTS:-8}
N=${N:-100000}
OUT=$ROOT/bench/out/sql_only
RAW=$OUT/raw.tsv
mkdir -p "$OUT"
: > "$RAW"

setup 15
build_and_install >/dev/null
start_cluster

prepare() { # database, how to install
    psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $1 WITH (FORCE)" -c "CREATE DATABASE $1"
    if [ "$2" = extension ]; then
        psql -X -q -d "$1" -c "CREATE EXTENSION rate_limiter"
    else
        # As a managed service's database owner installs it: a role that is not a superuser.
        psql -X -q -d postgres -c "DO \$\$ BEGIN CREATE ROLE bench_owner LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END \$\$" \
            -c "ALTER DATABASE $1 OWNER TO bench_owner"
        psql -X -q -U bench_owner -d "$1" -v ON_ERROR_STOP=1 -f "$ROOT/sql-only/rate_limiter.sql"
    fi
    psql -X -q -d "$1" -v ON_ERROR_STOP=1 <<'SQL'
SELECT rate_limiter.define('bench', 'token bucket', 10, '1 second');
SELECT rate_limiter.define('inproc', 'token bucket', 10, '1 second');
CREATE TABLE messages (id bigserial PRIMARY KEY, author int NOT NULL, body text NOT NULL);
SELECT count(*) FROM generate_series(1, 100000) g, LATERAL rate_limiter.rate_limit('bench', g::text);
VACUUM ANALYZE;
SQL
}

printf '\\set k random(1, 100000)\nSELECT * FROM rate_limiter.rate_limit('"'bench'"', CAST(:k AS text));\n' > "$OUT/call.sql"
printf '\\set k random(1, 100000)\nBEGIN;\nSELECT ok FROM rate_limiter.rate_limit('"'bench'"', CAST(:k AS text));\nINSERT INTO messages (author, body) VALUES (:k, '"'hello'"');\nCOMMIT;\n' > "$OUT/app.sql"

for edition in extension sql_only; do prepare "bench_$edition" "$edition"; done
for round in $(seq "$ROUNDS"); do
    for edition in extension sql_only; do
        for commit in on off; do
            for workload in call app; do
                tps=$(PGOPTIONS="-c synchronous_commit=$commit" pgbench -n -M prepared -c "$CLIENTS" -j 2 -T "$DURATION" \
                    -f "$OUT/$workload.sql" "bench_$edition" 2>&1 | sed -n 's/^tps = \([0-9.]*\) .*/\1/p')
                [ -n "$tps" ] || { echo "pgbench failed: $edition $workload"; exit 1; }
                printf '%s\t%s_%s\t%s\n' "$edition" "$workload" "$commit" "$tps" >> "$RAW"
                printf 'round %s %-9s %-4s sync=%-3s %9.0f tx/s\n' "$round" "$edition" "$workload" "$commit" "$tps"
            done
        done
        psql -X -q -d "bench_$edition" -c "DELETE FROM rate_limiter.state WHERE name = 'inproc'" -c "VACUUM rate_limiter.state"
        for pass in insert update; do
            s=$(seconds_in "bench_$edition" "SELECT count(*) FROM generate_series(1, $N) g, LATERAL rate_limiter.rate_limit('inproc', g::text)")
            printf '%s\tinproc_%s_us\t%s\n' "$edition" "$pass" "$(echo "$s * 1000000 / $N" | bc -l)" >> "$RAW"
        done
    done
done

"$DEBIAN_PYTHON" - "$RAW" "$ROOT/bench/sql_only.md" "$CLIENTS" "$DURATION" "$ROUNDS" "$N" <<'PY'
import statistics, sys
raw, out, clients, duration, rounds, n = sys.argv[1:]
rows = [line.split("\t") for line in open(raw).read().splitlines() if line]
med = lambda who, metric: statistics.median(float(v) for w, m, v in rows if w == who and m == metric)
lines = [
    "# The SQL-only edition beside the extension",
    "",
    f"`bash bench/sql_only.sh` on this machine (2 cores, PostgreSQL 15): pgbench `-M prepared`, {clients} clients,",
    f"medians of {rounds} rounds of {duration} s, the two taking turns; 100,000 keys of a 10/s token bucket.",
    "`call` is one `rate_limit` per transaction (bench/run.sh's workload (a)); `app` is the",
    "application's write: `BEGIN`, the limit, an `INSERT` of a message, `COMMIT`.",
    "",
    "| workload | extension | SQL-only edition | edition / extension |",
    "|---|---:|---:|---:|",
]
for metric, label in [("call_on", "call, `synchronous_commit = on`"), ("call_off", "call, `off`"),
                      ("app_on", "application's transaction, `on`"), ("app_off", "application's transaction, `off`")]:
    e, s = med("extension", metric), med("sql_only", metric)
    lines.append(f"| {label} (tx/s) | {e:,.0f} | {s:,.0f} | {s / e:.2f} |")
for metric, label in [("inproc_insert_us", f"in process, creating rows (µs per call, {int(n):,} calls)"),
                      ("inproc_update_us", "in process, updating them (µs per call)")]:
    e, s = med("extension", metric), med("sql_only", metric)
    lines.append(f"| {label} | {e:.2f} | {s:.2f} | {s / e:.2f} |")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
