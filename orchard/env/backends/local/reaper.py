"""The local backend's reaper: what a delete leaves to do once the sandbox is unreachable.

A delete SIGKILLs every process of the sandbox without waiting for them to exit, and renames
its dir to ``<data_dir>/reaping/<id>~<nonce>`` (``Reaper.take``): from then on nothing can
reach it, ``list()`` no longer reports it and its id is free. The reaper then, on threads of
its own that no create ever waits on, except a create of that same id:

1. waits for the sandbox's cgroups to empty and removes them, then renames the entry to
   ``<id>~<nonce>~files``: the id's cgroup name is free again, and a create of the same id
   (which waits for exactly this step, ``settled``) may go on;
2. waits for our own children of the sandbox (slirp4netns), so none stays a zombie;
3. waits for the sandbox's loop devices (a ``disk`` quota's) to detach: their mount lived in
   the sandbox's mount namespace, which went with its last process, and they are autoclear;
4. detaches anything mounted below the entry on the host (today's launch mounts nothing
   there; this keeps the removal from ever descending into a mount), removes the entry and
   gives its uid range back (the claim followed the entry through each rename).

Each step is idempotent, and the entry's name says which steps are done, so an orchestrator
killed mid-reap loses nothing: the next one on the data dir reaps what ``reaping/`` holds when
it starts (``resume``), before any create.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import glob
import logging
import os
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from pathlib import Path

from orchard.env.backends.local.cgroupfs import unescape_mountinfo
from orchard.env.backends.local.cgroups import CgroupManager
from orchard.env.backends.local.quota import DISK_IMAGE
from orchard.env.backends.local.userns import UidRanges, uid_of
from orchard.env.datadir import private_dir
from orchard.env.errors import OrchestratorError

log = logging.getLogger("orchard.env")
SEP = "~"  # never in a sandbox id (cgroups.py allows [A-Za-z0-9_.-])
FILES = "files"  # the entry's last part once its cgroups are gone
_MNT_DETACH = 2
_POLL_S = 0.02


class ReapError(OrchestratorError, RuntimeError):
    """Part of a deleted sandbox could not be removed; it stays in reaping/ for a retry."""


class Reaper:
    """Finishes deletes in the background; see the module docstring for the steps."""

    def __init__(self, root: Path, cgroups: CgroupManager, uid_ranges: UidRanges,
                 workers: int = 32, kill_timeout: float = 30.0,
                 detach_timeout: float = 10.0) -> None:
        self.root = private_dir(root)
        self.cgroups = cgroups
        self.uid_ranges = uid_ranges
        self.kill_timeout = kill_timeout
        self.detach_timeout = detach_timeout
        # Reaps mostly sleep (processes leaving their cgroups, loop devices detaching) or
        # unlink files: a pool of their own keeps them off the default executor.
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="orchard-reaper")
        self._lock = threading.Lock()
        self._reaps: set[Future[None]] = set()
        # Per sandbox id under reap, the latest reap's first step: a create of that id (and
        # a later reap of it) waits for that step, never for the files.
        self._cgroups_gone: dict[str, Future[None]] = {}

    def take(self, sandbox_id: str, sandbox_dir: Path,
             children: Sequence[subprocess.Popen[bytes]] = ()) -> None:
        """Moves ``sandbox_dir`` (if it is there) under reaping/ and starts its reap. The
        sandbox's processes must already be SIGKILLed. Blocking: one rename."""
        entry = None
        if sandbox_dir.exists():
            entry = self.root / f"{sandbox_id}{SEP}{secrets.token_hex(6)}"
            self.uid_ranges.move(sandbox_dir, entry)
        else:
            with self._lock:
                gone = self._cgroups_gone.get(sandbox_id)
            if gone is not None and not gone.done():  # deleted again: that reap kills it all
                return
        self._submit(sandbox_id, entry, children)

    def resume(self) -> None:
        """Reaps what an orchestrator killed mid-reap left, and drops the uid claims of dirs
        it removed without releasing them. Only before this data dir's first create."""
        for dropped in self.uid_ranges.drop_stale(self.root.parent):
            log.info("released the uid range of %s, removed by an orchestrator that died", dropped)
        for entry in sorted(self.root.iterdir()):
            log.info("finishing the removal of %s, left by an orchestrator that died", entry)
            self._submit(entry.name.split(SEP)[0], entry, ())

    async def settled(self, sandbox_id: str) -> None:
        """Returns once no reap holds ``sandbox_id``'s cgroup name. A failed reap does not
        raise here: the cgroup left in place makes the create say so."""
        with self._lock:
            gone = self._cgroups_gone.get(sandbox_id)
        if gone is not None:
            with contextlib.suppress(Exception):
                await asyncio.wrap_future(gone)

    async def close(self, timeout: float = 60.0) -> None:
        """Waits up to ``timeout`` for the reaps under way; what is left stays in reaping/
        for the next start."""
        with self._lock:
            reaps = list(self._reaps)
        if reaps:
            await asyncio.to_thread(wait_futures, reaps, timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- the reap ------------------------------------------------------------------------

    def _submit(self, sandbox_id: str, entry: Path | None,
                children: Sequence[subprocess.Popen[bytes]]) -> None:
        gone: Future[None] = Future()
        with self._lock:
            # Two reaps of one id (deleted, created again, deleted) share the cgroup name: the
            # later one's kill waits for the earlier one's (their files go side by side).
            previous = self._cgroups_gone.get(sandbox_id)
            reap = self._pool.submit(self._reap, sandbox_id, entry, children, previous, gone)
            self._reaps.add(reap)
            self._cgroups_gone[sandbox_id] = gone
        reap.add_done_callback(lambda f: self._done(sandbox_id, f, gone))

    def _done(self, sandbox_id: str, reap: Future[None], gone: Future[None]) -> None:
        with self._lock:
            self._reaps.discard(reap)
            if self._cgroups_gone.get(sandbox_id) is gone:
                del self._cgroups_gone[sandbox_id]
        if not gone.done():  # cancelled by close() before it ran
            gone.cancel()
        if not reap.cancelled() and (e := reap.exception()) is not None:
            log.error("removing what is left of sandbox %s failed: %s; it stays in %s and "
                      "the next start of this orchestrator retries", sandbox_id, e, self.root)

    def _reap(self, sandbox_id: str, entry: Path | None,
              children: Sequence[subprocess.Popen[bytes]], previous: Future[None] | None,
              gone: Future[None]) -> None:
        if previous is not None:
            wait_futures([previous])
        try:
            if entry is None or not entry.name.endswith(SEP + FILES):
                self.cgroups.kill(sandbox_id, self.kill_timeout)
                if entry is not None:
                    moved = entry.with_name(entry.name + SEP + FILES)
                    self.uid_ranges.move(entry, moved)
                    entry = moved
        except BaseException as e:
            gone.set_exception(e)
            raise
        gone.set_result(None)
        for child in children:
            try:
                child.wait(self.kill_timeout)
            except subprocess.TimeoutExpired:
                log.warning("pid %d of sandbox %s outlived SIGKILL by %ss", child.pid,
                            sandbox_id, self.kill_timeout)
        if entry is not None:
            self._remove(entry)

    def _remove(self, entry: Path) -> None:
        base = uid_of(entry)
        deadline = time.monotonic() + self.detach_timeout
        # Only a disk quota's image backs a loop device.
        while (entry / DISK_IMAGE).exists() and (loops := _loop_devices_under(entry)):
            if time.monotonic() > deadline:
                log.warning("loop devices %s still back files in %s; removing it anyway (they "
                            "are autoclear and go with their last user)", loops, entry)
                break
            time.sleep(_POLL_S)
        _detach_mounts_under(entry)
        shutil.rmtree(entry, ignore_errors=True)
        if entry.exists():
            raise ReapError(f"could not remove {entry}; remove it by hand")
        if base is not None:  # only now: files owned by the range were in the dir
            self.uid_ranges.release(entry, base)


def _loop_devices_under(path: Path) -> list[str]:
    """Attached loop devices whose backing file lies below ``path``."""
    prefix = str(path.resolve()) + os.sep
    found = []
    for backing in glob.glob("/sys/block/loop*/loop/backing_file"):
        with contextlib.suppress(OSError):  # detached while we looked
            if Path(backing).read_text().startswith(prefix):
                found.append(backing.split("/")[3])
    return found


def _detach_mounts_under(path: Path) -> None:
    """Lazily unmounts whatever this mount namespace has mounted at or below ``path``,
    deepest first, so removing ``path`` never deletes files of another file system."""
    prefix = str(path.resolve())
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        points = [unescape_mountinfo(line.split()[4]) for line in f]
    libc = ctypes.CDLL(None, use_errno=True)
    for point in sorted((p for p in points if p == prefix or p.startswith(prefix + os.sep)),
                        key=len, reverse=True):
        if libc.umount2(os.fsencode(point), _MNT_DETACH) != 0:
            err = ctypes.get_errno()
            if err not in (errno.EINVAL, errno.ENOENT):  # gone meanwhile
                raise ReapError(f"cannot unmount {point}: {os.strerror(err)}")

