"""The sandbox seccomp filter, loaded by a real bwrap on the real kernel."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from orchard.env.backends.local.seccomp import DENIED_SYSCALLS, filter_bytes, write_filter

REQUIRED = {
    "mount",
    "umount",
    "umount2",
    "unshare",
    "setns",
    "ptrace",
    "kexec_load",
    "kexec_file_load",
    "bpf",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "pivot_root",
    "open_by_handle_at",
    "keyctl",
    "add_key",
    "request_key",
    "perf_event_open",
    "userfaultfd",
    "acct",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "lookup_dcookie",
    "quotactl",
    "fsopen",
    "fsmount",
    "fsconfig",
    "move_mount",
    "open_tree",
    "iopl",
    "ioperm",
    "syslog",
}
CLONE_NEWUSER = 0x10000000
SIGCHLD = 17
# Prints "<return value> <errno>" of a raw syscall; a successful clone's child exits at once.
RAW_SYSCALL = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
args = [ctypes.c_long(int(a)) for a in sys.argv[1:]] + [ctypes.c_long(0)] * 4
r = libc.syscall(*args)
if r == 0:
    os._exit(0)
if r > 0:
    os.waitpid(r, 0)
print(r, ctypes.get_errno())
"""
LIBC_CALL = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
r = eval(sys.argv[1], {"libc": libc, "ctypes": ctypes})
print(r, ctypes.get_errno())
"""

Run = Callable[..., subprocess.CompletedProcess[str]]


def test_denied_list_and_bytes(tmp_path: Path) -> None:
    assert set(DENIED_SYSCALLS) >= REQUIRED
    assert len(set(DENIED_SYSCALLS)) == len(DENIED_SYSCALLS)
    data = filter_bytes()
    assert data and len(data) % 8 == 0  # a sequence of struct sock_filter
    assert filter_bytes() is data  # cached
    out = write_filter(tmp_path / "filter.bpf")
    assert out == tmp_path / "filter.bpf"
    assert out.read_bytes() == data
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    write_filter(out)  # replacing an existing file works and leaves no temp files behind
    assert [p.name for p in tmp_path.iterdir()] == ["filter.bpf"]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Runs argv under bwrap, with or without the filter on an inherited fd."""
    if shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed")
    path = write_filter(tmp_path_factory.mktemp("seccomp") / "filter.bpf")

    def run(*argv: str, seccomp: bool = True) -> subprocess.CompletedProcess[str]:
        with open(path, "rb") as f:
            fd_args = ["--seccomp", str(f.fileno())] if seccomp else []
            return subprocess.run(
                [
                    "bwrap",
                    "--ro-bind",
                    "/",
                    "/",
                    "--dev",
                    "/dev",
                    "--proc",
                    "/proc",
                    "--unshare-pid",
                    "--cap-drop",
                    "ALL",
                    *fd_args,
                    "--",
                    *argv,
                ],
                pass_fds=(f.fileno(),),
                capture_output=True,
                text=True,
                timeout=60,
            )

    probe = run("true", seccomp=False)
    if probe.returncode != 0:
        pytest.skip(f"bwrap cannot run here: {probe.stderr.strip()}")
    return run


def _result(proc: subprocess.CompletedProcess[str]) -> tuple[int, int]:
    assert proc.returncode == 0, proc.stderr
    ret, err = proc.stdout.split()
    return int(ret), int(err)


def test_unshare_command_denied(sandbox: Run) -> None:
    denied = sandbox("unshare", "-m", "true")
    assert denied.returncode != 0
    assert "Operation not permitted" in denied.stderr
    # A user namespace needs no capability, so only the filter can be what stops this one.
    if sandbox("unshare", "-U", "true", seccomp=False).returncode == 0:
        user = sandbox("unshare", "-U", "true")
        assert user.returncode != 0
        assert "Operation not permitted" in user.stderr


def test_mount_denied(sandbox: Run) -> None:
    cmd = sandbox("mount", "-t", "tmpfs", "x", "/tmp")
    assert cmd.returncode != 0
    assert "permission denied" in cmd.stderr.lower() or "not permitted" in cmd.stderr
    call = "libc.mount(b'x', b'/tmp', b'tmpfs', 0, None)"
    assert _result(sandbox(sys.executable, "-c", LIBC_CALL, call)) == (-1, errno.EPERM)


def test_python_unshare_denied(sandbox: Run) -> None:
    # os.unshare only exists from Python 3.12, hence ctypes.
    call = "libc.unshare(0x00020000)"  # CLONE_NEWNS
    assert _result(sandbox(sys.executable, "-c", LIBC_CALL, call)) == (-1, errno.EPERM)


def test_clone_namespace_flags_denied_and_clone3_enosys(sandbox: Run) -> None:
    pyseccomp = pytest.importorskip("pyseccomp")
    nr_clone = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, "clone")
    nr_clone3 = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, "clone3")
    if os.uname().machine.startswith("s390"):
        pytest.skip("s390 orders clone's arguments differently")
    userns_clone = (sys.executable, "-c", RAW_SYSCALL, str(nr_clone), str(CLONE_NEWUSER | SIGCHLD))
    control_ret, _ = _result(sandbox(*userns_clone, seccomp=False))
    if control_ret > 0:  # user namespaces are enabled, so the filter is what must refuse
        assert _result(sandbox(*userns_clone)) == (-1, errno.EPERM)
    plain_ret, _ = _result(sandbox(sys.executable, "-c", RAW_SYSCALL, str(nr_clone), str(SIGCHLD)))
    assert plain_ret > 0  # fork-style clone stays allowed
    assert _result(sandbox(sys.executable, "-c", RAW_SYSCALL, str(nr_clone3), "0", "0")) == (
        -1,
        errno.ENOSYS,
    )


def test_ptrace_denied(sandbox: Run) -> None:
    call = "libc.ptrace(0, 0, None, None)"  # PTRACE_TRACEME
    assert _result(sandbox(sys.executable, "-c", LIBC_CALL, call, seccomp=False)) == (0, 0)
    assert _result(sandbox(sys.executable, "-c", LIBC_CALL, call)) == (-1, errno.EPERM)


def test_ordinary_work_still_runs(sandbox: Run) -> None:
    pipe = sandbox("sh", "-c", "echo hi | cat")
    assert (pipe.returncode, pipe.stdout) == (0, "hi\n"), pipe.stderr
    # glibc starts threads and spawns processes with clone3 first; ENOSYS must make it fall
    # back to clone rather than fail.
    script = (
        "import subprocess, sys, threading\n"
        "out = []\n"
        "ts = [threading.Thread(target=out.append, args=(i,)) for i in range(4)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "child = subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True)\n"
        "print(sorted(out), child.stdout.decode().strip())\n"
    )
    py = sandbox(sys.executable, "-c", script)
    assert (py.returncode, py.stdout) == (0, "[0, 1, 2, 3] 42\n"), py.stderr
