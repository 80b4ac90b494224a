"""Spawning commands, reaping orphans and killing whole process trees."""

import contextlib
import os
import signal
import subprocess
import threading
import time

from .common import MARKER, WORKDIR, HTTPError, exit_status


def _processes():
    """(pid, state, ppid, pgid, sid) for every process visible in this pid namespace."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        yield int(name), fields[0], int(fields[1]), int(fields[2]), int(fields[3])


def _proc_table():
    """(pid, ppid, pgid, sid) of every live process; zombies are dead already."""
    return [(pid, ppid, pg, sid) for pid, state, ppid, pg, sid in _processes() if state != b"Z"]


def _has_marker(pid, marker):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            # Whole NUL-separated entries only: "ID=p2-1" must not match "ID=p2-12".
            return b"\0" + marker + b"\0" in b"\0" + f.read() + b"\0"
    except OSError:
        return False


def kill_tree(root_pid, exec_id):
    """SIGKILL a command's whole tree: its session, its descendants, and any daemon that
    escaped both (found by the exec-id marker every command inherits in its environment)."""
    me = os.getpid()
    marker = f"{MARKER}={exec_id}".encode()
    for _ in range(50):
        table = _proc_table()
        children = {}
        for pid, ppid, _pg, _sid in table:
            children.setdefault(ppid, []).append(pid)
        doomed = {pid for pid, _pp, pg, sid in table if root_pid in (pg, sid)}
        stack = [root_pid]
        while stack:
            pid = stack.pop()
            doomed.add(pid)
            stack.extend(children.get(pid, ()))
        doomed.update(pid for pid, *_ in table if pid not in doomed and _has_marker(pid, marker))
        live = {pid for pid, *_ in table}
        alive = (doomed & live) - {me, 1}
        if not alive:
            return
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.002)


def command_argv(req):
    if req.get("command") is not None:
        shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
        return [shell, "-lc" if req.get("login_shell") else "-c", req["command"]]
    return req.get("argv")


# Orphaned descendants of commands are re-parented to the agent (a child subreaper), not to
# the sandbox's pid 1, which may not reap. The agent reaps every zombie child it did not
# spawn itself; the ones it spawned are left to their Popen.wait().
_TRACKED = set()
_SPAWN_LOCK = threading.Lock()
ORPHANS = threading.Event()


def spawn_tracked(*args, **kwargs):
    with _SPAWN_LOCK:
        proc = subprocess.Popen(*args, **kwargs)
        _TRACKED.add(proc.pid)
    return proc


def wait_exit(proc):
    code = proc.wait()
    _TRACKED.discard(proc.pid)
    return exit_status(code)


def _reap_orphans():
    me = os.getpid()
    while True:
        # Woken by the main loop on SIGCHLD; the timeout is a safety net: a wake-up lost in a
        # storm of exits would otherwise leave zombies holding the sandbox's pids limit.
        ORPHANS.wait(1.0)
        ORPHANS.clear()
        with _SPAWN_LOCK:
            for pid, state, ppid, _pg, _sid in _processes():
                if state == b"Z" and ppid == me and pid not in _TRACKED:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)


def become_subreaper():
    import ctypes

    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    threading.Thread(target=_reap_orphans, daemon=True).start()


def spawn(req, exec_id):
    argv = command_argv(req)
    if not argv or not all(isinstance(a, str) for a in argv):
        raise HTTPError(400, "'argv' must be a non-empty list of strings")
    cwd = req.get("cwd") or (WORKDIR if os.path.isdir(WORKDIR) else "/")
    if not os.path.isdir(cwd):
        raise HTTPError(400, f"cwd {cwd!r} is not a directory in the sandbox; create it first")
    env = dict(os.environ)
    env.update(req.get("env") or {})
    env[MARKER] = exec_id
    stdin = subprocess.PIPE if req.get("stdin_b64") else subprocess.DEVNULL
    try:
        return spawn_tracked(
            argv, cwd=cwd, env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, close_fds=True,
        )
    except FileNotFoundError:
        raise HTTPError(400, f"command not found in the sandbox: {argv[0]!r}") from None
    except PermissionError as e:
        raise HTTPError(400, f"cannot execute {argv[0]!r}: {e.strerror}") from None
