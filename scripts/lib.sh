# Shared steps of the project's commands; sourced, not run. Every step is idempotent.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PGRX_VERSION=0.18.1
source "$ROOT/scripts/servers.sh"
source "$ROOT/scripts/runtimes.sh"
# The PostgreSQL the benchmarks, the demo and the single-version steps use.
PG_BIN=$(pg_bin 15)
PG_CONFIG=$PG_BIN/pg_config
# The throwaway cluster of each version: owned by postgres (initdb refuses root), loopback
# and a socket in /tmp. 15's is the default one (PGPORT); 17's and 18's have their own.
CLUSTER_DIR=${RATE_LIMITER_CLUSTER_DIR:-/tmp/rate_limiter_cluster}
export PGHOST=/tmp PGPORT=${RATE_LIMITER_PORT:-5488} PGUSER=postgres
cluster_dir() { if [ "${1:-15}" = 15 ]; then echo "$CLUSTER_DIR"; else echo "${CLUSTER_DIR}_$1"; fi; }
cluster_port() { case ${1:-15} in 15) echo "$PGPORT" ;; *) echo $((5400 + $1)) ;; esac; }

step() { printf '\n==> %s\n' "$*"; }

# `timed LABEL COMMAND...` runs COMMAND and keeps how long it took under LABEL;
# print_timings (an EXIT trap of the test command) lists them, and the step a failure
# stopped in. Not `cmd || ...`: errexit would be off inside COMMAND.
TIMINGS=() TIMED_LABEL="" TIMED_SINCE=0
timed() {
    TIMED_LABEL=$1 TIMED_SINCE=$SECONDS
    shift
    "$@"
    TIMINGS+=("$(minutes_seconds $((SECONDS - TIMED_SINCE)))  $TIMED_LABEL")
    TIMED_LABEL=""
}
minutes_seconds() { printf '%3d min %02d s' $(($1 / 60)) $(($1 % 60)); }
print_timings() {
    local line
    [ ${#TIMINGS[@]} -gt 0 ] || [ -n "$TIMED_LABEL" ] || return 0
    step "time per step"
    for line in "${TIMINGS[@]}"; do echo "$line"; done
    [ -z "$TIMED_LABEL" ] || echo "$(minutes_seconds $((SECONDS - TIMED_SINCE)))  $TIMED_LABEL (stopped here)"
    echo "$(minutes_seconds "$SECONDS")  in all"
}

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# The Debian packages $@ that are not installed yet.
install_debian_packages() {
    local p missing=()
    for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    if [ ${#missing[@]} -gt 0 ]; then
        step "installing Debian packages: ${missing[*]}"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

install_packages() {
    # pkg-config and libssl-dev for cargo-pgrx's build; pip (PostgreSQL wheels), venv (the
    # tests' virtualenvs), make, bzip2 (PostgreSQL from source) and procps (pgrep) for the
    # test command, which a minimal Debian lacks; pg_cron and pg_repack for the operations
    # tests' recipes; a Java runtime, the JDBC driver and PgBouncer for the examples; PL/Proxy
    # for rate_limiter_proxy; postgres_exporter for monitoring/. Node is the tests' own
    # (obtain_node, runtimes.sh). Valgrind: its headers build the assert-enabled server
    # (servers.sh), and bench/valgrind.sh runs the pg_tests under it.
    install_debian_packages postgresql-server-dev-15 libclang-dev clang sudo pkg-config libssl-dev \
        python3-pip python3-venv make bzip2 procps postgresql-15-cron postgresql-15-repack \
        default-jre-headless libpostgresql-jdbc-java pgbouncer postgresql-15-plproxy prometheus-postgres-exporter \
        valgrind
}

install_pgrx() {
    if ! cargo pgrx --version 2>/dev/null | grep -q "$PGRX_VERSION"; then
        step "installing cargo-pgrx $PGRX_VERSION (about 8 minutes, once)"
        cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
    fi
    # pgrx knows every version obtained so far (a demo's 15 alone, the test command's all).
    local config=${PGRX_HOME:-$HOME/.pgrx}/config.toml args=() NN missing=no
    for NN in "${SUPPORTED_MAJORS[@]}"; do
        [ -x "$(pg_bin "$NN")/pg_config" ] || continue
        args+=("--pg$NN" "$(pg_bin "$NN")/pg_config")
        grep -qsx "pg$NN = \"$(pg_bin "$NN")/pg_config\"" "$config" || missing=yes
    done
    if [ $missing = yes ]; then
        step "pointing pgrx at ${args[*]}"
        cargo pgrx init "${args[@]}" >/dev/null
    fi
}

# The Debian packages, cargo-pgrx, and PostgreSQL majors $@ (by default every supported one
# and 15-upstream, the start of the major-version upgrade test) with the headers each is
# compiled against.
setup() {
    install_packages
    local NN wanted=("$@")
    [ $# -gt 0 ] || wanted=("${SUPPORTED_MAJORS[@]}" 15-upstream)
    [[ " ${wanted[*]} " == " 15 " ]] || { install_build_packages; forget_old_versions; }
    for NN in "${wanted[@]}"; do
        [ "$NN" = 15 ] && continue
        obtain_postgres "$NN"
        [ "$NN" = 15-upstream ] || obtain_postgres "$NN" headers
    done
    use_build_headers
    install_pgrx
    use_build_cache
}

# Cargo's build directory, outside the clone and kept from run to run: the dependencies
# (among them pgrx-pg-sys with its bindings of each major's headers) are compiled once per
# machine rather than once per clone. pgrx-pg-sys is not rebuilt when headers change in place
# (a new postgresql-server-dev-15, another source of 17's headers), so the directory records
# the headers it was built against and starts empty when one of them changed. The crate's
# own artifacts are named alike from every checkout and judged fresh by their sources'
# mtimes, so after another checkout's build cargo is made to forget them (their
# fingerprints) and compiles this checkout's sources. A CARGO_TARGET_DIR set already (by the
# caller, or by an earlier setup) is kept.
use_build_cache() {
    [ -z "${CARGO_TARGET_DIR:-}" ] || return 0
    local dir=$PG_CACHE/cargo-target NN now built
    now=$(mktemp)
    for NN in "${SUPPORTED_MAJORS[@]}"; do
        if [ "$NN" = 15 ]; then
            echo "15 $(dpkg-query -W -f='${Version}' postgresql-server-dev-15)"
        elif [ -f "$(pg_headers_prefix "$NN")/.complete" ]; then
            echo "$NN $(grep -v '^at:' "$(pg_headers_prefix "$NN")/.complete" | paste -sd ' ')"
        fi
    done > "$now"
    if [ -f "$dir/headers" ]; then
        while read -r NN built; do
            if ! grep -qxF "$NN $built" "$now" && grep -q "^$NN " "$now"; then
                step "the headers of $NN changed since the build cache was made: emptying $dir"
                rm -rf "$dir"
                break
            fi
        done < "$dir/headers"
    fi
    mkdir -p "$dir" && touch "$dir/headers"
    sort -u "$now" "$dir/headers" | sort -k1,1 -u > "$dir/headers.new"
    mv "$dir/headers.new" "$dir/headers"
    rm -f "$now"
    if [ "$(cat "$dir/checkout" 2>/dev/null)" != "$ROOT" ]; then
        find "$dir" -mindepth 3 -maxdepth 3 -path '*/.fingerprint/*' \
            \( -name 'rate_limiter-*' -o -name 'rate-limiter-*' \) -exec rm -rf {} +
        echo "$ROOT" > "$dir/checkout"
    fi
    export CARGO_TARGET_DIR=$dir
}

# .venv-bench with matplotlib, for the benchmarks' charts (bench/run.sh, bench/app/run.sh).
install_bench_python() {
    venv_of_debian_python "$ROOT/.venv-bench" >/dev/null \
        && "$ROOT/.venv-bench/bin/python" -c "import matplotlib" >/dev/null 2>&1 && return
    step "installing matplotlib into .venv-bench"
    install_debian_packages python3-venv
    rm -rf "$ROOT/.venv-bench"
    "$DEBIAN_PYTHON" -m venv "$ROOT/.venv-bench"
    "$ROOT/.venv-bench/bin/pip" install --quiet --disable-pip-version-check matplotlib==3.9.2
}

# Where build_release lays out the build for PostgreSQL $1.
built_dir() { echo "$ROOT/target/built/pg$1"; }

# The release build for PostgreSQL $1, laid out under built_dir as it installs (cargo pgrx
# package: the library, the control file, the generated install script and the update
# scripts, under the server's own paths); the whole output only on failure. One build serves
# the install (install_built) and the Debian package (scripts/package.sh): the library is a
# cdylib, one file in cargo's directory for every major, so a second build of the same major
# after another's compiles the crate again.
build_release() {
    local NN=$1 out log
    out=$(built_dir "$NN") log=$(mktemp)
    rm -rf "$out"
    (cd "$ROOT" && cargo pgrx package --pg-config "$(pg_bin "$NN")/pg_config" --no-default-features \
        --features "pg$NN" --out-dir "$out") > "$log" 2>&1 || { cat "$log"; rm -f "$log"; return 1; }
    grep -E 'Finished' "$log" || true
    rm -f "$log"
}

# What build_release laid out for PostgreSQL $1, installed into it (`install` replaces the
# library by a new file, which a backend that has the old one mapped keeps), with earlier
# versions' install scripts (so CREATE EXTENSION ... VERSION and updates work) and the SQL-only
# companion extension for a PL/Proxy router.
install_built() {
    local NN=$1 out pg_config
    out=$(built_dir "$NN") pg_config=$(pg_bin "$NN")/pg_config
    as_root install -m 755 "$out$($pg_config --pkglibdir)/rate_limiter.so" "$($pg_config --pkglibdir)/"
    as_root cp "$out$($pg_config --sharedir)"/extension/* "$ROOT"/sql/archive/rate_limiter--*.sql \
        "$ROOT"/proxy/rate_limiter_proxy.control "$ROOT"/proxy/rate_limiter_proxy--*.sql "$($pg_config --sharedir)/extension/"
}

# Build for PostgreSQL $1 (15 by default) and install into it, or into 15-upstream's prefix
# the library built for 15 (one major, one ABI).
build_and_install() {
    local NN=${1:-15} pg_config
    pg_config=$(pg_bin "$NN")/pg_config
    step "building and installing rate_limiter into PostgreSQL $NN"
    if [ "$NN" = 15-upstream ]; then
        as_root install -m 755 "$($PG_CONFIG --pkglibdir)/rate_limiter.so" "$($pg_config --pkglibdir)/"
        as_root cp "$($PG_CONFIG --sharedir)"/extension/rate_limiter*.{control,sql} "$($pg_config --sharedir)/extension/"
        return
    fi
    build_release "$NN"
    install_built "$NN"
}

# The throwaway cluster of PostgreSQL $1 (15 by default), created and started if need be.
start_cluster() {
    local NN=${1:-15} bin dir port
    bin=$(pg_bin "$NN") dir=$(cluster_dir "$NN") port=$(cluster_port "$NN")
    if [ -f "$dir/PG_VERSION" ] && [ "$(cat "$dir/PG_VERSION")" != "$NN" ]; then as_root rm -rf "$dir"; fi
    if [ ! -f "$dir/PG_VERSION" ]; then
        step "creating a throwaway PostgreSQL $NN cluster in $dir"
        as_root mkdir -p "$dir"
        as_root chown postgres: "$dir"
        sudo -u postgres "$bin/initdb" -D "$dir" -A trust -U postgres >/dev/null
    fi
    if ! sudo -u postgres "$bin/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
        step "starting it on 127.0.0.1:$port and $PGHOST"
        # A fresh log for each start: stop_cluster judges this start's life alone.
        if [ -f "$dir/server.log" ]; then sudo -u postgres mv "$dir/server.log" "$dir/server.log.previous"; fi
        sudo -u postgres "$bin/pg_ctl" -D "$dir" -l "$dir/server.log" -w start \
            -o "-p $port -k /tmp -c listen_addresses=127.0.0.1 -c max_connections=200 $CLUSTER_SETTINGS" >/dev/null
    fi
}

# Room for the benchmark's million-row tables in memory, and checkpoints only when asked.
# The library is preloaded for its statistics; the prune worker stays off so that it never
# changes state rows under a test or a benchmark.
CLUSTER_SETTINGS="-c shared_buffers=1GB -c max_wal_size=16GB -c checkpoint_timeout=1h \
    -c max_prepared_transactions=4 -c shared_preload_libraries=rate_limiter -c rate_limiter.prune_interval=0"

# Stops the throwaway cluster of PostgreSQL $1 and fails if its log tells of a fault; with
# $2 = previous, a cluster an earlier run left, whose log is not this run's to judge.
stop_cluster() {
    local NN=${1:-15} dir
    dir=$(cluster_dir "$NN")
    if [ -f "$dir/PG_VERSION" ] && sudo -u postgres "$(pg_bin "$NN")/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
        sudo -u postgres "$(pg_bin "$NN")/pg_ctl" -D "$dir" -w -m fast stop >/dev/null
    fi
    [ "${2:-}" = previous ] || check_server_log "$dir/server.log" "PostgreSQL $NN's throwaway cluster"
}

# The lines of a server log that tell of a fault: a failed assertion (TRAP, at the start of a
# line, then an abort), a process ended by a signal (the postmaster's line for any crashed
# backend or worker), a message of level PANIC (the level, then a colon and two spaces: a
# message that quotes the word is not one). tests/clusters.py looks for the same.
SERVER_LOG_FAULTS='^TRAP: | PANIC:  |\(PID [0-9]+\) was terminated by signal'

# Fails, printing the lines, if server log $1 (of what $2 names) tells of a fault.
check_server_log() {
    local faults
    faults=$(grep -aE "$SERVER_LOG_FAULTS" "$1" 2>/dev/null) || return 0
    printf '%s: its log %s tells of a crash or a failed assertion:\n%s\n' "$2" "$1" "$(head -n 20 <<<"$faults")" >&2
    return 1
}

# Restart so that the current CLUSTER_SETTINGS apply.
restart_cluster() {
    stop_cluster "$@"
    start_cluster "$@"
}

# A fresh database with the extension just installed, so a rebuilt library is picked up.
# On the cluster of PostgreSQL $2 (15 by default).
fresh_database() {
    local port
    port=$(cluster_port "${2:-15}")
    psql -X -q -p "$port" -d postgres -c "DROP DATABASE IF EXISTS $1 WITH (FORCE)" -c "CREATE DATABASE $1"
    psql -X -q -p "$port" -d "$1" -c "CREATE EXTENSION rate_limiter"
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
