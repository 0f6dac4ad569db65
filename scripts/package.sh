#!/usr/bin/env bash
# Debian packages for each supported PostgreSQL major NN (or only the majors given:
# `bash scripts/package.sh 17`), laid out as PGDG's are:
#   postgresql-NN-rate-limiter_<version>_<arch>.deb        the library, its control file, the
#       install script and every upgrade and released install script (so CREATE EXTENSION
#       ... VERSION and ALTER EXTENSION UPDATE from any release work); Depends: postgresql-NN
#   postgresql-NN-rate-limiter-proxy_<version>_<arch>.deb  the PL/Proxy router's SQL files;
#       Depends: postgresql-NN, postgresql-NN-plproxy
# Each library is compiled against Debian's own postgresql-server-dev-NN where Debian ships it
# (scripts/servers.sh), as Debian builds extensions for its server. Written to
# target/packages/. dpkg installs a package's files by rename, so installing one
# under a running server never rewrites a library a backend has mapped. Safe to run again.
# `--prebuilt` packages the release builds already laid out by build_release (lib.sh), as the
# test command does with the build it installed and tests.
source "$(dirname "$0")/lib.sh"
PREBUILT=""
if [ "${1:-}" = --prebuilt ]; then PREBUILT=yes; shift; fi
MAJORS=("${@:-${SUPPORTED_MAJORS[@]}}")
for NN in "${MAJORS[@]}"; do
    [[ " ${SUPPORTED_MAJORS[*]} " == *" $NN "* ]] || { echo "not a supported major: $NN (${SUPPORTED_MAJORS[*]})" >&2; exit 2; }
done
setup "${MAJORS[@]}"
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -n 1)
PROXY_VERSION=$(sed -n "s/^default_version = '\(.*\)'$/\1/p" "$ROOT/proxy/rate_limiter_proxy.control")
ARCH=$(dpkg --print-architecture)
MAINTAINER=$(git -C "$ROOT" log -1 --format='%an <%ae>' 2>/dev/null || echo "rate_limiter maintainers")
OUT=$ROOT/target/packages
mkdir -p "$OUT"

# Modes as Debian policy has them, whatever the builder's umask: directories and the library
# 0755, other files 0644 (the owner is root:root through --root-owner-group).
build_deb() { # staged-root out.deb
    find "$1" -type d -exec chmod 0755 {} +
    find "$1" -type f -exec chmod 0644 {} +
    find "$1" -type f -name '*.so' -exec chmod 0755 {} +
    dpkg-deb --root-owner-group --build "$1" "$2" >/dev/null
}

control() { # package version depends description
    cat <<CONTROL
Package: $1
Version: $2
Architecture: $ARCH
Maintainer: $MAINTAINER
Section: database
Priority: optional
Depends: $3
Description: $4
CONTROL
}

# Debian's layout for PostgreSQL NN, whatever prefix the NN built against has (17's and 18's
# here are built into a cache, see scripts/servers.sh).
debian_lib() { echo "/usr/lib/postgresql/$1/lib"; }
debian_extension() { echo "/usr/share/postgresql/$1/extension"; }

for NN in "${MAJORS[@]}"; do
    pg_config=$(pg_bin "$NN")/pg_config
    stage=$(mktemp -d)
    step "postgresql-$NN-rate-limiter $VERSION"
    [ -n "$PREBUILT" ] || build_release "$NN"
    built=$(built_dir "$NN")
    built_extension=$built$($pg_config --sharedir)/extension
    test -f "$built_extension/rate_limiter--$VERSION.sql"
    extension=$stage/main$(debian_extension "$NN")
    mkdir -p "$extension" "$stage/main$(debian_lib "$NN")"
    cp "$built_extension"/* "$ROOT"/sql/archive/rate_limiter--*.sql "$extension/"
    cp "$built$($pg_config --pkglibdir)/rate_limiter.so" "$stage/main$(debian_lib "$NN")/"
    mkdir -p "$stage/main/DEBIAN"
    control "postgresql-$NN-rate-limiter" "$VERSION" "postgresql-$NN" \
        "transactional rate limits inside PostgreSQL $NN
 rate_limiter keeps the state of token buckets and fixed, sliding and rolling
 windows in one small row per (name, key), taken inside the caller's transaction." \
        > "$stage/main/DEBIAN/control"
    build_deb "$stage/main" "$OUT/postgresql-$NN-rate-limiter_${VERSION}_$ARCH.deb"

    step "postgresql-$NN-rate-limiter-proxy $PROXY_VERSION"
    mkdir -p "$stage/proxy$(debian_extension "$NN")" "$stage/proxy/DEBIAN"
    cp "$ROOT"/proxy/rate_limiter_proxy.control "$ROOT"/proxy/rate_limiter_proxy--*.sql \
        "$stage/proxy$(debian_extension "$NN")/"
    control "postgresql-$NN-rate-limiter-proxy" "$PROXY_VERSION" "postgresql-$NN, postgresql-$NN-plproxy" \
        "PL/Proxy router for rate_limiter on PostgreSQL $NN
 rate_limiter_proxy routes rate_limiter's calls to the partition of their key." \
        > "$stage/proxy/DEBIAN/control"
    build_deb "$stage/proxy" "$OUT/postgresql-$NN-rate-limiter-proxy_${PROXY_VERSION}_$ARCH.deb"
    rm -rf "$stage"
done
ls "$OUT"
