"""Seccomp filter for local sandboxes, in the classic-BPF form that PR_SET_SECCOMP loads.

Policy: allow by default, fail kernel-administration and namespace/escape syscalls with EPERM.
It is compiled for the native architecture only: syscalls made through another ABI (e.g.
32-bit ``int 0x80`` on x86_64) hit libseccomp's bad-arch action and kill the caller, which
closes that bypass but also means 32-bit binaries cannot run in the sandbox.

``personality`` stays allowed: tools such as ``setarch`` and some emulators need it, and the
risky personas (e.g. ADDR_NO_RANDOMIZE) only weaken the caller itself.
"""

from __future__ import annotations

import errno
import functools
import platform
import tempfile
from pathlib import Path

from orchard.env.datadir import write_atomic
from orchard.env.errors import OrchestratorError

__all__ = ["DENIED_SYSCALLS", "IO_URING_SYSCALLS", "SeccompUnavailableError", "filter_bytes",
           "write_filter"]

DENIED_SYSCALLS: tuple[str, ...] = (
    # Filesystem namespace manipulation (also covered by --cap-drop ALL; defence in depth
    # against a capability leaking back in through a user namespace).
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    # New namespaces give an unprivileged process a fresh set of capabilities and a large,
    # historically buggy kernel attack surface.
    "unshare",
    "setns",
    # Inspecting or writing other processes' memory.
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    # Kernel code loading and configuration.
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "query_module",
    "get_kernel_syms",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "_sysctl",
    "nfsservctl",
    "uselib",
    # Host-wide state.
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "syslog",
    "quotactl",
    "quotactl_fd",
    "vhangup",
    "settimeofday",
    "stime",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    # The kernel keyring is not namespaced.
    "keyctl",
    "add_key",
    "request_key",
    # Escapes a bind-mounted directory via file handles.
    "open_by_handle_at",
    "lookup_dcookie",
    # Raw port I/O and legacy x86 modes.
    "iopl",
    "ioperm",
    "vm86",
    "vm86old",
)
# io_uring runs a process's I/O from kernel workers, out of this filter's sight, and has been
# the kernel's richest source of privilege escalations; denied unless the settings allow it.
IO_URING_SYSCALLS: tuple[str, ...] = ("io_uring_setup", "io_uring_enter", "io_uring_register")

# clone() takes the namespace flags directly; threads and fork never set them.  CLONE_NEWTIME
# is absent because clone() reads that bit as part of the exit signal; only unshare/clone3
# accept it and both are refused anyway.
_CLONE_NAMESPACE_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)
# s390 swaps clone's first two arguments (stack first, flags second).
_CLONE_FLAGS_ARG = 1 if platform.machine().startswith("s390") else 0


class SeccompUnavailableError(OrchestratorError, RuntimeError):
    """libseccomp or its Python binding is missing or too old."""


@functools.cache
def filter_bytes(allow_io_uring: bool = False) -> bytes:
    """The compiled cBPF program; built once per process and setting."""
    try:
        import pyseccomp as sc
    except ImportError as exc:
        raise SeccompUnavailableError(
            "seccomp filtering needs the 'pyseccomp' Python package: pip install pyseccomp"
        ) from exc
    except RuntimeError as exc:  # pyseccomp raises this when libseccomp.so is not found
        raise SeccompUnavailableError(
            f"seccomp filtering needs the libseccomp shared library ({exc}): "
            "apt-get install libseccomp2 (or your distribution's libseccomp package)"
        ) from exc

    f = sc.SyscallFilter(sc.ALLOW)
    for name in (*DENIED_SYSCALLS, *(() if allow_io_uring else IO_URING_SYSCALLS)):
        # -1 means libseccomp has never heard of the name; silently skipping it would leave a
        # hole, so demand a newer library instead.  Names unknown only on this architecture
        # resolve to negative pseudo numbers that libseccomp accepts and ignores.
        if sc.resolve_syscall(sc.Arch.NATIVE, name) == -1:
            raise SeccompUnavailableError(
                f"libseccomp does not know syscall {name!r}; upgrade libseccomp2 (>= 2.5)"
            )
        f.add_rule(sc.ERRNO(errno.EPERM), name)
    for flag in _CLONE_NAMESPACE_FLAGS:
        f.add_rule(
            sc.ERRNO(errno.EPERM), "clone", sc.Arg(_CLONE_FLAGS_ARG, sc.MASKED_EQ, flag, flag)
        )
    # clone3 passes its flags in a struct that BPF cannot dereference; ENOSYS makes glibc and
    # other runtimes fall back to clone(), whose flags the rules above can inspect.
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


def write_filter(path: Path, allow_io_uring: bool = False) -> Path:
    """Atomically write the compiled filter to ``path`` (mode 0644) and return ``path``."""
    return write_atomic(path, filter_bytes(allow_io_uring))
