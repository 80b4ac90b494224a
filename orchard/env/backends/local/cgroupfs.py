"""The cgroup file system as files: its mounts, reading and writing its control files."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path


def unescape_mountinfo(field: str) -> str:
    # mountinfo octal-escapes space, tab, newline and backslash in paths.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def cgroup_mounts() -> Iterator[tuple[Path, str, set[str]]]:
    """(mount point, fstype, super options) of every cgroup/cgroup2 mount in our namespace."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            fstype = fields[sep + 1]
            if fstype in ("cgroup", "cgroup2"):
                opts = set(fields[sep + 3].split(",")) if len(fields) > sep + 3 else set()
                yield Path(unescape_mountinfo(fields[4])), fstype, opts


def read_file(path: Path) -> str | None:
    """A control file's text, or None when its cgroup is gone."""
    try:
        return path.read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError as e:
        # A cgroup v1 directory removed between open() and read() answers ENODEV.
        if e.errno == errno.ENODEV:
            return None
        raise


def write_file(path: Path, value: str) -> None:
    # cgroupfs reports errors on write(), which open().write() + buffering could hide until
    # close(); a single unbuffered os.write surfaces the errno directly.
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def keyed(text: str | None, key: str) -> int | None:
    """Value of ``key`` in a flat-keyed cgroup file such as memory.events."""
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return None


def kill_all(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
