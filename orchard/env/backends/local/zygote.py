"""A fork-server for sandbox agents: one pre-loaded interpreter forks every agent.

Starting a Python agent in each sandbox costs ~30 ms and ~6 MiB of private heap. Instead,
bubblewrap builds the sandbox (namespaces, mounts, seccomp) around a holder process that
blocks forever, and this zygote forks a child that *enters* those namespaces and becomes the
agent. The child shares the zygote's pages copy-on-write (``gc.freeze`` keeps the collector
from touching them), so an idle agent costs a fraction of a fresh interpreter and starts in
about a millisecond.

What the forked agent does, in order, before it runs any agent code:
  bind its listening socket at a host path (in a dir only host root may write) ->
  join the sandbox's cgroups -> setns(ipc, uts, net, cgroup, pid, mnt) -> setns(user) ->
  chroot to the holder's root -> uid/gid 0 of the user namespace (an unprivileged host uid) ->
  fork (to be inside the pid namespace) -> new session -> drop every capability (bounding set
  too) -> no_new_privs -> the same seccomp filter as bwrap -> close every inherited fd -> a
  clean environment -> imports resolve from the read-only interpreter bundle mounted in the
  sandbox.

It also makes each sandbox's user namespace and the id-mapped view of its image, before the
launch: making a user namespace takes a single-threaded process, which the orchestrator is not.

Protocol: one JSON line per connection on a Unix socket, answered with one JSON line:
  {"holder": PID, "procs": [cgroup.procs paths], "env": {...}, "listen": HOST_PATH,
   "token": TOKEN, "path": [...]}
  -> {"pid": PID} or {"error": "..."}
  {"userns": {"uid": HOST_UID, "count": N, "lowers": [PATH, ...]}}
  -> {"ok": true} with two fds attached (SCM_RIGHTS): the user namespace mapping 0..N-1 to
     HOST_UID.., and a detached read-only mount of PATH id-mapped through it; or {"error": ...}
The zygote exits when its lifeline (a pipe from the orchestrator) closes.
"""

import contextlib
import ctypes
import fcntl
import gc
import importlib.util
import json
import os
import pty
import select
import signal
import socket
import sys
import termios
import traceback

# Everything the agent may ever import must be loaded here: inside the sandbox only the
# bundle's stdlib is reachable (see "path"), and modules loaded here are shared, not copied.
PRELOADED = (fcntl, pty, termios, traceback)

# Loaded by path, not as orchard.env.agent.server: the orchard package pulls in the SDK and
# its dependencies, which every agent would then carry.
AGENT_BOOT = os.path.join(os.path.dirname(__file__), "..", "..", "agent", "server", "boot.py")
_spec = importlib.util.spec_from_file_location("orchard_agent_boot", AGENT_BOOT)
_boot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_boot)
agent = _boot.load()
# The agent imports its browser only when asked to browse, and inside the sandbox this host
# path is gone; loaded here, its pages are shared by every sandbox until one browses.
importlib.import_module("orchard_agent.browser")

# The user namespace comes last: as host root we may join any namespace, including one
# the host owns (a network namespace prepared for the sandbox), which we could not once in the
# sandbox's user namespace; joining that one still gives the capabilities chroot needs there.
_NAMESPACES = (("ipc", 0x08000000), ("uts", 0x04000000), ("net", 0x40000000),
               ("cgroup", 0x02000000), ("pid", 0x20000000), ("mnt", 0x00020000),
               ("user", 0x10000000))
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
_CAP_V3 = 0x20080522
CLONE_NEWUSER = 0x10000000
SYS_OPEN_TREE = 428  # the same number on every architecture (new syscalls are unified)
SYS_MOUNT_SETATTR = 442
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_IDMAP = 0x00100000

_libc = ctypes.CDLL(None, use_errno=True)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _check(result, what):
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _enter(req):
    """In the forked child: join the holder's cgroups and namespaces and its root."""
    for path in req["procs"]:
        with open(path, "w") as f:
            f.write(str(os.getpid()))
    holder = int(req["holder"])
    fds = []
    for name, flag in _NAMESPACES:
        try:
            fds.append((name, flag, os.open(f"/proc/{holder}/ns/{name}", os.O_RDONLY)))
        except FileNotFoundError:
            if name != "cgroup":  # older kernels have no cgroup namespace
                raise
    root = os.open(f"/proc/{holder}/root", os.O_RDONLY | os.O_DIRECTORY)
    # Read before any setns: /proc is not ours after setns(mnt).
    own = {name: os.stat(f"/proc/self/ns/{name}").st_ino for name, _, _ in fds}
    joined_user = False
    for name, flag, fd in fds:
        # One we are already in (the host's network for an open sandbox) is skipped.
        if os.fstat(fd).st_ino != own[name]:
            _check(_libc.setns(fd, flag), f"setns({name})")
            joined_user = joined_user or name == "user"
        os.close(fd)
    # setns(mnt) puts us at the namespace's root, not bwrap's chroot inside it.
    os.fchdir(root)
    os.chroot(".")
    os.chdir("/")
    os.close(root)
    if joined_user:
        # Root of the namespace is the sandbox's unprivileged host uid. Our host uid 0 is not
        # mapped in it, and capabilities in it survive this change (we were not its root).
        os.setgroups([])
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)


def _confine(seccomp):
    os.setsid()
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # EINVAL past the kernel's last capability
    header = _CapHeader(_CAP_V3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    buf = ctypes.create_string_buffer(seccomp, len(seccomp))
    prog = _SockFprog(len(seccomp) // 8, ctypes.cast(buf, ctypes.c_void_p))
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0),
           "seccomp")


def _listen(path):
    """The agent's socket, bound on the host as host root, mode 0600: only host root can
    connect, and the sandbox (whose view of the dir is read-only) cannot replace it."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(512)
    return sock


def _become_agent(req, seccomp, ready_w, listener):
    """The grandchild, inside the pid namespace: confine, then serve until killed."""
    try:
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        _confine(seccomp)
        keep = sorted((ready_w, listener))
        os.closerange(3, keep[0])
        os.closerange(keep[0] + 1, keep[1])
        os.closerange(keep[1] + 1, 1 << 16)
        os.environ.clear()
        os.environ.update(req["env"])
        sys.path[:] = req["path"]
        argv = ["--listen-fd", str(listener), "--ready-fd", str(ready_w)]
        if req.get("forward"):
            argv += ["--forward", req["forward"]]
        if req.get("token"):
            os.environ["ORCHARD_AGENT_TOKEN"] = req["token"]
            argv += ["--token-env", "ORCHARD_AGENT_TOKEN"]
        agent.main(argv)
    except BaseException:  # noqa: BLE001 - the launcher reads this from the log
        traceback.print_exc()
    os._exit(1)


def _spawn(conn, req, seccomp):
    """In the zygote's child: enter, fork the agent, report its pid, exit."""
    try:
        listener = _listen(req["listen"])
        _enter(req)
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            conn.close()
            os.close(ready_r)
            _become_agent(req, seccomp, ready_w, listener.fileno())
        listener.close()
        os.close(ready_w)
        ready = os.read(ready_r, 16)
        reply = {"pid": pid} if ready == b"ready\n" else {"error": "agent died while starting"}
    except BaseException as e:  # noqa: BLE001 - any failure goes back to the orchestrator
        reply = {"error": f"{type(e).__name__}: {e}"}
    with contextlib.suppress(OSError):  # the orchestrator may have given up on us
        conn.sendall(json.dumps(reply).encode() + b"\n")
    os._exit(0)


def _make_userns(conn, req):
    """In the zygote's child: a user namespace for one sandbox and an id-mapped view of each of
    its lower layers (snapshots, then the image), sent back as fds; then exit."""
    fds = []
    try:
        uid, count, lowers = int(req["uid"]), int(req["count"]), list(req["lowers"])
        made_r, made_w = os.pipe()
        done_r, done_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            # Made by the sandbox's own host uid, so that uid owns it: the launcher joins it
            # (bwrap --userns) as that uid, never as host root.
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            ok = _libc.unshare(CLONE_NEWUSER) == 0
            os.write(made_w, b"1" if ok else b"0")
            os.read(done_r, 1)
            os._exit(0)
        try:
            if os.read(made_r, 1) != b"1":
                raise OSError("unshare(CLONE_NEWUSER) failed as an unprivileged uid: enable "
                              "user namespaces (sysctl user.max_user_namespaces, "
                              "kernel.unprivileged_userns_clone)")
            for name in ("uid_map", "gid_map"):
                with open(f"/proc/{pid}/{name}", "w") as f:
                    f.write(f"0 {uid} {count}\n")
            fds.append(os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC))
        finally:
            os.write(done_w, b"x")
            with contextlib.suppress(ChildProcessError):  # SIGCHLD is ignored: reaped already
                os.waitpid(pid, 0)
        for lower in lowers:
            tree = _libc.syscall(SYS_OPEN_TREE, -100, lower.encode(),
                                 OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE)
            _check(tree, "open_tree")
            fds.append(tree)
            # Read-only too: the overlay only reads its lower layers, and this view must never
            # let anything write the shared image or snapshot as the sandbox's root.
            attr = _MountAttr(MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY, 0, 0, fds[0])
            _check(_libc.syscall(SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH | AT_RECURSIVE,
                                 ctypes.byref(attr), ctypes.sizeof(attr)),
                   f"id-mapping {lower} (mount_setattr; does its filesystem support id-mapped "
                   "mounts?)")
        reply, ancillary = {"ok": True}, fds
    except BaseException as e:  # noqa: BLE001 - any failure goes back to the orchestrator
        reply, ancillary = {"error": f"{type(e).__name__}: {e}"}, []
    with contextlib.suppress(OSError):
        socket.send_fds(conn, [json.dumps(reply).encode() + b"\n"], ancillary)
    os._exit(0)


def serve(socket_path, seccomp_path, lifeline):
    with open(seccomp_path, "rb") as f:
        seccomp = f.read()
    if os.path.exists(socket_path):
        os.unlink(socket_path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(socket_path)
    os.chmod(socket_path, 0o600)
    server.listen(256)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children exit at once; never zombies
    gc.collect()
    gc.freeze()  # keep the collector from writing to (and so copying) the shared heap
    os.write(1, b"ready\n")
    while True:
        readable, _, _ = select.select([server, lifeline], [], [])
        if lifeline in readable:
            return  # the orchestrator is gone
        conn, _ = server.accept()
        try:
            conn.settimeout(5)
            req = json.loads(conn.makefile("rb").readline())
        except (OSError, ValueError) as e:
            with contextlib.suppress(OSError):  # a client that hung up must not kill us
                conn.sendall(json.dumps({"error": f"bad request: {e}"}).encode() + b"\n")
            conn.close()
            continue
        if os.fork() == 0:
            server.close()
            if "userns" in req:
                _make_userns(conn, req["userns"])
            _spawn(conn, req, seccomp)
        conn.close()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], int(sys.argv[3]))
