"""How a local sandbox is launched: launch.sh and the bwrap command line around it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from orchard.env.agent.browser_bundle import BROWSER_MOUNT
from orchard.env.agent.bundle import BUNDLE_MOUNT
from orchard.env.backends.base import SandboxSpec
from orchard.env.backends.local import network, quota
from orchard.env.backends.local.images import ResolvedImage

CTL_MOUNT = "/.orchard/ctl"
USER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Host entries a "host" sandbox sees read-only; everything else (/root, /home, /tmp, /var, the
# orchestrator's state) is absent, and /workspace, /tmp, /home are private and writable.
HOST_VIEW = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt")
HOST_SECRETS = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-",
                "/etc/sudoers", "/etc/ssl/private")
_LAUNCH_SH = """\
# usage: launch.sh LOWER_FDS DATA_DIR UID UPPER WORK ROOT BUNDLE BROWSER DISK NPROCS PROCS_FILE...
#                  COMMAND...
# Host root, in a private mount namespace; COMMAND (bwrap) runs as the sandbox's host uid.
set -e
lower=$1 data=$2 uid=$3 upper=$4 work=$5 root=$6 bundle=$7 browser=$8 disk=$9 n=${10}
shift 10
while [ "$n" -gt 0 ]; do echo $$ > "$1"; shift; n=$((n - 1)); done
# A disk quota (DISK not empty): upper and work live on that file system, mounted here so
# that it and its loop device (autoclear) go away with the sandbox.
if [ -n "$disk" ]; then mount -o loop,nodev,nosuid "$disk" "${upper%/*}"; fi
# LOWER_FDS: the id-mapped lower layers, topmost first, as fd numbers joined by ':'.
lowerdir=/proc/self/fd/${lower//:/:/proc/self/fd/}
mount -t overlay orchard-overlay \\
    -o "lowerdir=$lowerdir,upperdir=$upper,workdir=$work" "$root"
# Nothing in the sandbox may inherit the id-mapped views.
for fd in ${lower//:/ }; do eval "exec $fd<&-"; done
# The sandbox's uid may not search the data dir's parents (a 0700 home or tmp dir); bwrap sees
# the data dir at /tmp instead, in this mount namespace only. A bundle or browser dir kept
# outside the data dir (BUNDLE, BROWSER not empty) is bound into it first.
if [ -n "$bundle" ]; then mount --bind "$bundle" "$data/bundle-view"; fi
if [ -n "$browser" ]; then mount --bind "$browser" "$data/browser-view"; fi
mount --rbind "$data" /tmp
exec setpriv --reuid "$uid" --regid "$uid" --clear-groups "$@"
"""
# Where bwrap finds the data dir (see launch.sh).
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
    empty_dir: Path

    @classmethod
    def prepare(cls, data_dir: Path, bundle: Path, browser: Path) -> Launcher:
        launcher = cls(data_dir, bundle, browser, data_dir / "launch.sh",
                       make_host_skeleton(data_dir / "host-skeleton"), data_dir / "empty")
        for name in ("bundle", "browser"):
            if not launcher._inside(name):
                (data_dir / f"{name}-view").mkdir(mode=0o755, exist_ok=True)
        launcher.launch_sh.write_text(_LAUNCH_SH)
        launcher.empty_dir.mkdir(mode=0o755, exist_ok=True)
        return launcher

    def _inside(self, name: str) -> bool:
        """Whether bwrap sees that dir as it is; else it is bound onto <name>-view for it."""
        path: Path = getattr(self, name)
        return path.resolve().is_relative_to(self.data_dir.resolve())

    def _view(self, name: str) -> Path:
        return getattr(self, name) if self._inside(name) else self.data_dir / f"{name}-view"

    def argv(self, spec: SandboxSpec, image: ResolvedImage, sdir: Path, procs: list[str],
             seccomp_fd: int, block_fd: int, uid: int, userns_fd: int,
             lower_fds: list[int], layers: Path) -> list[str]:
        """The launch chain of one sandbox (see launch.sh and the module doc of backend.py)."""

        def seen(path: Path) -> str:  # a data dir path as bwrap sees it (see launch.sh)
            return str(LAUNCH_VIEW / path.relative_to(self.data_dir))

        bwrap = ["bwrap", "--userns", str(userns_fd), "--bind", seen(sdir / "root"), "/",
                 "--proc", "/proc", "--dev", "/dev"]
        if image.kind == "host":
            for name in HOST_VIEW:
                host = Path("/") / name
                if host.is_dir() and not host.is_symlink():
                    bwrap += ["--ro-bind", str(host), str(host)]
            for secret in HOST_SECRETS:
                if os.path.lexists(secret):
                    mask = seen(self.empty_dir) if os.path.isdir(secret) else "/dev/null"
                    bwrap += ["--ro-bind", mask, secret]
            for key in Path("/etc/ssh").glob("ssh_host_*_key"):
                bwrap += ["--ro-bind", "/dev/null", str(key)]
        bwrap += [
            "--perms", "1777", "--dir", "/tmp", "--dir", "/workspace",
            "--ro-bind", seen(self._view("bundle")), BUNDLE_MOUNT,
            "--ro-bind", seen(self._view("browser")), BROWSER_MOUNT,
            "--bind", seen(sdir / "ctl"), CTL_MOUNT,
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--hostname", spec.sandbox_id[:63], "--cap-drop", "ALL", "--new-session",
            "--seccomp", str(seccomp_fd), "--clearenv", "--setenv", "PATH", USER_PATH,
            "--setenv", "HOME", "/root", "--setenv", "LANG", "C.UTF-8",
            "--setenv", "HOSTNAME", spec.sandbox_id[:63], "--chdir", "/",
        ]
        # Every sandbox has a network namespace; a networked one gets its link and rules
        # once the holder is up, and a resolver that the rules let through.
        bwrap.append("--unshare-net")
        if not spec.block_network:
            (sdir / "resolv.conf").write_text(network.RESOLV_CONF)
            bwrap[bwrap.index("--perms"):bwrap.index("--perms")] = [
                "--ro-bind", seen(sdir / "resolv.conf"), "/etc/resolv.conf"]
        # The holder never gets past --block-fd, so the command is never run.
        bwrap += ["--block-fd", str(block_fd), "--", "/.orchard/never-run"]
        return [
            "unshare", "--mount", "--propagation", "private", "--", "bash",
            str(self.launch_sh), ":".join(map(str, lower_fds)), str(self.data_dir), str(uid),
            str(layers / "upper"), str(layers / "work"), str(sdir / "root"),
            *("" if self._inside(name) else str(getattr(self, name))
              for name in ("bundle", "browser")),
            str(sdir / quota.DISK_IMAGE) if layers != sdir else "", str(len(procs)),
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
