#!/usr/bin/env bash
# A release tool, not a tier of the tests: the README's two commands on a minimal Debian 12,
# as a new user has it. Makes one with `debootstrap --variant=minbase bookworm` in DIR
# (/var/tmp/rate_limiter_bare by default, removed first), installs there only the README's
# preconditions (Rust, PostgreSQL 15's server, and what a minimal Debian lacks to fetch and
# clone), clones the project's HEAD into it, runs `bash scripts/demo.sh` and then
# `bash scripts/test.sh` inside with every cache empty, and prints each command's time.
# Rust is this machine's toolchain copied in, as rustup would have installed it. The chroot
# shares this machine's network: nothing else may use the test command's ports meanwhile.
# Run as root: bash scripts/bare-debian.sh [DIR]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${1:-/var/tmp/rate_limiter_bare}
MIRROR=${RATE_LIMITER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# The README's one precondition line, as Debian packages (rustup's Rust needs gcc to link).
PRECONDITIONS=(ca-certificates curl git sudo python3 gcc libc6-dev postgresql-15)
[ "$(id -u)" = 0 ] || { echo "run as root: debootstrap and chroot need it" >&2; exit 2; }

# Stops what the commands left running inside (their clusters), then unmounts.
unmount() {
    local m pid
    for pid in $(ls /proc | grep -E '^[0-9]+$'); do
        [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$DIR" ] && kill -9 "$pid" 2>/dev/null
    done
    for m in dev sys proc; do
        mountpoint -q "$DIR/$m" && umount -R -l "$DIR/$m"
    done
    return 0
}
unmount
rm -rf "$DIR"
command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
echo "==> debootstrap --variant=minbase bookworm $DIR"
debootstrap --variant=minbase bookworm "$DIR" "$MIRROR" >/dev/null
trap unmount EXIT
mount -t proc proc "$DIR/proc"
# This machine's /dev and /sys, whose mounts inside do not propagate back out.
for m in dev sys; do
    mount --rbind "/$m" "$DIR/$m"
    mount --make-rslave "$DIR/$m"
done
# This machine's network: its resolver, and the CA certificates its proxy signs with, with the
# variables that point each tool at them.
cp /etc/resolv.conf /etc/hosts "$DIR/etc/"
mkdir -p "$DIR/usr/local/share/ca-certificates"
cp -r /usr/local/share/ca-certificates/. "$DIR/usr/local/share/ca-certificates/"
CA=/etc/ssl/certs/ca-certificates.crt
NETWORK=(SSL_CERT_FILE=$CA CURL_CA_BUNDLE=$CA GIT_SSL_CAINFO=$CA PIP_CERT=$CA REQUESTS_CA_BUNDLE=$CA NODE_EXTRA_CA_CERTS=$CA)
# No service starts inside (postgresql-15's own cluster, PgBouncer, the exporter).
printf '#!/bin/sh\nexit 101\n' > "$DIR/usr/sbin/policy-rc.d"
chmod 755 "$DIR/usr/sbin/policy-rc.d"

inside() {
    chroot "$DIR" env -i HOME=/root LANG=C.UTF-8 TERM=dumb "${NETWORK[@]}" \
        PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
}

echo "==> the preconditions: ${PRECONDITIONS[*]}, Rust"
inside apt-get update -qq
inside env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${PRECONDITIONS[@]}" >/dev/null
inside update-ca-certificates >/dev/null
toolchain=$(rustup default | cut -d' ' -f1)
mkdir -p "$DIR/root/.rustup/toolchains" "$DIR/root/.cargo/bin"
cp -a "$HOME/.rustup/settings.toml" "$DIR/root/.rustup/"
cp -a "$HOME/.rustup/toolchains/$toolchain" "$DIR/root/.rustup/toolchains/"
cp -a "$HOME/.cargo/bin/rustup" "$DIR/root/.cargo/bin/"
for tool in cargo rustc rustdoc cargo-clippy clippy-driver cargo-fmt rustfmt; do
    ln -s rustup "$DIR/root/.cargo/bin/$tool"
done
git clone -q "$ROOT" "$DIR/root/rate_limiter"
echo "    at $(git -C "$DIR/root/rate_limiter" log -1 --format='%h %s' | cut -c1-100)"

status=0
times=()
for command in demo test; do
    echo "==> bash scripts/$command.sh"
    started=$SECONDS
    inside bash -c "cd /root/rate_limiter && bash scripts/$command.sh" || status=$?
    took=$((SECONDS - started))
    times+=("$(printf 'bash scripts/%s.sh: %d min %02d s' "$command" $((took / 60)) $((took % 60)))")
    [ $status = 0 ] || { times+=("  failed (exit $status)"); break; }
done
echo "==> on a bare Debian 12 ($DIR)"
printf '%s\n' "${times[@]}"
exit $status
