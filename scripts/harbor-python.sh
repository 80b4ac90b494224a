#!/usr/bin/env bash
# Harbor (the `harbor` package, pinned in pyproject.toml's `harbor` extra) needs Python >= 3.12;
# Debian bookworm has 3.11. This builds CPython 3.13 from Debian trixie's own source package,
# fetched with apt's ordinary client (its Sources index is signed by the Debian archive key,
# so apt checks every file's hash), installs it under PREFIX, and makes VENV: a 3.13 venv with
# harbor and orchard's SDK (`pip install -e '.[harbor]'`).
#
# Idempotent: each step is skipped when its result is there, so a second run takes a second.
#   scripts/harbor-python.sh [VENV]        (default .venv-harbor, from the repository root)
set -euo pipefail

PREFIX=${ORCHARD_PY313_PREFIX:-/opt/orchard/python3.13}
PY=$PREFIX/bin/python3.13
VENV=${1:-.venv-harbor}
STAMP=$VENV/.installed
BUILD_DEPS="build-essential pkg-config libssl-dev zlib1g-dev libffi-dev libsqlite3-dev \
libbz2-dev liblzma-dev libreadline-dev libncurses-dev uuid-dev libexpat1-dev"

build_python() {
    local missing="" p
    for p in $BUILD_DEPS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
    if [ -n "$missing" ]; then
        [ "$(id -u)" = 0 ] || { echo "missing build packages; run: sudo apt-get install -y$missing" >&2; exit 1; }
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
    fi
    local work
    work=$(mktemp -d /tmp/orchard-py313.XXXXXX)
    # Expanded now, not at exit: by then this function's local is gone, and set -u would fail
    # the whole script on it (and leave the build directory behind).
    trap "rm -rf '$work'" EXIT
    # A deb-src list of its own, so the machine's apt configuration is left as it was.
    mkdir -p "$work/parts" "$work/lists/partial"
    cat >"$work/parts/trixie-src.sources" <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    local apt=(apt-get -qq -o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$work/parts"
               -o "Dir::State::Lists=$work/lists")
    "${apt[@]}" update
    (cd "$work" && "${apt[@]}" source --download-only python3.13)
    tar -C "$work" -xf "$work"/python3.13_*.orig.tar.xz
    (
        cd "$work"/Python-3.13.*/
        # ensurepip stays out of PREFIX; `python3.13 -m venv` still seeds each venv with pip
        # from the bundled wheel.
        ./configure --prefix="$PREFIX" --without-ensurepip >"$work/configure.log"
        make -j"$(nproc)" >"$work/make.log" 2>&1 || { tail -40 "$work/make.log" >&2; exit 1; }
        make install >"$work/install.log" 2>&1 || { tail -40 "$work/install.log" >&2; exit 1; }
    )
    "$PY" -c 'import ssl, sqlite3, zlib, lzma, bz2, ctypes, readline' \
        || { echo "$PY lacks a standard module; see the build's logs" >&2; exit 1; }
}

if [ ! -x "$PY" ]; then
    echo "building CPython 3.13 (Debian trixie's source) into $PREFIX: a few minutes"
    build_python
fi

if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
    [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q -e '.[harbor]'
    touch "$STAMP"
fi
