# Shared steps of the project's commands; sourced, not run. Every step is idempotent.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PG_BIN=/usr/lib/postgresql/15/bin
PG_CONFIG=$PG_BIN/pg_config
PGRX_VERSION=0.18.1
# The throwaway cluster: owned by postgres (initdb refuses root), loopback and a socket in /tmp.
CLUSTER_DIR=${RATE_LIMITER_CLUSTER_DIR:-/tmp/rate_limiter_cluster}
export PGHOST=/tmp PGPORT=${RATE_LIMITER_PORT:-5488} PGUSER=postgres

step() { printf '\n==> %s\n' "$*"; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

install_packages() {
    # pg_cron and pg_repack for the operations tests' recipes; the JDBC driver and PgBouncer
    # for the examples; PL/Proxy for rate_limiter_proxy.
    local wanted=(postgresql-server-dev-15 libclang-dev clang sudo postgresql-15-cron postgresql-15-repack
                  libpostgresql-jdbc-java pgbouncer postgresql-15-plproxy) missing=()
    for p in "${wanted[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    if [ ${#missing[@]} -gt 0 ]; then
        step "installing Debian packages: ${missing[*]}"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

install_pgrx() {
    if ! cargo pgrx --version 2>/dev/null | grep -q "$PGRX_VERSION"; then
        step "installing cargo-pgrx $PGRX_VERSION (about 8 minutes, once)"
        cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
    fi
    if ! grep -qs '^pg15' "${PGRX_HOME:-$HOME/.pgrx}/config.toml"; then
        step "pointing pgrx at $PG_CONFIG"
        cargo pgrx init --pg15 "$PG_CONFIG"
    fi
}

setup() {
    install_packages
    install_pgrx
}

build_and_install() {
    step "building and installing rate_limiter into PostgreSQL 15"
    (cd "$ROOT" && cargo pgrx install --release --pg-config "$PG_CONFIG" 2>&1 | grep -E 'Installing|Finished|error' || true)
    test -f "$($PG_CONFIG --sharedir)/extension/rate_limiter.control"
    # Earlier versions' install scripts, so CREATE EXTENSION ... VERSION and upgrades work.
    as_root cp "$ROOT"/sql/archive/rate_limiter--*.sql "$($PG_CONFIG --sharedir)/extension/"
    # The companion extension for a PL/Proxy router is SQL only.
    as_root cp "$ROOT"/proxy/rate_limiter_proxy.control "$ROOT"/proxy/rate_limiter_proxy--*.sql \
        "$($PG_CONFIG --sharedir)/extension/"
}

start_cluster() {
    if [ ! -f "$CLUSTER_DIR/PG_VERSION" ]; then
        step "creating a throwaway cluster in $CLUSTER_DIR"
        as_root mkdir -p "$CLUSTER_DIR"
        as_root chown postgres: "$CLUSTER_DIR"
        sudo -u postgres "$PG_BIN/initdb" -D "$CLUSTER_DIR" -A trust -U postgres >/dev/null
    fi
    if ! sudo -u postgres "$PG_BIN/pg_ctl" -D "$CLUSTER_DIR" status >/dev/null 2>&1; then
        step "starting it on 127.0.0.1:$PGPORT and $PGHOST"
        sudo -u postgres "$PG_BIN/pg_ctl" -D "$CLUSTER_DIR" -l "$CLUSTER_DIR/server.log" -w start \
            -o "-p $PGPORT -k /tmp -c listen_addresses=127.0.0.1 -c max_connections=200 $CLUSTER_SETTINGS" >/dev/null
    fi
}

# Room for the benchmark's million-row tables in memory, and checkpoints only when asked.
# The library is preloaded for its statistics; the prune worker stays off so that it never
# changes state rows under a test or a benchmark.
CLUSTER_SETTINGS="-c shared_buffers=1GB -c max_wal_size=16GB -c checkpoint_timeout=1h \
    -c shared_preload_libraries=rate_limiter -c rate_limiter.prune_interval=0"

stop_cluster() {
    if [ -f "$CLUSTER_DIR/PG_VERSION" ] && sudo -u postgres "$PG_BIN/pg_ctl" -D "$CLUSTER_DIR" status >/dev/null 2>&1; then
        sudo -u postgres "$PG_BIN/pg_ctl" -D "$CLUSTER_DIR" -w -m fast stop >/dev/null
    fi
}

# Restart so that the current CLUSTER_SETTINGS apply.
restart_cluster() {
    stop_cluster
    start_cluster
}

# A fresh database with the extension just installed, so a rebuilt library is picked up.
fresh_database() {
    psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $1 WITH (FORCE)" -c "CREATE DATABASE $1"
    psql -X -q -d "$1" -c "CREATE EXTENSION rate_limiter"
}

# Seconds one statement takes in database $1, from a checkpoint (so that no timing pays
# another's full-page writes); for the benchmarks.
seconds_in() {
    local t0
    psql -X -q -At -v ON_ERROR_STOP=1 -d "$1" -c CHECKPOINT
    t0=$(date +%s.%N)
    psql -X -q -At -v ON_ERROR_STOP=1 -d "$1" -c "$2" >/dev/null
    awk -v t0="$t0" -v t1="$(date +%s.%N)" 'BEGIN { print t1 - t0 }'
}
