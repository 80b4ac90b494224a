"""One orchestrator per data dir, and private data dirs for embedded orchestrators.

Two orchestrators on one data dir would each reconcile away the other's sandboxes (each sees
the other's as orphans), so the second one must refuse to start. The lock is a ``flock`` on
``<data_dir>/orchestrator.lock``: the kernel drops it when its holder dies, even by SIGKILL, so
a crashed orchestrator never blocks its successor.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from pathlib import Path

from orchard.env.errors import OrchestratorError

LOCK_NAME = "orchestrator.lock"
PRIVATE_PREFIX = "orchard-local-"


class DataDirInUse(OrchestratorError, RuntimeError):
    """Another live orchestrator holds the data dir."""


class DataDirLock:
    """An exclusive, non-blocking lock on a data dir, held until ``release`` or process exit."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> DataDirLock:
        # The state, the images and the snapshots below are host root's business only.
        private_dir(self.data_dir)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DataDirInUse(
                f"data dir {self.data_dir} is in use by another orchestrator (pid {holder}; "
                f"lock {self.path}). Stop that one, or give this one a data dir of its own "
                "(--data-dir DIR, or data_dir=... in Python; SandboxClient.local() makes a "
                "private one when none is given)") from None
        # The pid is only for the error message: the lock itself is the flock.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> Path:
    """Write ``path`` whole or not at all: a reader never sees half of it, and a failure leaves
    the old file (or none) and no temporary beside it. No fsync: every file written this way
    can be made again, and a sandbox create writes one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def private_dir(path: Path) -> Path:
    """``path`` as a directory only its owner may enter (made if missing, else narrowed)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def private_data_dir() -> Path:
    """A fresh data dir for one embedded orchestrator; short, for AF_UNIX socket paths."""
    return Path(tempfile.mkdtemp(prefix=PRIVATE_PREFIX))


def stale_private_data_dirs() -> list[Path]:
    """Private data dirs whose orchestrator died without removing them (e.g. SIGKILL).

    A dir is stale when nobody holds its lock. Holding it here while deciding keeps a
    starting orchestrator from being mistaken for a dead one.
    """
    stale = []
    for d in Path(tempfile.gettempdir()).glob(f"{PRIVATE_PREFIX}*"):
        if not d.is_dir() or not (d / LOCK_NAME).exists():
            continue  # just made, and not locked yet: its owner is alive
        lock = DataDirLock(d)
        with contextlib.suppress(DataDirInUse, OSError):
            lock.acquire()
            stale.append(d)
            lock.release()
    return stale


def remove_private_data_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
