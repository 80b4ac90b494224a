"""What a local orchestrator keeps on the host outside its sandboxes: the key of its agents'
tokens, its cgroup group, and the cleanup after one that died."""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from pathlib import Path

from orchard.env.backends.local.cgroups import CgroupError, CgroupManager
from orchard.env.backends.local.userns import UidRanges, uid_of


def agent_secret(path: Path) -> bytes:
    """The key of this data dir's agent tokens, made once; only host root may read it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return path.read_bytes()
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_hex(32).encode())
    return path.read_bytes()


def cgroup_group(data_dir: Path) -> str:
    """One cgroup group per data dir: the orphan pass deletes every cgroup in its group that
    has no record, so orchestrators sharing a host must not share a group."""
    return f"orchard/{hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]}"


def remove_leftovers(data_dir: Path) -> None:
    """Kill whatever is left in a dead orchestrator's cgroups below ``data_dir``, remove them,
    and give back its sandboxes' uid ranges (before their directories go, which say which)."""
    cgroups = CgroupManager(cgroup_group(data_dir))
    for sid in cgroups.list():
        with contextlib.suppress(CgroupError):
            cgroups.kill(sid)
    cgroups.remove_group()
    ranges = UidRanges()
    for sdir in [*(data_dir / "sandboxes").glob("*"), *(data_dir / "reaping").glob("*")]:
        if (uid := uid_of(sdir)) is not None:
            ranges.release(sdir, uid)

