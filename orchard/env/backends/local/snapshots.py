"""Snapshots of local sandboxes: a sandbox's overlay upper dir, kept as a read-only layer
(and, for a live snapshot, its processes' CRIU images beside it).

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

from orchard.env.backends.base import (
    BackendError,
    CheckpointFailed,
    SnapshotMade,
    SnapshotMissing,
    SnapshotTooLarge,
)
from orchard.env.backends.local import quota
from orchard.env.backends.local.cgroups import CgroupError, CgroupManager
from orchard.env.backends.local.checkpoint import Checkpoints
from orchard.env.backends.local.launch import agent_pid, launcher_root
from orchard.env.backends.local.userns import RANGE_SIZE, uid_of
from orchard.env.datadir import private_dir

# Each layer is one lower dir of the overlay, and the mount options must fit in a page.
MAX_DEPTH = 64
REFERENCES = "snapshots"  # in a sandbox dir: the chain of snapshots it mounts
MEMORY = "memory"  # in a snapshot dir: a live snapshot's process images


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

    def memory(self, snapshot_id: str) -> Path | None:
        """The snapshot's process images, if it is a live one."""
        path = self.root / snapshot_id / MEMORY
        return path if path.is_dir() else None

    def layers(self, chain: list[str]) -> list[Path]:
        return [self.root / sid / "layer" for sid in chain]

    def pin(self, sandbox_dir: Path, snapshot_id: str) -> list[str]:
        """Record that the sandbox mounts the snapshot's chain; returns that chain."""
        with self._lock:
            chain = self.chain(snapshot_id)
            (sandbox_dir / REFERENCES).write_text(json.dumps(chain))
        return chain

    def take(self, snapshot_id: str, upper: Path, base_uid: int, parent: str | None,
             max_bytes: int, source: str, memory: Path | None = None) -> int:
        """Copy ``upper`` (owned by host ids from ``base_uid``) into a new layer; returns its
        bytes on disk. The caller keeps the sandbox still meanwhile. ``memory``: a dir of
        process images (``checkpoint.py``) moved in beside the layer."""
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
            if memory:
                memory.rename(partial / MEMORY)
                (partial / MEMORY).chmod(0o755)
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


class SnapshotTaker:
    """Takes a running sandbox's snapshot: its files into a layer, and for a live one its
    processes (``checkpoint.py``) beside them."""

    def __init__(self, layers: SnapshotLayers, checkpoints: Checkpoints,
                 cgroups: CgroupManager) -> None:
        self.layers, self.checkpoints, self.cgroups = layers, checkpoints, cgroups

    def take(self, sandbox_id: str, sdir: Path, snapshot_id: str, parent: str | None,
             max_bytes: int, memory: bool) -> SnapshotMade:
        base = uid_of(sdir)
        if base is None or not self.cgroups.pids(sandbox_id):
            raise BackendError(f"sandbox {sandbox_id} is not running on this host; only a "
                               "running or paused sandbox can be snapshotted")
        paused = self.cgroups.frozen(sandbox_id)
        if memory and paused:
            raise CheckpointFailed(f"sandbox {sandbox_id} is paused, and its frozen processes "
                                   "cannot be checkpointed; resume it first")
        # A live snapshot checkpoints every process but the agent and leaves them stopped, so
        # files and memory are of one moment; else the cgroup is frozen for the copy.
        image = (self.checkpoints.dump(sandbox_id, agent_pid(sdir), sdir / "checkpoint")
                 if memory else None)
        freeze = not paused and image is None
        try:
            if freeze:
                self.cgroups.freeze(sandbox_id)
            # A disk-quota sandbox's upper dir is on a file system mounted only in its
            # launcher's mount namespace.
            upper = (launcher_root(sdir, self.cgroups.pids(sandbox_id)) / quota.DISK_DIR
                     / "upper" if (sdir / quota.DISK_IMAGE).exists() else sdir / "upper")
            size = self.layers.take(snapshot_id, upper, base, parent, max_bytes, sandbox_id,
                                    memory=image and sdir / "checkpoint")
        except CgroupError as e:
            raise BackendError(f"sandbox {sandbox_id}: {e}") from None
        finally:
            if freeze:
                self.cgroups.thaw(sandbox_id)
            if image:
                self.checkpoints.cont(image.stopped)
                shutil.rmtree(sdir / "checkpoint", ignore_errors=True)
        return SnapshotMade(snapshot_id=snapshot_id, size_bytes=size,
                            memory_bytes=image and image.bytes,
                            processes=image.processes if image else [])


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
