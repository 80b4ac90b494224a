"""Runs CRIU inside a sandbox's namespaces; run by the orchestrator's Python as host root.

    python -I -S criu_enter.py '{"mode": "dump" | "restore", ...}'

Every host path (the CRIU bundle, the images dir, the log) is opened before any setns, and
CRIU is handed them as /proc/self/fd/N. So nothing CRIU loads or writes is looked up in the
sandbox's file system, which the sandbox controls.

dump: CRIU stays host root (it must read seccomp filters and suspend them) but joins the
sandbox's pid, net, ipc, uts, cgroup and mount namespaces. It then sees the tree as its own
and saves no mounts; only the user namespace is recorded as foreign.

restore: this process first joins the fork's cgroups, then all of the fork's namespaces,
the user namespace first, and becomes the fork's root. From there CRIU (--unprivileged) can
do nothing a process of the fork could not. The restored tree is born in the fork's cgroups
and namespaces and owned by the fork's uid range. When CRIU exits, pid 1 (the fork's agent)
adopts it.
"""

import ctypes
import json
import os
import sys
import time

LOADER = "ld-linux-x86-64.so.2"
DUMP_NAMESPACES = ("pid", "net", "ipc", "uts", "cgroup", "mnt")
# user first: it owns the rest, and joining it gives the capabilities to join them.
RESTORE_NAMESPACES = ("user", *DUMP_NAMESPACES)
# Read by the agent's browser (orchard/env/agent/server/devtools.py, RESTORED_DIR).
DEVTOOLS_DIR = "/tmp/.orchard-devtools"
# How long a restored browser waits for the agent's first browser action.
HOLD_S = 3600
PR_SET_DUMPABLE = 4

_libc = ctypes.CDLL(None, use_errno=True)


def _inheritable(path, flags):
    fd = os.open(path, flags)
    os.set_inheritable(fd, True)
    return fd


def _join(agent, names):
    fds = [(name, os.open(f"/proc/{agent}/ns/{name}", os.O_RDONLY)) for name in names]
    for name, fd in fds:
        if _libc.setns(fd, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot join the sandbox's {name} namespace: "
                               f"{os.strerror(err)}")
        os.close(fd)


def main(req):
    agent = int(req["agent"])
    if req["mode"] == "restore":
        for procs in req["cgroups"]:  # before anything is forked: children inherit them
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
    bundle = _inheritable(req["criu"], os.O_PATH | os.O_DIRECTORY)
    images = _inheritable(req["images"], os.O_PATH | os.O_DIRECTORY)
    log = _inheritable(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    # CRIU reopens it by path; as the fork's root it passes only the "other" bits. The file
    # sits in a dir only host root may enter, so only this fd reaches it.
    os.fchmod(log, 0o622)
    _join(agent, RESTORE_NAMESPACES if req["mode"] == "restore" else DUMP_NAMESPACES)
    os.chdir("/")
    args = [a.replace("{images}", f"/proc/self/fd/{images}") for a in req["args"]]
    fifos = []
    if req["mode"] == "restore":
        os.setgroups([])
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        # Pipes to the old sandbox's agent have no reader here: their writes go to a file.
        for key, path in req.get("outputs", {}).items():
            fd = _inheritable(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            args += ["--inherit-fd", f"fd[{fd}]:{key}"]
        # A browser's protocol pipe becomes two FIFOs, which this sandbox's agent opens.
        devtools = req.get("devtools")
        if devtools:
            os.makedirs(DEVTOOLS_DIR, mode=0o700, exist_ok=True)
            for name in ("commands", "answers"):
                path = f"{DEVTOOLS_DIR}/{name}"
                if os.path.lexists(path):
                    os.unlink(path)
                os.mkfifo(path, 0o600)
                fifos.append(_inheritable(path, os.O_RDWR))
                args += ["--inherit-fd", f"fd[{fifos[-1]}]:{devtools[name]}"]
    # setns(pid) moves only children into the sandbox's pid namespace.
    child = os.fork()
    if child == 0:
        root = f"/proc/self/fd/{bundle}"
        try:
            os.execv(f"{root}/lib/{LOADER}", [
                LOADER, "--library-path", f"{root}/lib", f"{root}/criu", *args,
                "--log-file", f"/proc/self/fd/{log}", "-v2"])
        finally:
            os._exit(127)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == 0 and req["mode"] == "restore" and req.get("devtools"):
        with open(f"{DEVTOOLS_DIR}/restored.json", "w") as f:
            json.dump({"pid": req["devtools"]["pid"]}, f)
        if os.fork() == 0:
            _hold(int(req["devtools"]["pid"]), fifos)
    return code


def _hold(browser, fifos):
    """Keep the FIFOs open (we hold both ends) until the agent has opened them: a browser
    whose command FIFO has no writer reads end-of-file, and exits."""
    # Not dumpable: processes of the sandbox (no capabilities) cannot reach into us.
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    os.setsid()
    # The orchestrator waits for our parent's output pipes to close, not for us.
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    low = 3
    for fd in sorted(fifos):  # nothing of the host's (the images, the log) stays open here
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)
    deadline = time.monotonic() + HOLD_S
    while time.monotonic() < deadline and os.path.exists(f"/proc/{browser}"):
        if not os.path.exists(f"{DEVTOOLS_DIR}/restored.json"):
            time.sleep(1)  # the agent took it and is opening the FIFOs
            break
        time.sleep(0.1)
    os._exit(0)


if __name__ == "__main__":
    try:
        sys.exit(main(json.loads(sys.argv[1])))
    except OSError as e:
        print(f"criu_enter: {e}", file=sys.stderr)
        sys.exit(125)
