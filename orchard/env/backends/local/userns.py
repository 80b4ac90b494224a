"""Host uid ranges for sandbox user namespaces.

Each sandbox's root is mapped to the first uid of a range of ``RANGE_SIZE`` host uids that no
other live sandbox on this host holds, so a process that escapes one sandbox is an unprivileged
host user that owns nothing of the host's and nothing of the other sandboxes' (files, signals,
/proc entries). One shared range would be simpler, but then every sandbox would run as the same
host uid and could reach another's processes and files after any kernel-level slip.

Ranges are claimed host-wide, not per data dir, because several orchestrators may share a
host: ``REGISTRY/<slot>`` is a symlink to the sandbox directory holding the claim. A claim whose
directory is gone (an orchestrator's data dir removed while it was down) is stale and is
reused once no slot is free.
"""

from __future__ import annotations

import os
from pathlib import Path

from orchard.env.errors import OrchestratorError
from orchard.env.filelock import exclusive_lock

# 0x70000000 and up: above the ranges useradd hands out in /etc/subuid (100000..600100000) and
# systemd-nspawn's container ranges (up to 0x6FFFFFFF), below the 2^31 that tools reading uids
# as signed ints mishandle, and below systemd's "foreign" range at 0x7FFE0000.
FIRST_UID = 0x70000000
RANGE_SIZE = 65536  # uids 0..65535 inside: root, system users and nobody (65534)
SLOTS = 4094
REGISTRY = Path("/run/orchard/uid-ranges")
UID_FILE = "uid"  # in the sandbox dir: the host uid of its root


class UidRangeError(OrchestratorError, RuntimeError):
    """No uid range is free, or the user namespace could not be made; the message says why."""


class UidRanges:
    """Claims and releases per-sandbox host uid ranges."""

    def __init__(self, registry: Path = REGISTRY) -> None:
        self.registry = registry
        self.registry.mkdir(parents=True, exist_ok=True)

    def claim(self, sandbox_dir: Path) -> int:
        """A free range's first host uid, recorded in ``sandbox_dir/uid``."""
        owner = str(sandbox_dir.resolve())
        with exclusive_lock(self.registry.parent / "uid-ranges.lock"):
            taken = set(os.listdir(self.registry))
            slot = next((s for s in range(SLOTS) if str(s) not in taken), None)
            if slot is None:
                slot = next((s for s in range(SLOTS) if self._stale(s)), None)
            if slot is None:
                raise UidRangeError(
                    f"all {SLOTS} sandbox uid ranges on this host are in use; delete sandboxes "
                    f"(claims are listed in {self.registry})")
            link = self.registry / str(slot)
            link.unlink(missing_ok=True)
            link.symlink_to(owner)
        base = FIRST_UID + slot * RANGE_SIZE
        (sandbox_dir / UID_FILE).write_text(str(base))
        return base

    def release(self, sandbox_dir: Path, base: int) -> None:
        """Drop the claim of a removed sandbox dir whose root was host uid ``base``."""
        link = self.registry / str((base - FIRST_UID) // RANGE_SIZE)
        owner = str(sandbox_dir.resolve())
        with exclusive_lock(self.registry.parent / "uid-ranges.lock"):
            try:
                if os.readlink(link) == owner:
                    link.unlink()
            except FileNotFoundError:
                pass

    def move(self, sandbox_dir: Path, to: Path) -> None:
        """Rename ``sandbox_dir`` to ``to`` (same file system), its claim following it, so the
        range stays held until the renamed dir is removed too. Under the registry's lock: no
        claim sees the range free in between."""
        owner = str(sandbox_dir.resolve())
        base = uid_of(sandbox_dir)
        with exclusive_lock(self.registry.parent / "uid-ranges.lock"):
            os.rename(sandbox_dir, to)
            if base is None:
                return
            link = self.registry / str((base - FIRST_UID) // RANGE_SIZE)
            try:
                if os.readlink(link) != owner:
                    return
            except FileNotFoundError:
                return
            # Under the lock, so no claim sees the slot free in between.
            link.unlink()
            link.symlink_to(to.resolve())

    def drop_stale(self, under: Path) -> list[str]:
        """Drop the claims of dirs below ``under`` that are gone (an orchestrator killed
        between removing a sandbox dir and releasing its range); the targets dropped. Only
        for a data dir no orchestrator is using right now."""
        prefix = str(under.resolve()) + os.sep
        dropped = []
        with exclusive_lock(self.registry.parent / "uid-ranges.lock"):
            for link in self.registry.iterdir():
                try:
                    target = os.readlink(link)
                except OSError:  # not a symlink: nothing of ours
                    continue
                if target.startswith(prefix) and not os.path.isdir(target):
                    link.unlink(missing_ok=True)
                    dropped.append(target)
        return dropped

    def _stale(self, slot: int) -> bool:
        try:
            return not os.path.isdir(os.readlink(self.registry / str(slot)))
        except FileNotFoundError:
            return True


def uid_of(sandbox_dir: Path) -> int | None:
    """The host uid of a sandbox's root, or None for a sandbox without a user namespace."""
    try:
        return int((sandbox_dir / UID_FILE).read_text())
    except (OSError, ValueError):
        return None
