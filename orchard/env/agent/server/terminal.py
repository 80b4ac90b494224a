"""Interactive PTY sessions, framed over an upgraded HTTP connection."""

import contextlib
import json
import os
import selectors
import signal
import struct
import threading

from .common import CHUNK, EXIT_GRACE, MARKER, WORKDIR, HTTPError, next_id, now
from .processes import kill_tree, spawn_tracked, wait_exit


def run_pty(c, query):
    import pty  # only PTY sessions pay for this import

    try:
        argv = json.loads(query.get("argv", '["/bin/sh"]'))
    except ValueError:
        raise HTTPError(400, "'argv' must be a JSON list of strings") from None
    master, slave = pty.openpty()
    _set_winsize(master, int(query.get("cols", 80)), int(query.get("rows", 24)))
    exec_id = next_id("t")
    try:
        env = {"TERM": query.get("term", "xterm-256color"), **json.loads(query.get("env", "{}"))}
    except ValueError:
        raise HTTPError(400, "'env' must be a JSON object of strings") from None
    cwd = query.get("cwd") or (WORKDIR if os.path.isdir(WORKDIR) else "/")
    if not os.path.isdir(cwd):
        raise HTTPError(400, f"cwd {cwd!r} is not a directory in the sandbox; create it first")
    proc = _spawn_pty({"argv": argv, "env": env, "cwd": cwd}, exec_id, slave)
    os.close(slave)
    c.responded = True
    c.sock.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: orchard-pty\r\n"
                   b"Connection: Upgrade\r\nX-Pty-Pid: %d\r\n\r\n" % proc.pid)

    def frame(kind, payload):
        c.sock.sendall(struct.pack(">BI", kind, len(payload)) + payload)

    def pump_input():
        try:
            while True:
                head = c.rfile.read(5)
                if len(head) < 5:
                    break
                kind, n = struct.unpack(">BI", head)
                payload = c.rfile.read(n)
                if kind == 0:
                    os.write(master, payload)
                elif kind == 1:
                    cols, rows = payload.decode().split(",")
                    _set_winsize(master, int(cols), int(rows))
                elif kind == 2:
                    _signal_group(proc.pid, payload.decode())
        except OSError:
            pass
        kill_tree(proc.pid, exec_id)

    threading.Thread(target=pump_input, daemon=True).start()
    # The session ends when its command exits, even if a process it left (nohup ...) still
    # holds the terminal, after a grace for the output still in flight.
    sel = selectors.DefaultSelector()
    sel.register(master, selectors.EVENT_READ)
    exit_fd = os.pidfd_open(proc.pid)
    sel.register(exit_fd, selectors.EVENT_READ)
    grace_end = None
    while grace_end is None or now() < grace_end:
        ready = sel.select(None if grace_end is None else max(0.0, grace_end - now()))
        if any(key.fd == exit_fd for key, _ in ready):
            sel.unregister(exit_fd)
            grace_end = now() + EXIT_GRACE
        if not any(key.fd == master for key, _ in ready):
            continue
        try:
            data = os.read(master, CHUNK)
        except OSError:  # EIO: the terminal's last writer has gone
            break
        if not data:
            break
        frame(0, data)
    sel.close()
    os.close(exit_fd)
    code = wait_exit(proc)
    os.close(master)
    frame(2, str(code).encode())


def _spawn_pty(req, exec_id, slave):
    import fcntl
    import termios

    def make_controlling_tty():
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    try:
        return spawn_tracked(
            req["argv"], env={**os.environ, **req["env"], MARKER: exec_id},
            cwd=req["cwd"], stdin=slave, stdout=slave,
            stderr=slave, start_new_session=True, preexec_fn=make_controlling_tty,
        )
    except FileNotFoundError:
        raise HTTPError(400, f"command not found in the sandbox: {req['argv'][0]!r}") from None


def _signal_group(pid, name):
    """Signal a PTY's process group by name (TERM, SIGINT, ...) or number; unknown: ignored."""
    name = name.upper().removeprefix("SIG")
    signum = int(name) if name.isdigit() else getattr(signal, "SIG" + name, None)
    if signum is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
            os.killpg(pid, signum)


def _set_winsize(fd, cols, rows):
    import fcntl
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
