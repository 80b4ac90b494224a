"""Per-sandbox disk quota: the overlay's upper and work dirs on a loop-mounted sparse ext4.

Only a sandbox created with ``disk`` gets one. Its ``<sandbox>/disk.img`` is a sparse file
of that size holding an ext4 made here; the launcher loop-mounts it on ``<sandbox>/stage/disk``
(see ``jail.loop_mount``) inside the sandbox's launch mount namespace, so the mount
(and, through the loop device's autoclear flag, the loop device) goes away with the sandbox's
last process, even when the orchestrator was killed. Writes past the size fail with ENOSPC
inside the sandbox.

The host root filesystem here is ext4 without project quotas (they need a re-format with
``-O quota,project``), and tmpfs would count against memory, so a loop file is the one way
that works on any host with loop devices.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from orchard.env.backends.local.cgroups import LimitResult
from orchard.env.errors import OrchestratorError
from orchard.env.quantities import parse_memory

DISK_DIR = "disk"  # the mount point; holds upper/ and work/ once mounted
DISK_IMAGE = "disk.img"


class QuotaError(OrchestratorError, RuntimeError):
    """The disk could not be made; the message says why."""


def unavailable() -> str | None:
    """Why this host cannot enforce a disk quota, or None if it can."""
    if shutil.which("mkfs.ext4") is None:
        return "mkfs.ext4 is not installed (apt-get install e2fsprogs)"
    if not Path("/dev/loop-control").exists():
        return "no loop devices on this host (/dev/loop-control is missing; modprobe loop)"
    return None


def make_disk(sandbox_dir: Path, requested: str) -> LimitResult:
    """Makes ``disk.img`` from ``sandbox_dir/disk`` (its upper/ and work/, already owned as
    they must be inside). Blocking: mkfs takes ~20-35 ms for 10Gi."""
    reason = unavailable()
    if reason is not None:
        return LimitResult(requested, False, f"not enforced: {reason}")
    size = parse_memory(requested)  # the service checked it (at least 16Mi)
    image = sandbox_dir / DISK_IMAGE
    with open(image, "wb") as f:
        f.truncate(size)
    # No journal: the file system lives and dies with one sandbox. -d copies the upper and
    # work dirs in, owners included; -m 0: no blocks reserved for root.
    try:
        subprocess.run(
            ["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
             "-E", "lazy_itable_init=1,root_owner=0:0", "-d", str(sandbox_dir / DISK_DIR),
             str(image)],
            check=True, capture_output=True, timeout=60)
    except subprocess.CalledProcessError as e:
        raise QuotaError(f"mkfs.ext4 of {image} failed: {e.stderr.decode(errors='replace')}"
                         ) from None
    return LimitResult(requested, True, f"ext4 on a loop device: {size} bytes "
                                        f"({image}, sparse)")


def not_requested() -> LimitResult:
    reason = unavailable()
    note = f"; {reason}" if reason else " (loop-mounted ext4 available)"
    return LimitResult(None, False, f"no disk limit requested{note}")
