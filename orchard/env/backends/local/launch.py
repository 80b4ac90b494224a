"""What a local sandbox's launch mounts (the zygote's launcher does it, see ``jail.py``), the
host skeleton of a "host" sandbox, and the launcher kept for later (a disk-quota sandbox's
upper dir is in its mount namespace)."""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchard.env.agent.browser_bundle import BROWSER_MOUNT
from orchard.env.agent.bundle import BUNDLE_MOUNT
from orchard.env.backends.base import BackendError, SandboxSpec
from orchard.env.backends.local import network, quota
from orchard.env.backends.local.images import ResolvedImage
from orchard.env.backends.local.userns import RANGE_SIZE

CTL_MOUNT = "/.orchard/ctl"
USER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Host entries a "host" sandbox sees read-only; everything else (/root, /home, /tmp, /var, the
# orchestrator's state) is absent, and /workspace, /tmp, /home are private and writable.
HOST_VIEW = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt")
HOST_SECRETS = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-",
                "/etc/sudoers", "/etc/ssl/private")


@dataclass(frozen=True)
class Launcher:
    """What every launch of one data dir shares: the bundle, the browser dir (see
    ``browser_bundle.py``), the host skeleton. ``request`` says what the zygote's launcher
    mounts (see ``jail.py``)."""

    bundle: Path
    browser: Path
    host_skeleton: Path

    @classmethod
    def prepare(cls, data_dir: Path, bundle: Path, browser: Path) -> Launcher:
        return cls(bundle, browser, make_host_skeleton(data_dir / "host-skeleton"))

    def request(self, spec: SandboxSpec, image: ResolvedImage, sdir: Path, uid: int,
                lowers: list[Path], disk: bool) -> dict[str, Any]:
        """The launch of one sandbox, for the zygote; the agent's part is the caller's."""
        host_view: list[tuple[str, str]] = []
        masks: list[tuple[str, str]] = []
        if image.kind == "host":
            host_view = [(f"/{name}", name) for name in HOST_VIEW
                         if Path(f"/{name}").is_dir() and not Path(f"/{name}").is_symlink()]
            masks = [(secret.lstrip("/"), "dir" if os.path.isdir(secret) else "file")
                     for secret in HOST_SECRETS if os.path.lexists(secret)]
            masks += [(str(key).lstrip("/"), "file")
                      for key in Path("/etc/ssh").glob("ssh_host_*_key")]
        binds = [(str(self.bundle), BUNDLE_MOUNT.lstrip("/"), "dir"),
                 (str(self.browser), BROWSER_MOUNT.lstrip("/"), "dir"),
                 # Read-only: the host connects to the agent's socket here and binds the model
                 # relay's, so sandbox code must not replace either (or plant a link).
                 (str(sdir / "ctl"), CTL_MOUNT.lstrip("/"), "dir")]
        # Every sandbox has a network namespace; a networked one gets its link and rules
        # once the agent is up, and a resolver that the rules let through (with an
        # allow-list, its own, which answers for the listed names only).
        if not spec.block_network:
            (sdir / "ctl" / "resolv.conf").write_text(network.resolv_conf(spec.egress))
            binds.append((str(sdir / "ctl" / "resolv.conf"), "etc/resolv.conf", "file"))
        return {
            "uid": uid, "count": RANGE_SIZE, "lowers": [str(p) for p in lowers],
            "stage": str(sdir / "stage"), "upper": str(sdir / "upper"),
            "work": str(sdir / "work"), "disk": str(sdir / quota.DISK_IMAGE) if disk else None,
            "host_view": host_view, "masks": masks, "binds": binds,
            "dirs": [("tmp", 0o1777), ("workspace", 0o755)],
            "hostname": spec.sandbox_id[:63],
        }


def make_host_skeleton(path: Path) -> Path:
    """An image that is only mount points and the host's top-level symlinks."""
    path.mkdir(parents=True, exist_ok=True)
    for name in (*HOST_VIEW, "proc", "dev", "tmp", "workspace", "home", "root", "run", "var"):
        host, entry = Path("/") / name, path / name
        if entry.exists() or entry.is_symlink():
            continue
        if host.is_symlink():
            entry.symlink_to(os.readlink(host))
        elif host.is_dir() or name not in HOST_VIEW:
            entry.mkdir()
    (path / "tmp").chmod(0o1777)
    return path


def agent_pid(sdir: Path) -> int:
    """The host pid of the sandbox's agent (its pid 1), as the launch recorded it."""
    try:
        return int((sdir / "agent.pid").read_text())
    except (OSError, ValueError):
        raise BackendError(f"sandbox {sdir.name} has no agent on this host") from None


def record_launcher(sdir: Path, pid: int) -> None:
    """Keep the launcher's pid with its mount namespace's inode, which tells it from any later
    process given the same pid (see launcher_root)."""
    (sdir / "launcher.pid").write_text(f"{pid} {os.stat(f'/proc/{pid}/ns/mnt').st_ino}")


def launcher_root(sdir: Path, sandbox_pids: Collection[int]) -> Path:
    """The launch stage as the host reaches it, through the launcher's /proc/PID/root.

    The caller keeps the sandbox frozen, so the pid cannot change hands between this check and
    its use. A sandbox process given a dead launcher's pid fails the check: the sandbox's own
    mount namespace is not the launcher's.
    """
    try:
        launcher, mnt = map(int, (sdir / "launcher.pid").read_text().split())
        alive = (launcher in sandbox_pids
                 and os.stat(f"/proc/{launcher}/ns/mnt").st_ino == mnt)
    except (OSError, ValueError):
        alive = False
    if not alive:
        raise BackendError(f"sandbox {sdir.name}: its launcher is gone, and with it the mount "
                           "of its disk; delete and recreate it")
    return Path(f"/proc/{launcher}/root") / sdir.relative_to("/") / "stage"
