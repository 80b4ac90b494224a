"""A fork-server that starts sandboxes: one pre-loaded interpreter forks every agent.

Starting a Python agent in each sandbox costs ~30 ms and ~6 MiB of private heap, and forking
the orchestrator (a big process) to launch bwrap costs milliseconds more. So this small
process, started once per orchestrator, does both for each request:

  launcher child: join the sandbox's cgroups -> a private mount namespace -> mount the overlay
    -> exec bwrap, which builds the sandbox (namespaces, mounts, seccomp) around a holder that
    parks on --block-fd forever (the holder keeps the write end too, so it never sees EOF).
  spawner child: wait until bwrap has finished (the holder's capabilities are dropped only
    after the last mount) -> join the cgroups -> setns(ipc, uts, net, cgroup, pid, mnt) ->
    chroot to the holder's root -> fork the agent inside the pid namespace -> new session ->
    drop every capability (bounding set too) -> no_new_privs -> bwrap's seccomp filter ->
    close every inherited fd -> a clean environment -> imports resolve from the read-only
    interpreter bundle mounted in the sandbox -> serve.

The agent shares the zygote's pages copy-on-write (``gc.freeze`` keeps the collector from
touching them). bwrap is the zygote's child: with --die-with-parent it dies with the zygote,
which exits when its lifeline (a pipe from the orchestrator) closes.

Protocol: one JSON request line per connection, one JSON reply line:
  {"procs", "overlay", "root", "log", "bwrap": argv, "env", "socket", "path", "timeout"}
  -> {"agent": PID, "holder": PID} or {"error": "..."}
"""

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
import time
import traceback

# Everything the agent may ever import must be loaded here: inside the sandbox only the
# bundle's stdlib is reachable (see "path"), and modules loaded here are shared, not copied.
PRELOADED = (fcntl, pty, termios, traceback)

# Loaded by path, not as orchard.env.agent.server: the orchard package pulls in the SDK and
# its dependencies, which every agent would then carry.
AGENT_SOURCE = os.path.join(os.path.dirname(__file__), "..", "..", "agent", "server.py")
_spec = importlib.util.spec_from_file_location("orchard_agent", AGENT_SOURCE)
agent = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(agent)

SECCOMP_FD, BLOCK_FD, BLOCK_W_FD = 3, 4, 5  # where bwrap finds its pipes
USER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CLONE_NEWNS = 0x00020000
MS_REC, MS_PRIVATE = 0x4000, 1 << 18
_NAMESPACES = (("ipc", 0x08000000), ("uts", 0x04000000), ("net", 0x40000000),
               ("cgroup", 0x02000000), ("pid", 0x20000000), ("mnt", 0x00020000))
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


def _check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _join_cgroups(req):
    for path in req["procs"]:
        with open(path, "w") as f:
            f.write(str(os.getpid()))


def _exec_bwrap(req, seccomp):
    """The launcher child: becomes bwrap, inside the sandbox's cgroups and overlay."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # bwrap watches its child by signal
        os.setsid()
        _join_cgroups(req)
        # The overlay lives in a mount namespace of its own, so it dies with the sandbox.
        _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None),
               "mount --make-rprivate /")
        _check(_libc.mount(b"orchard-overlay", req["root"].encode(), b"overlay", 0,
                           req["overlay"].encode()), "mount overlay")
        seccomp_r, seccomp_w = os.pipe()
        os.write(seccomp_w, seccomp)  # a few KiB: fits the pipe buffer
        os.close(seccomp_w)
        block_r, block_w = os.pipe()
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        # Park every fd above the targets first so no dup2 overwrites one still needed.
        high = [os.dup(fd) for fd in (seccomp_r, block_r, block_w, log)]
        for fd in high:
            os.set_inheritable(fd, False)
        for target, fd in zip((SECCOMP_FD, BLOCK_FD, BLOCK_W_FD), high, strict=False):
            os.dup2(fd, target)
        os.dup2(high[3], 1)
        os.dup2(high[3], 2)
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.closerange(BLOCK_W_FD + 1, 1 << 16)
        os.execvpe("bwrap", req["bwrap"], {"PATH": USER_PATH})
    except BaseException:  # noqa: BLE001 - the spawner reports the launcher's death
        traceback.print_exc()
    os._exit(127)


def _await_holder(launcher, timeout):
    """bwrap's sandboxed child once it is set up: bwrap drops its capabilities only after
    the last mount and the chroot, so an empty effective set means the namespaces are final."""
    deadline = time.monotonic() + timeout
    delay = 0.0002
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{launcher}/task/{launcher}/children") as f:
                children = f.read().split()
        except OSError:
            raise RuntimeError("bwrap exited while setting up the sandbox") from None
        if children:
            try:
                with open(f"/proc/{children[0]}/status") as f:
                    caps = next(line for line in f if line.startswith("CapEff:"))
                if int(caps.split()[1], 16) == 0:
                    return int(children[0])
            except (OSError, StopIteration):
                pass
        time.sleep(delay)
        delay = min(delay * 2, 0.01)
    raise RuntimeError(f"bwrap did not finish setting up within {timeout:.0f}s")


def _enter(req, holder):
    """In the spawner: join the holder's cgroups and namespaces and its root."""
    _join_cgroups(req)
    fds = []
    for name, flag in _NAMESPACES:
        try:
            fds.append((name, flag, os.open(f"/proc/{holder}/ns/{name}", os.O_RDONLY)))
        except FileNotFoundError:
            if name != "cgroup":  # older kernels have no cgroup namespace
                raise
    root = os.open(f"/proc/{holder}/root", os.O_RDONLY | os.O_DIRECTORY)
    for name, flag, fd in fds:
        _check(_libc.setns(fd, flag), f"setns({name})")
        os.close(fd)
    # setns(mnt) puts us at the namespace's root, not bwrap's chroot inside it.
    os.fchdir(root)
    os.chroot(".")
    os.chdir("/")
    os.close(root)


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


def _become_agent(req, seccomp, ready_w):
    """The grandchild, inside the pid namespace: confine, then serve until killed."""
    try:
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        _confine(seccomp)
        os.closerange(3, ready_w)
        os.closerange(ready_w + 1, 1 << 16)
        os.environ.clear()
        os.environ.update(req["env"])
        sys.path[:] = req["path"]
        agent.main(["--unix", req["socket"], "--ready-fd", str(ready_w)])
    except BaseException:  # noqa: BLE001 - the launcher reads this from the log
        traceback.print_exc()
    os._exit(1)


def _spawn(conn, req, seccomp, launcher):
    """The spawner child: wait for bwrap, enter, fork the agent, report its pid, exit."""
    try:
        holder = _await_holder(launcher, float(req.get("timeout", 30)))
        _enter(req, holder)
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            conn.close()
            os.close(ready_r)
            _become_agent(req, seccomp, ready_w)
        os.close(ready_w)
        ready = os.read(ready_r, 16)
        reply = ({"agent": pid, "holder": holder} if ready == b"ready\n"
                 else {"error": "the agent died while starting"})
    except BaseException as e:  # noqa: BLE001 - any failure goes back to the orchestrator
        reply = {"error": f"{type(e).__name__}: {e}"}
    conn.sendall(json.dumps(reply).encode() + b"\n")
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
            conn.sendall(json.dumps({"error": f"bad request: {e}"}).encode() + b"\n")
            conn.close()
            continue
        launcher = os.fork()
        if launcher == 0:
            server.close()
            conn.close()
            _exec_bwrap(req, seccomp)
        if os.fork() == 0:
            server.close()
            _spawn(conn, req, seccomp, launcher)
        conn.close()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], int(sys.argv[3]))
