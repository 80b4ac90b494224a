"""A fork-server for sandboxes: one pre-loaded interpreter forks every sandbox's agent.

Starting a Python agent in each sandbox costs ~30 ms and ~6 MiB of private heap. Instead, a
child of this zygote (the launcher) builds the sandbox by syscalls (``jail.py``: one clone3
for the user, mount, pid, ipc, uts and net namespaces, born into the sandbox's cgroup; id
maps; overlay and bind mounts), and the clone, pid 1 of the sandbox, pivots into its root and
becomes the agent. It shares the zygote's pages copy-on-write (``gc.freeze`` keeps the
collector from touching them) and never execs: an idle sandbox costs one process, a fraction
of a fresh interpreter, and starts in a few milliseconds.

What the agent does, in order, once its root is in place and before it runs any agent code:
new session -> drop every capability (bounding set too) -> no_new_privs -> the sandbox's
seccomp filter -> close every inherited fd but its listening socket (bound on the host by the
launcher, in a dir only host root may write), its ready fd, its lifeline and the network
pipe -> a clean environment -> imports resolve from the read-only interpreter bundle mounted
in the sandbox. As pid 1 it also reaps every orphan of the sandbox, and its death ends the
sandbox.

Protocol: one JSON line per connection on a Unix socket, answered with one JSON line:
  {"launch": {...}} (see ``_launch`` and ``launch.Launcher.request``), with the write end of
  the sandbox's network pipe attached (SCM_RIGHTS) when it is networked
  -> {"pid": AGENT, "launcher": PID or null} or {"error": "..."}
The zygote exits when its lifeline (a pipe from the orchestrator) closes; agents launched
with "lifeline" watch the same pipe, so those sandboxes end with the orchestrator too.
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


def _load(name, path):
    """Loaded by path, not as a package module: the orchard package pulls in the SDK and its
    dependencies, which every sandbox would then carry."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HERE = os.path.dirname(__file__)
jail = _load("orchard_jail", os.path.join(HERE, "jail.py"))
agent = _load("orchard_agent_boot",
              os.path.join(HERE, "..", "..", "agent", "server", "boot.py")).load()
# The agent imports its browser only when asked to browse, and inside the sandbox this host
# path is gone; loaded here, its pages are shared by every sandbox until one browses.
importlib.import_module("orchard_agent.browser")

PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
_CAP_V3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _confine(seccomp):
    os.setsid()
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # EINVAL past the kernel's last capability
    header = _CapHeader(_CAP_V3, 0)
    data = (_CapData * 2)()
    jail.check(_libc.capset(ctypes.byref(header), data), "capset")
    jail.check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    buf = ctypes.create_string_buffer(seccomp, len(seccomp))
    prog = _SockFprog(len(seccomp) // 8, ctypes.cast(buf, ctypes.c_void_p))
    jail.check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0),
               "seccomp")


def _close_all_but(*keep):
    low = 3
    for fd in sorted(k for k in keep if k >= 3):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


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


def _become_agent(req, seccomp, ready_w, listener, lifeline, keep):
    """The sandbox's pid 1, once its root is in place: confine, then serve until killed (its
    death ends the pid namespace, and so the sandbox)."""
    try:
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        _confine(seccomp)
        _close_all_but(ready_w, listener, lifeline, *keep)
        os.environ.clear()
        os.environ.update(req["env"])
        sys.path[:] = req["path"]
        argv = ["--listen-fd", str(listener), "--ready-fd", str(ready_w)]
        if lifeline >= 0:
            argv += ["--lifeline-fd", str(lifeline)]
        if req.get("forward"):
            argv += ["--forward", req["forward"]]
        if req.get("token"):
            os.environ["ORCHARD_AGENT_TOKEN"] = req["token"]
            argv += ["--token-env", "ORCHARD_AGENT_TOKEN"]
        agent.main(argv)
    except BaseException:  # noqa: BLE001 - the zygote's log keeps it
        traceback.print_exc()
    os._exit(1)


def _boot(req, seccomp, report, listener, lifeline, keep):
    """The clone: once the launcher's mounts are in, its root, then the agent."""
    try:
        msg, fds, _, _ = socket.recv_fds(report, 16, 1)
        if msg != b"go" or len(fds) != 1:
            os._exit(1)  # the launcher failed and says why
        jail.become_root()
        if req.get("last_pid"):
            jail.reserve_pids(req["last_pid"])
        jail.pivot(fds[0], req["hostname"])
    except BaseException as e:  # noqa: BLE001 - the launcher reports it
        with contextlib.suppress(OSError):
            report.sendall(f"error {type(e).__name__}: {e}\n".encode())
        os._exit(1)
    _become_agent(req, seccomp, report.fileno(), listener.fileno(), lifeline, keep)


def _mount_all(req, agent_pid, trees):
    """In the agent's mount namespace: the disk, the overlay, what is bound into it."""
    jail.enter_mounts(agent_pid)
    stage, upper, work = req["stage"], req["upper"], req["work"]
    if req.get("disk"):
        os.makedirs(f"{stage}/disk", exist_ok=True)
        jail.loop_mount(req["disk"], f"{stage}/disk")
        upper, work = f"{stage}/disk/upper", f"{stage}/disk/work"
    lower = ":".join(f"/proc/self/fd/{fd}" for fd in trees["lowers"])
    jail.mount("orchard-overlay", f"{stage}/root", "overlay", jail.MS_NOSUID | jail.MS_NODEV,
               f"lowerdir={lower},upperdir={upper},workdir={work}")
    root = jail.Root(f"{stage}/root", int(req["uid"]))
    for (_, dest), tree in zip(req["host_view"], trees["host_view"], strict=True):
        root.bind(tree, dest, None, f"/{dest}")
    for (dest, _), tree in zip(req["masks"], trees["masks"], strict=True):
        root.bind(tree, dest, None, f"a mask over /{dest}")
    for dest, mode in req["dirs"]:
        os.close(root.open(dest, "dir", mode))
    for (_, dest, make), tree in zip(req["binds"], trees["binds"], strict=True):
        root.bind(tree, dest, make, f"/{dest}")
    for name in ("proc", "dev"):  # the agent's own mounts go there (see jail.pivot)
        os.close(root.open(name, "dir", follow=False))
    root.make_dev(trees["devices"])
    return root


def _launch(conn, req, seccomp, lifeline, fds):
    """In the zygote's child, host root: the sandbox's launcher (see ``jail.py``)."""
    report, theirs = socket.socketpair()
    agent_pid = -1
    try:
        listener = _listen(req["listen"])
        cgroup = os.open(req["cgroup"], os.O_PATH | os.O_DIRECTORY) if req["cgroup"] else -1
        agent_pid = jail.clone_sandbox(cgroup)
        if agent_pid == 0:
            report.close()
            _boot(req, seccomp, theirs, listener, lifeline if req.get("lifeline") else -1, fds)
        theirs.close()
        listener.close()
        for fd in fds:
            os.close(fd)
        for path in req["procs"]:  # the v1 hierarchies, before it runs anything
            with open(path, "w") as f:
                f.write(str(agent_pid))
        jail.map_ids(agent_pid, int(req["uid"]), int(req["count"]))
        userns = os.open(f"/proc/{agent_pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        # Made in our (the host's) mount namespace, where no mount is locked.
        trees = {
            "lowers": [jail.idmapped(lower, userns) for lower in req["lowers"]],
            "host_view": [jail.bind_tree(src, jail.RO) for src, _ in req["host_view"]],
            "masks": [jail.fs_tree("tmpfs", {"size": "4k"}, jail.RO) if kind == "dir"
                      else jail.bind_tree("/dev/null", jail.RO) for _, kind in req["masks"]],
            "binds": [jail.bind_tree(src, jail.RO) for src, _, _ in req["binds"]],
            "devices": [jail.bind_tree(f"/dev/{name}", jail.MOUNT_ATTR_NOSUID
                                       | jail.MOUNT_ATTR_NOEXEC) for name in jail.DEVICES],
        }
        root = _mount_all(req, agent_pid, trees)
        if req.get("disk"):
            # We stay, in the sandbox's cgroups, to keep the disk's mount where snapshots
            # reach it; the agent's mount namespace is a copy the host cannot enter.
            for path in (*req["procs"], f"{req['cgroup']}/cgroup.procs"):
                with open(path, "w") as f:
                    f.write(str(os.getpid()))
        socket.send_fds(report, [b"go"], [root.fd])
        ready = report.makefile("rb").readline().decode()
        if ready != "ready\n":
            raise OSError(ready[6:].strip() if ready else "the sandbox died while starting")
        reply = {"pid": agent_pid, "launcher": os.getpid() if req.get("disk") else None}
    except BaseException as e:  # noqa: BLE001 - any failure goes back to the orchestrator
        if agent_pid > 0:
            with contextlib.suppress(OSError):
                os.kill(agent_pid, signal.SIGKILL)
        reply = {"error": f"{type(e).__name__}: {e}"}
    with contextlib.suppress(OSError):  # the orchestrator may have given up on us
        conn.sendall(json.dumps(reply).encode() + b"\n")
    if reply.get("launcher"):
        _close_all_but()
        with contextlib.suppress(ChildProcessError):  # SIGCHLD is ignored: returns at its end
            os.waitpid(agent_pid, 0)
    os._exit(0)


def _read_request(conn):
    """One JSON line and the fds that came with it."""
    data, fds = b"", []
    while not data.endswith(b"\n"):
        chunk, more, _, _ = socket.recv_fds(conn, 1 << 16, 4)
        if not chunk:
            break
        data, fds = data + chunk, fds + more
    return json.loads(data), fds


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
        fds = []
        try:
            conn.settimeout(5)
            req, fds = _read_request(conn)
            req = req["launch"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            with contextlib.suppress(OSError):  # a client that hung up must not kill us
                conn.sendall(json.dumps({"error": f"bad request: {e!r}"}).encode() + b"\n")
            conn.close()
            for fd in fds:
                os.close(fd)
            continue
        if os.fork() == 0:
            server.close()
            conn.settimeout(None)
            _launch(conn, req, seccomp, lifeline, fds)
        conn.close()
        for fd in fds:
            os.close(fd)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], int(sys.argv[3]))
