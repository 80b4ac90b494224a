"""How a local sandbox is launched: launch.sh, the bwrap command line around it, waiting for
its holder, and the launcher kept for later (a disk-quota sandbox's upper dir is in its mount
namespace)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from orchard.env.agent.browser_bundle import BROWSER_MOUNT
from orchard.env.agent.bundle import BUNDLE_MOUNT
from orchard.env.backends.base import BackendError, SandboxSpec
from orchard.env.backends.local import network
from orchard.env.backends.local.images import ResolvedImage

CTL_MOUNT = "/.orchard/ctl"
USER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Host entries a "host" sandbox sees read-only; everything else (/root, /home, /tmp, /var, the
# orchestrator's state) is absent, and /workspace, /tmp, /home are private and writable.
HOST_VIEW = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt")
HOST_SECRETS = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-",
                "/etc/sudoers", "/etc/ssl/private")
_LAUNCH_SH = """\
# usage: launch.sh LOWER_FDS SANDBOX_DIR UID BUNDLE BROWSER DISK NPROCS PROCS_FILE... COMMAND...
# Host root, in a private mount namespace; COMMAND (bwrap) runs as the sandbox's host uid.
set -e
lower=$1 sdir=$2 uid=$3 bundle=$4 browser=$5 disk=$6 n=$7
shift 7
while [ "$n" -gt 0 ]; do echo $$ > "$1"; shift; n=$((n - 1)); done
# bwrap, as the sandbox's uid, may not search the data dir (0700). Everything it binds is
# gathered on a small tmpfs, which then moves over /tmp, in this mount namespace only.
stage=$sdir/stage
mount -t tmpfs -o mode=0755,size=64k,nodev,nosuid,noexec orchard-stage "$stage"
mkdir "$stage/root" "$stage/bundle" "$stage/browser" "$stage/ctl" "$stage/empty"
upper=$sdir/upper work=$sdir/work
# A disk quota (DISK not empty): upper and work live on that file system, mounted here so
# that it and its loop device (autoclear) go away with the sandbox.
if [ -n "$disk" ]; then
  mkdir "$stage/disk"
  mount -o loop,nodev,nosuid "$disk" "$stage/disk"
  upper=$stage/disk/upper work=$stage/disk/work
fi
# LOWER_FDS: the id-mapped lower layers, topmost first, as fd numbers joined by ':'.
lowerdir=/proc/self/fd/${lower//:/:/proc/self/fd/}
mount -t overlay orchard-overlay \\
    -o "lowerdir=$lowerdir,upperdir=$upper,workdir=$work" "$stage/root"
# Nothing in the sandbox may inherit the id-mapped views.
for fd in ${lower//:/ }; do eval "exec $fd<&-"; done
mount --bind "$bundle" "$stage/bundle"
mount --bind "$browser" "$stage/browser"
mount --bind "$sdir/ctl" "$stage/ctl"
if [ -f "$sdir/resolv.conf" ]; then
  touch "$stage/resolv.conf"
  mount --bind "$sdir/resolv.conf" "$stage/resolv.conf"
fi
mount --move "$stage" /tmp
exec setpriv --reuid "$uid" --regid "$uid" --clear-groups "$@"
"""
# Where bwrap (and the host, through the launcher's /proc/PID/root) finds the stage.
LAUNCH_VIEW = Path("/tmp")


@dataclass(frozen=True)
class Launcher:
    """What every launch of one data dir shares: launch.sh, the bundle, the browser dir (see
    ``browser_bundle.py``), the host skeleton."""

    data_dir: Path
    bundle: Path
    browser: Path
    launch_sh: Path
    host_skeleton: Path

    @classmethod
    def prepare(cls, data_dir: Path, bundle: Path, browser: Path) -> Launcher:
        launcher = cls(data_dir, bundle, browser, data_dir / "launch.sh",
                       make_host_skeleton(data_dir / "host-skeleton"))
        launcher.launch_sh.write_text(_LAUNCH_SH)
        return launcher

    def argv(self, spec: SandboxSpec, image: ResolvedImage, sdir: Path, procs: list[str],
             seccomp_fd: int, block_fd: int, uid: int, userns_fd: int,
             lower_fds: list[int], disk: Path | None) -> list[str]:
        """The launch chain of one sandbox (see launch.sh and the module doc of backend.py)."""

        def staged(name: str) -> str:  # what launch.sh gathered, as bwrap sees it
            return str(LAUNCH_VIEW / name)

        bwrap = ["bwrap", "--userns", str(userns_fd), "--bind", staged("root"), "/",
                 "--proc", "/proc", "--dev", "/dev"]
        if image.kind == "host":
            for name in HOST_VIEW:
                host = Path("/") / name
                if host.is_dir() and not host.is_symlink():
                    bwrap += ["--ro-bind", str(host), str(host)]
            for secret in HOST_SECRETS:
                if os.path.lexists(secret):
                    mask = staged("empty") if os.path.isdir(secret) else "/dev/null"
                    bwrap += ["--ro-bind", mask, secret]
            for key in Path("/etc/ssh").glob("ssh_host_*_key"):
                bwrap += ["--ro-bind", "/dev/null", str(key)]
        # Every sandbox has a network namespace; a networked one gets its link and rules
        # once the holder is up, and a resolver that the rules let through (with an
        # allow-list, its own, which answers for the listed names only).
        if not spec.block_network:
            (sdir / "resolv.conf").write_text(network.resolv_conf(spec.egress))
            bwrap += ["--ro-bind", staged("resolv.conf"), "/etc/resolv.conf"]
        bwrap += [
            "--perms", "1777", "--dir", "/tmp", "--dir", "/workspace",
            "--ro-bind", staged("bundle"), BUNDLE_MOUNT,
            "--ro-bind", staged("browser"), BROWSER_MOUNT,
            # Read-only: the host connects to the agent's socket here and binds the model
            # relay's, so sandbox code must not replace either (or plant a link to another).
            "--ro-bind", staged("ctl"), CTL_MOUNT,
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--hostname", spec.sandbox_id[:63], "--cap-drop", "ALL", "--new-session",
            "--seccomp", str(seccomp_fd), "--clearenv", "--setenv", "PATH", USER_PATH,
            "--setenv", "HOME", "/root", "--setenv", "LANG", "C.UTF-8",
            "--setenv", "HOSTNAME", spec.sandbox_id[:63], "--chdir", "/", "--unshare-net",
        ]
        # The holder never gets past --block-fd, so the command is never run.
        bwrap += ["--block-fd", str(block_fd), "--", "/.orchard/never-run"]
        return [
            "unshare", "--mount", "--propagation", "private", "--", "bash",
            str(self.launch_sh), ":".join(map(str, lower_fds)), str(sdir), str(uid),
            str(self.bundle), str(self.browser), str(disk or ""), str(len(procs)),
            *procs, *bwrap,
        ]


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


async def await_holder(sandbox_id: str, launcher: subprocess.Popen[bytes], log: Path,
                       timeout: float) -> int:
    """Host pid of bwrap's sandboxed child, once its set-up is complete. bwrap drops the
    child's capabilities only after the last mount and the chroot, so an empty effective
    set means the namespaces are final (it then parks on --block-fd)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.0005
    while loop.time() < deadline:
        if launcher.poll() is not None:
            raise BackendError(f"sandbox {sandbox_id} failed to start (launcher exit "
                               f"{launcher.returncode}): "
                               f"{log.read_text(errors='replace').strip()[-2000:]}")
        holder = _children(launcher.pid)
        if holder and _capabilities_dropped(holder[0]):
            return holder[0]
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.02)
    raise BackendError(f"sandbox {sandbox_id}: not set up after {timeout:.0f}s; see {log}")


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
    return Path(f"/proc/{launcher}/root") / LAUNCH_VIEW.relative_to("/")


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _capabilities_dropped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("CapEff:") and int(line.split()[1], 16) == 0
                       for line in f)
    except OSError:
        return False
