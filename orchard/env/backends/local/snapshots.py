"""Snapshots of local sandboxes: a sandbox's overlay upper dir, kept as a read-only layer.

Everything a sandbox writes lands in its overlay's upper dir (the image is never modified), so
that dir is the sandbox's whole state on disk. A snapshot copies it once; every sandbox started
from the snapshot mounts it as a lower layer under its own empty upper dir, so forks share the
snapshot's files and store only what they change themselves.

Layout: ``<data_dir>/snapshots/<id>/layer`` (the files) and ``meta.json`` (its parent chain
and the sandbox it was taken of). Layer files are owned by in-sandbox ids (root is 0), as in
an image, so each sandbox sees them through its own id-mapped view. On the host that makes
sandbox root's files host root's: so a layer keeps no set-uid or set-gid file (inside a
sandbox those bits grant nothing anyway: no_new_privs), and only host root may enter the dir.

A snapshot of a sandbox that itself started from a snapshot holds only the newer changes and
names its parents. ``<sandbox dir>/snapshots`` lists the chain a sandbox mounts. A snapshot's
files go only when no sandbox and no other snapshot build on them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import threading
from pathlib import Path

from orchard.env.backends.base import SnapshotMissing, SnapshotTooLarge
from orchard.env.backends.local.userns import RANGE_SIZE
from orchard.env.datadir import private_dir

# Each layer is one lower dir of the overlay, and the mount options must fit in a page.
MAX_DEPTH = 64
REFERENCES = "snapshots"  # in a sandbox dir: the chain of snapshots it mounts


class SnapshotLayers:
    """The snapshot layers of one data dir, and who uses them."""

    def __init__(self, root: Path, sandboxes_dir: Path) -> None:
        self.root = root
        self.sandboxes_dir = sandboxes_dir
        private_dir(self.root)
        # Pinning a chain for a new sandbox and removing an unused snapshot must not interleave.
        self._lock = threading.Lock()

    def _meta(self, snapshot_id: str) -> dict[str, object]:
        try:
            return json.loads((self.root / snapshot_id / "meta.json").read_text())
        except (OSError, ValueError):
            raise SnapshotMissing(f"snapshot {snapshot_id!r} has no files on this host (deleted, "
                                  "or taken by another orchestrator); take a new one") from None

    def chain(self, snapshot_id: str) -> list[str]:
        """The snapshot and its parents, newest first."""
        parents = self._meta(snapshot_id).get("parents", [])
        assert isinstance(parents, list)
        return [snapshot_id, *parents]

    def layers(self, chain: list[str]) -> list[Path]:
        return [self.root / sid / "layer" for sid in chain]

    def pin(self, sandbox_dir: Path, snapshot_id: str) -> list[str]:
        """Record that the sandbox mounts the snapshot's chain; returns that chain."""
        with self._lock:
            chain = self.chain(snapshot_id)
            (sandbox_dir / REFERENCES).write_text(json.dumps(chain))
        return chain

    def take(self, snapshot_id: str, upper: Path, base_uid: int, parent: str | None,
             max_bytes: int, source: str) -> int:
        """Copy ``upper`` (owned by host ids from ``base_uid``) into a new layer; returns its
        bytes on disk. The caller keeps the sandbox still meanwhile."""
        chain = self.chain(parent) if parent else []
        if len(chain) >= MAX_DEPTH:
            raise SnapshotTooLarge(
                f"sandbox {source} already builds on {len(chain)} snapshots (the most a "
                f"snapshot may stack is {MAX_DEPTH}); snapshot a sandbox nearer the root")
        written = _apparent_size(upper)
        if written > max_bytes:
            raise SnapshotTooLarge(
                f"sandbox {source} has written {written} bytes over its image, over the "
                f"snapshot limit of {max_bytes} (max_snapshot_bytes); delete files in it or "
                "raise the limit")
        partial = self.root / f".{snapshot_id}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(mode=0o700)
        try:
            # cp keeps hard links, xattrs (overlay's opaque-dir marks) and whiteout devices,
            # and shares blocks where the filesystem has reflinks.
            done = subprocess.run(["cp", "-a", "--reflink=auto", str(upper),
                                   str(partial / "layer")], capture_output=True, text=True)
            if done.returncode != 0:
                raise OSError(f"copying {upper}: {done.stderr.strip()}")
            size = _to_sandbox_ids(partial / "layer", base_uid)
            (partial / "meta.json").write_text(json.dumps(
                {"parents": chain, "source": source}))
            partial.rename(self.root / snapshot_id)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        return size

    def delete(self, snapshot_id: str) -> bool:
        """Remove the snapshot unless a sandbox or another snapshot builds on it."""
        with self._lock:
            if self._in_use(snapshot_id):
                return False
            shutil.rmtree(self.root / snapshot_id, ignore_errors=True)
            return not (self.root / snapshot_id).exists()

    def _in_use(self, snapshot_id: str) -> bool:
        for ref in self.sandboxes_dir.glob(f"*/{REFERENCES}"):
            with contextlib.suppress(OSError, ValueError):
                if snapshot_id in json.loads(ref.read_text()):
                    return True
        for other in self.list() - {snapshot_id}:
            with contextlib.suppress(SnapshotMissing):
                if snapshot_id in self.chain(other):
                    return True
        return False

    def list(self) -> set[str]:
        return {p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")}

    def remove_partials(self) -> None:
        """Copies a crash interrupted are of no use to anyone."""
        for p in self.root.glob(".*.partial"):
            shutil.rmtree(p, ignore_errors=True)


def _apparent_size(top: Path) -> int:
    total = 0
    for dirpath, dirnames, filenames in os.walk(top):
        for name in (*dirnames, *filenames):
            with contextlib.suppress(FileNotFoundError):  # the sandbox may be deleting it
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _to_sandbox_ids(top: Path, base: int) -> int:
    """Shift owners from the sandbox's host ids to in-sandbox ids and drop set-id bits from
    files; returns bytes on disk."""
    used = 0

    def shift(path: str) -> None:
        nonlocal used
        st = os.lstat(path)
        used += st.st_blocks * 512
        uid = st.st_uid - base if base <= st.st_uid < base + RANGE_SIZE else st.st_uid
        gid = st.st_gid - base if base <= st.st_gid < base + RANGE_SIZE else st.st_gid
        setid = st.st_mode & (stat.S_ISUID | stat.S_ISGID)
        if (uid, gid) != (st.st_uid, st.st_gid):
            os.lchown(path, uid, gid)
            # chown clears set-id bits, even for root; a dir's set-gid (new entries take its
            # group) is harmless and kept.
            if setid and stat.S_ISDIR(st.st_mode):
                os.chmod(path, stat.S_IMODE(st.st_mode))
        if setid and not stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode):
            os.chmod(path, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))

    shift(str(top))
    for dirpath, dirnames, filenames in os.walk(top):
        for name in (*dirnames, *filenames):
            shift(os.path.join(dirpath, name))
    return used
