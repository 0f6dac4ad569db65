#!/usr/bin/env bash
# The router hop: pgbench against a partition directly and through a rate_limiter_proxy
# router (on the test command's cluster) in front of 1, 2 and 4 partition clusters, all on
# this machine. Each pgbench run calls rate_limit for random keys of a named token bucket
# that always has tokens (the allowed path, which writes the row), ROUNDS times for SECONDS
# seconds; medians. Writes bench/proxy.md. About 4 minutes.
source "$(dirname "$0")/../scripts/lib.sh"
SECONDS_PER_RUN=${SECONDS_PER_RUN:-8}
ROUNDS=${ROUNDS:-3}
CLIENTS=${CLIENTS:-8}
BASE=/tmp/rate_limiter_bench_partitions
PORTS=(5640 5641 5642 5643)
OUT=$ROOT/bench/proxy.md

setup 15
build_and_install
restart_cluster

step "four partition clusters in $BASE"
as_root mkdir -p "$BASE" && as_root chown postgres: "$BASE"
for i in 0 1 2 3; do
    dir=$BASE/p$i
    if [ -f "$dir/postmaster.pid" ]; then sudo -u postgres "$PG_BIN/pg_ctl" -D "$dir" -w -m immediate stop >/dev/null; fi
    as_root rm -rf "$dir"
    sudo -u postgres "$PG_BIN/initdb" -D "$dir" -A trust -U postgres >/dev/null
    sudo -u postgres "$PG_BIN/pg_ctl" -D "$dir" -l "$dir/server.log" -w start \
        -o "-p ${PORTS[$i]} -k /tmp -c listen_addresses='' -c shared_buffers=256MB" >/dev/null
    psql -X -q -p "${PORTS[$i]}" -d postgres -c "CREATE DATABASE bench"
    psql -X -q -p "${PORTS[$i]}" -d bench -c "CREATE EXTENSION rate_limiter"
done
stop_partitions() {
    for i in 0 1 2 3; do sudo -u postgres "$PG_BIN/pg_ctl" -D "$BASE/p$i" -w -m fast stop >/dev/null 2>&1 || true; done
}
trap stop_partitions EXIT

for n in 1 2 4; do
    router=rate_limiter_bench_router$n
    psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $router WITH (FORCE)" -c "CREATE DATABASE $router"
    options=$(for ((i = 0; i < n; i++)); do echo "p$i 'host=/tmp port=${PORTS[$i]} dbname=bench user=postgres'"; done | paste -sd,)
    psql -X -q -v ON_ERROR_STOP=1 -d $router \
        -c "CREATE EXTENSION rate_limiter_proxy CASCADE" \
        -c "CREATE SERVER rate_limiter FOREIGN DATA WRAPPER plproxy OPTIONS ($options)" \
        -c "CREATE USER MAPPING FOR PUBLIC SERVER rate_limiter" \
        -c "SELECT rate_limiter_proxy.define('bench', 'token bucket', 1e12, '1 second')" >/dev/null
done

SCRIPTS=$(mktemp -d)
chmod 755 "$SCRIPTS"
printf '\\set key random(1, 100000)\nSELECT ok FROM rate_limiter.rate_limit('"'bench'"', (:key)::text);\n' > "$SCRIPTS/direct.sql"
printf '\\set key random(1, 100000)\nSELECT ok FROM rate_limiter_proxy.rate_limit('"'bench'"', (:key)::text);\n' > "$SCRIPTS/router.sql"

# tps and average latency (ms) of one pgbench run: run PORT DB SCRIPT CLIENTS
run() {
    "$PG_BIN/pgbench" -n -h /tmp -p "$1" -U postgres -f "$SCRIPTS/$3.sql" -c "$4" -j 2 -T "$SECONDS_PER_RUN" "$2" 2>&1 |
        awk '/^latency average/ {lat = $4} /^tps/ {tps = $3} END {printf "%.0f %.3f\n", tps, lat}'
}
# Median over ROUNDS of one column (1 tps, 2 latency) of a setup.
median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
measure() {  # label port db script clients
    local results
    results=$(for ((r = 0; r < ROUNDS; r++)); do run "$2" "$3" "$4" "$5"; done)
    printf '%s %s %s\n' "$1" "$(cut -d' ' -f1 <<< "$results" | median)" "$(cut -d' ' -f2 <<< "$results" | median)"
}

step "one client: a partition directly and through the router ($ROUNDS x ${SECONDS_PER_RUN}s each)"
single=$(measure direct "${PORTS[0]}" bench direct 1; measure router1 "$PGPORT" rate_limiter_bench_router1 router 1)
step "$CLIENTS clients: a partition directly, and the router with 1, 2 and 4 partitions"
many=$(measure direct "${PORTS[0]}" bench direct "$CLIENTS"
       for n in 1 2 4; do measure "router$n" "$PGPORT" rate_limiter_bench_router$n router "$CLIENTS"; done)
echo "$single"; echo "$many"

lat() { awk -v k="$1" '$1 == k {print $3}' <<< "$single"; }
tps() { awk -v k="$1" '$1 == k {print $2}' <<< "$many"; }
overhead=$(awk -v a="$(lat router1)" -v b="$(lat direct)" 'BEGIN {printf "%.3f", a - b}')
{
    echo "# The router hop: rate_limiter_proxy in front of 1, 2 and 4 partitions"
    echo
    echo "Written by \`bash bench/proxy.sh\` on $(nproc) cores, PostgreSQL $(psql -X -At -d postgres -c 'SHOW server_version'),"
    echo "PL/Proxy $(psql -X -At -d rate_limiter_bench_router1 -c "SELECT extversion FROM pg_extension WHERE extname = 'plproxy'"):"
    echo "pgbench (\`-n -j 2 -T $SECONDS_PER_RUN\`, median of $ROUNDS runs) calls \`rate_limit('bench', key)\` for a"
    echo "random key of 100,000, a token bucket that always has tokens (the allowed path, which writes"
    echo "the row, in a transaction per call). The router is a database on one PostgreSQL, each partition"
    echo "a PostgreSQL of its own on a Unix socket, all on this one machine."
    echo
    echo "| one client | calls/s | ms per call |"
    echo "|---|---:|---:|"
    echo "| a partition directly (\`rate_limiter.rate_limit\`) | $(awk '$1 == "direct" {print $2}' <<< "$single") | $(lat direct) |"
    echo "| through the router, 1 partition (\`rate_limiter_proxy.rate_limit\`) | $(awk '$1 == "router1" {print $2}' <<< "$single") | $(lat router1) |"
    echo "| **the router hop** | | **$overhead** |"
    echo
    echo "| $CLIENTS clients | calls/s | ms per call |"
    echo "|---|---:|---:|"
    echo "| a partition directly | $(tps direct) | $(awk '$1 == "direct" {print $3}' <<< "$many") |"
    for n in 1 2 4; do
        echo "| router, $n partition(s) | $(tps router$n) | $(awk -v k=router$n '$1 == k {print $3}' <<< "$many") |"
    done
} > "$OUT"
cat "$OUT"
