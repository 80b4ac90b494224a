#!/usr/bin/env bash
# Builds CRIU from Debian's source tarball into DEST (the binary alone: orchard bundles its
# libraries itself). Debian bookworm's criu 3.17 cannot checkpoint on kernels >= 6.x with the
# newer vDSO layout (checkpoint-restore/criu#2532); 4.x can. Pinned by version and checksum.
set -euo pipefail
dest=${1:?usage: build-criu.sh DEST}
version=4.2.1
sha256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
url=http://deb.debian.org/debian/pool/main/c/criu/criu_${version}.orig.tar.xz
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "building CRIU $version into $dest (about 4 minutes on 2 cores)"
curl -fsSL -o "$work/criu.tar.xz" "$url"
echo "$sha256  $work/criu.tar.xz" | sha256sum -c --quiet
tar -xf "$work/criu.tar.xz" -C "$work"
make -s -C "$work/criu-$version" -j"$(nproc)" criu >"$work/build.log" 2>&1 \
  || { tail -30 "$work/build.log"; exit 1; }
mkdir -p "$(dirname "$dest")"
install -m 0755 "$work/criu-$version/criu/criu" "$dest"
"$dest" --version | head -1
