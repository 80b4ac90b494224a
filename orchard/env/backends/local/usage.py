"""What a local sandbox uses now: CPU time, memory and processes from its cgroups, and the
disk its writes take."""

from __future__ import annotations

import os
from pathlib import Path

from orchard.env.backends.local import quota
from orchard.env.backends.local.cgroups import CgroupManager
from orchard.env.schema import SandboxUsage

# A sandbox can make millions of files; the walk stops here and reports what it counted.
MAX_ENTRIES = 200_000


def measure(cgroups: CgroupManager, sdir: Path, sandbox_id: str) -> SandboxUsage:
    return SandboxUsage(sandbox_id=sandbox_id, cpu_seconds=cgroups.cpu_seconds(sandbox_id),
                        memory_bytes=cgroups.memory_usage(sandbox_id),
                        pids=len(cgroups.pids(sandbox_id)), disk_bytes=disk_bytes(sdir))


def disk_bytes(sdir: Path) -> int | None:
    """Blocks allocated to the sandbox's writes: its quota file system's image, else its
    upper directory (counted as du counts, links not followed)."""
    try:
        image = (sdir / quota.DISK_IMAGE).lstat()
        return image.st_blocks * 512
    except FileNotFoundError:
        pass
    total, seen, stack = 0, 0, [sdir / "upper"]
    while stack and seen < MAX_ENTRIES:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    seen += 1
                    st = entry.stat(follow_symlinks=False)
                    total += st.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
        except OSError:
            continue  # removed while we looked: it no longer takes room
    return total
