"""An exclusive lock on a lock file, shared by processes and by threads of one process."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    # flock (unlike POSIX record locks) is held per open file description, so it also
    # serialises threads of one process, each of which opens the file itself. The lock file is
    # never removed: unlinking it could let two callers lock different inodes.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
