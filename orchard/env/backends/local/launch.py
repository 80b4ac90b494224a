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
# usage: launch.sh LOWER_FDS SANDBOX_DIR UID NPROCS PROCS_FILE... COMMAND...
# Host root, in a private mount namespace; COMMAND (bwrap) runs as the sandbox's host uid.
set -e
lower=$1 sdir=$2 uid=$3 n=$4
shift 4
while [ "$n" -gt 0 ]; do echo $$ > "$1"; shift; n=$((n - 1)); done
# bwrap, as the sandbox's uid, may not search the data dir (0700). Everything it binds is
# gathered on a small tmpfs (stage.fstab, in one mount process), which then moves over /tmp,
# in this mount namespace only. A disk quota's file system and its loop device (autoclear)
# are mounted there too, so they go away with the sandbox.
mount -a -T "$sdir/stage.fstab"
# Nothing in the sandbox may inherit the id-mapped views (LOWER_FDS, joined by ':').
for fd in ${lower//:/ }; do eval "exec $fd<&-"; done
mount --move "$sdir/stage" /tmp
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

        (sdir / "stage.fstab").write_text(self.stage_fstab(sdir, lower_fds, disk))

        bwrap = ["bwrap", "--userns", str(userns_fd), "--bind", staged("root"), "/",
                 "--proc", "/proc", "--dev", "/dev"]
        if image.kind == "host":
            for name in HOST_VIEW:
                host = Path("/") / name
                if host.is_dir() and not host.is_symlink():
                    bwrap += ["--ro-bind", str(host), str(host)]
            for secret in HOST_SECRETS:
                if os.path.isdir(secret):  # an empty, read-only tmpfs over it
                    bwrap += ["--tmpfs", secret, "--remount-ro", secret]
                elif os.path.lexists(secret):
                    bwrap += ["--ro-bind", "/dev/null", secret]
            for key in Path("/etc/ssh").glob("ssh_host_*_key"):
                bwrap += ["--ro-bind", "/dev/null", str(key)]
        # Every sandbox has a network namespace; a networked one gets its link and rules
        # once the holder is up, and a resolver that the rules let through (with an
        # allow-list, its own, which answers for the listed names only).
        if not spec.block_network:
            (sdir / "ctl" / "resolv.conf").write_text(network.resolv_conf(spec.egress))
            bwrap += ["--ro-bind", staged("ctl/resolv.conf"), "/etc/resolv.conf"]
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
            str(len(procs)), *procs, *bwrap,
        ]

    def stage_fstab(self, sdir: Path, lower_fds: list[int], disk: Path | None) -> str:
        """What launch.sh mounts on the stage, in order: the tmpfs, [the disk quota's file
        system], the overlay (lower layers as the launcher's fds, topmost first), the bundle,
        the browser dir and ctl."""
        stage = sdir / "stage"
        layers = stage / "disk" if disk else sdir
        lower = ":".join(f"/proc/self/fd/{fd}" for fd in lower_fds)
        lines = [("orchard-stage", stage, "tmpfs", "mode=0755,size=64k,nodev,nosuid,noexec")]
        if disk:
            lines.append((disk, stage / "disk", "ext4", "loop,nodev,nosuid,X-mount.mkdir"))
        lines += [
            ("orchard-overlay", stage / "root", "overlay",
             f"lowerdir={lower},upperdir={layers / 'upper'},workdir={layers / 'work'},"
             "X-mount.mkdir"),
            *((source, stage / name, "none", "bind,X-mount.mkdir") for name, source in
              (("bundle", self.bundle), ("browser", self.browser), ("ctl", sdir / "ctl"))),
        ]
        return "".join(" ".join(_fstab_field(str(f)) for f in line) + " 0 0\n"
                       for line in lines)


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


def _fstab_field(text: str) -> str:
    """A field of fstab(5): white space and backslashes as octal escapes."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in text)


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
