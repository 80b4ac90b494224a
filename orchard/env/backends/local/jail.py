"""How the zygote builds a sandbox, by syscalls only: no shell, ``mount``, ``setpriv`` or bwrap.

One fork of the zygote and one clone, neither of which execs:

  launcher (the zygote's child, host root): one clone3 makes the sandbox's pid 1 in new user,
      mount, pid, ipc, uts and net namespaces, born into the sandbox's v2 cgroup
      (CLONE_INTO_CGROUP); it joins it to the v1 hierarchies, writes its id maps, makes the
      id-mapped views of the lower layers, then enters its mount namespace and mounts there:
      the disk quota's file system, the overlay, and everything bound into the overlay. Paths
      inside the overlay are resolved with openat2(RESOLVE_IN_ROOT), so no symlink of an image
      sends a mount made as host root outside the sandbox's root. Then it lets the clone go,
      and exits once the agent is ready. With a disk quota it stays, in the sandbox's cgroups:
      its mount namespace holds the disk's mount, which snapshots read (``launcher_root``).
  the clone (pid 1, root of the sandbox's user namespace): a cgroup namespace (its cgroups
      are final now), ``lo`` up, a mount namespace of its own, pivot_root into the overlay,
      /proc and /dev/pts, the hostname; then it confines itself and becomes the agent (see
      ``zygote._become_agent``).

The launcher reads, on a socket pair, "ready" from the agent, or an error, or EOF if it died.
"""

import ctypes
import errno
import fcntl
import os
import posixpath
import signal
import socket
import struct

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_INTO_CGROUP = 0x200000000
MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x2, 0x4, 0x8
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x1, 0x20, 0x1000, 0x4000, 0x40000
MNT_DETACH = 2
AT_FDCWD, AT_EMPTY_PATH, AT_RECURSIVE = -100, 0x1000, 0x8000
OPEN_TREE_CLONE = 1
MOVE_MOUNT_F_EMPTY_PATH, MOVE_MOUNT_T_EMPTY_PATH = 0x4, 0x40
FSCONFIG_SET_STRING, FSCONFIG_CMD_CREATE = 1, 6
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC = 0x1, 0x2, 0x4, 0x8
MOUNT_ATTR_IDMAP = 0x00100000
RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, RESOLVE_IN_ROOT = 0x2, 0x4, 0x10
LOOP_CTL_GET_FREE, LOOP_CONFIGURE, LO_FLAGS_AUTOCLEAR = 0x4C82, 0x4C0A, 4
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
# New syscalls share one number on every architecture; pivot_root does not.
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_FSOPEN, SYS_FSCONFIG, SYS_FSMOUNT = 428, 429, 430, 431, 432
SYS_CLONE3, SYS_OPENAT2, SYS_MOUNT_SETATTR = 435, 437, 442
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41}.get(os.uname().machine, -1)
RO = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_LINKS = (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
             ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"),
             ("core", "/proc/kcore"), ("ptmx", "pts/ptmx"))
# Read-only over /proc, as bwrap covers them: writable, they would reach the host's kernel.
PROC_COVERS = ("sys", "sysrq-trigger", "irq", "bus")
OLD_ROOT = "dev/.oldroot"  # where pivot_root parks the host's root until it is detached

_libc = ctypes.CDLL(None, use_errno=True)
# clone3 returns twice into Python: the GIL must stay held across it, as os.fork holds it.
_clone = ctypes.PyDLL(None, use_errno=True).syscall


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


class _CloneArgs(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack", "stack_size",
        "tls", "set_tid", "set_tid_size", "cgroup")]


def check(result, what):
    if result < 0:
        err = ctypes.get_errno()
        hint = (" (this kernel lacks it: the local backend needs Linux 5.12 or later)"
                if err == errno.ENOSYS else "")
        raise OSError(err, f"{what}: {os.strerror(err)}{hint}")
    return result


def _b(text):
    return None if text is None else os.fsencode(text)


def mount(source, target, fstype, flags, data=None):
    check(_libc.mount(_b(source), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data)),
          f"mounting {fstype or source} on {target}")


def set_attrs(tree, attrs, userns_fd=0, what="mount_setattr"):
    attr = _MountAttr(attrs, 0, 0, userns_fd)
    check(_libc.syscall(SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH | AT_RECURSIVE,
                        ctypes.byref(attr), ctypes.sizeof(attr)), what)


def bind_tree(source, attrs=0):
    """A detached copy of the mounts at ``source`` (a host path), with ``attrs`` set on all."""
    tree = check(_libc.syscall(SYS_OPEN_TREE, AT_FDCWD, _b(source),
                               OPEN_TREE_CLONE | os.O_CLOEXEC | AT_RECURSIVE),
                 f"open_tree({source})")
    if attrs:
        set_attrs(tree, attrs, what=f"read-only view of {source}")
    return tree


def fs_tree(fstype, options, attrs):
    """A detached new file system (tmpfs here) with string ``options``."""
    fs = check(_libc.syscall(SYS_FSOPEN, _b(fstype), 1), f"fsopen({fstype})")
    try:
        for key, value in options.items():
            check(_libc.syscall(SYS_FSCONFIG, fs, FSCONFIG_SET_STRING, _b(key), _b(value), 0),
                  f"{fstype} option {key}={value}")
        check(_libc.syscall(SYS_FSCONFIG, fs, FSCONFIG_CMD_CREATE, None, None, 0),
              f"creating {fstype}")
        return check(_libc.syscall(SYS_FSMOUNT, fs, 1, attrs), f"fsmount({fstype})")
    finally:
        os.close(fs)


def attach(tree, target_fd, what):
    check(_libc.syscall(SYS_MOVE_MOUNT, tree, b"", target_fd, b"",
                        MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH), f"mounting {what}")
    os.close(tree)


class Root:
    """The overlay's root as the launcher (host root) sees it. Every path is resolved inside
    it, symlinks included; what is made is owned by the sandbox's root."""

    def __init__(self, path, uid):
        self.fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self.uid = uid

    def open(self, rel, make=None, mode=0o755, follow=True, links=0):
        """An O_PATH fd of ``rel``, made first (``make`` "dir" or "file") if missing; a
        dangling link there is followed, inside the root, to where it is made."""
        resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | (0 if follow else RESOLVE_NO_SYMLINKS)
        how = _OpenHow(os.O_PATH | os.O_CLOEXEC, 0, resolve)
        fd = _libc.syscall(SYS_OPENAT2, self.fd, _b(rel), ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err == errno.ELOOP and not follow:
            raise OSError(err, f"the image's /{rel} is a symbolic link, where the sandbox "
                               "mounts its own; remove it from the image")
        head, _, name = posixpath.normpath(rel).rpartition("/")
        if err != errno.ENOENT or make is None or name in ("", ".", "..") or links > 40:
            raise OSError(err, f"/{rel} in the sandbox's root: {os.strerror(err)}")
        parent = self.open(head, "dir") if head else os.dup(self.fd)
        try:
            try:
                link = os.readlink(name, dir_fd=parent)
            except OSError:
                link = None
            if link is not None:
                target = posixpath.join(head, link).lstrip("/")
                return self.open(target, make, mode, follow, links + 1)
            if make == "dir":
                os.mkdir(name, dir_fd=parent)
                os.chmod(name, mode, dir_fd=parent)  # mkdir's mode is masked by the umask
            else:
                os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW
                                 | os.O_CLOEXEC, mode, dir_fd=parent))
            os.chown(name, self.uid, self.uid, dir_fd=parent, follow_symlinks=False)
        finally:
            os.close(parent)
        return self.open(rel, follow=follow)

    def bind(self, tree, rel, make, what):
        target = self.open(rel, make)
        try:
            attach(tree, target, what)
        finally:
            os.close(target)

    def make_dev(self, device_trees):
        """/dev as bwrap's --dev makes it: a small tmpfs, the harmless host devices bound in,
        the usual links, a devpts mount point (``pivot`` mounts it) and /dev/shm. The
        image's /dev must be a directory (see the caller)."""
        self.bind(fs_tree("tmpfs", {"mode": "0755", "size": "64k", "uid": str(self.uid),
                                    "gid": str(self.uid)},
                          MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC), "dev", None, "/dev")
        dev = self.open("dev", follow=False)
        try:
            for name, target in DEV_LINKS:
                os.symlink(target, name, dir_fd=dev)
                os.chown(name, self.uid, self.uid, dir_fd=dev, follow_symlinks=False)
            for name, mode in (("pts", 0o755), ("shm", 0o1777), (".oldroot", 0o700)):
                os.mkdir(name, dir_fd=dev)
                os.chmod(name, mode, dir_fd=dev)
                os.chown(name, self.uid, self.uid, dir_fd=dev)
        finally:
            os.close(dev)
        for name, tree in zip(DEVICES, device_trees, strict=True):
            self.bind(tree, f"dev/{name}", "file", f"/dev/{name}")


def loop_mount(image, target):
    """``mount -o loop`` by hand: a free loop device over ``image`` that clears itself once
    unmounted (so it goes with the last mount namespace holding it), and ext4 on it."""
    ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(16):
            device = f"/dev/loop{fcntl.ioctl(ctl, LOOP_CTL_GET_FREE)}"
            loop = os.open(device, os.O_RDWR | os.O_CLOEXEC)
            try:
                # struct loop_config: fd, block_size, loop_info64 (lo_flags at its 9th field).
                config = struct.pack("=II5Q4I64s64s32s2Q8Q", backing, 0, 0, 0, 0, 0, 0, 0, 0,
                                     0, LO_FLAGS_AUTOCLEAR, b"", b"", b"", 0, 0, *[0] * 8)
                fcntl.ioctl(loop, LOOP_CONFIGURE, config)
            except OSError as e:
                os.close(loop)
                if e.errno == errno.EBUSY:  # taken by another between GET_FREE and here
                    continue
                raise
            try:
                mount(device, target, "ext4", MS_NODEV | MS_NOSUID)
            finally:
                os.close(loop)
            return
        raise OSError(errno.EBUSY, "no loop device stayed free for the disk quota")
    finally:
        os.close(ctl)
        os.close(backing)


def clone_sandbox(cgroup_fd):
    """The sandbox's pid 1 in new user, mount, pid, ipc, uts and net namespaces; born into the
    cgroup of ``cgroup_fd`` (a v2 directory) unless it is -1."""
    flags = (CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET
             | CLONE_NEWPID)
    args = _CloneArgs(flags=flags | (CLONE_INTO_CGROUP if cgroup_fd >= 0 else 0),
                      exit_signal=signal.SIGCHLD, cgroup=max(cgroup_fd, 0))
    return check(_clone(SYS_CLONE3, ctypes.byref(args), ctypes.sizeof(args)), "clone3")


def map_ids(pid, uid, count):
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(f"0 {uid} {count}\n")


def idmapped(lower, userns_fd):
    """A detached, read-only view of ``lower`` id-mapped through the sandbox's user namespace:
    the overlay only reads its lower layers, and this view must never let anything write the
    shared image or snapshot as the sandbox's root."""
    tree = bind_tree(lower)
    set_attrs(tree, MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY, userns_fd,
              f"id-mapping {lower} (mount_setattr; does its filesystem support id-mapped "
              "mounts?)")
    return tree


def enter_mounts(pid):
    fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        check(_libc.setns(fd, CLONE_NEWNS), "setns(mnt)")
    finally:
        os.close(fd)
    # Nothing mounted here may propagate anywhere, nor anything reach us.
    mount(None, "/", None, MS_REC | MS_PRIVATE)


def become_root():
    """In the clone: uid and gid 0 of the new user namespace (the sandbox's unprivileged host
    uid), keeping the namespace's capabilities (we were not its root), then a cgroup namespace
    rooted at the sandbox's cgroups, which it has joined by now, and the loopback link."""
    os.setgroups([])
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    check(_libc.unshare(CLONE_NEWCGROUP), "unshare(cgroup)")
    loopback_up()


def reserve_pids(last):
    """In the clone, pid 1 of its namespace: new pids start after ``last``. A live snapshot's
    processes are restored with the pids they had, and the agent's threads must not take them
    first."""
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(last))


def loopback_up():
    """``lo`` up in the new network namespace, as bwrap brings it up: servers that a sandbox
    starts for itself listen there."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        flags = struct.unpack_from("H", fcntl.ioctl(sock, SIOCGIFFLAGS, struct.pack(
            "16sH22x", b"lo", 0)), 16)[0]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def pivot(root_fd, hostname):
    """In the clone: a mount namespace of its own (the launcher's, and the disk mount in it,
    stay as they are), the overlay as /, /proc and /dev/pts, the host's root gone."""
    # In this order: unshare moves the working directory over to the copy, and pivot_root
    # takes only a mount of our own namespace.
    os.fchdir(root_fd)
    os.close(root_fd)
    check(_libc.unshare(CLONE_NEWNS), "unshare(mnt)")
    check(_libc.syscall(SYS_PIVOT_ROOT, b".", _b(OLD_ROOT)), "pivot_root")
    os.chdir("/")
    # Mounted while the host's /proc is still in sight: the kernel lets a user namespace
    # mount a proc only where one is fully visible.
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name in PROC_COVERS:
        path = f"/proc/{name}"
        if os.path.exists(path):
            mount(path, path, None, MS_BIND | MS_REC)
            mount(None, path, None,
                  MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
          "newinstance,ptmxmode=0666,mode=620")
    check(_libc.umount2(_b(f"/{OLD_ROOT}"), MNT_DETACH), "detaching the host's root")
    os.rmdir(f"/{OLD_ROOT}")
    socket.sethostname(hostname)
