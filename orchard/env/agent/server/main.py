"""The agent's entry point: listening sockets, the accept loop and the model relay."""

import contextlib
import json
import os
import selectors
import signal
import socket
import sys
import threading

from .connection import OUT_OF_PIDS, Conn
from .processes import ORPHANS, become_subreaper


def _pipe(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _forward(conn, target):
    """Relay one TCP connection to the Unix socket target, both ways, until both sides end."""
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        up.connect(target)
    except OSError as e:
        body = json.dumps({"error": {
            "message": f"the model endpoint relay {target} is not answering ({e}); the "
                       "orchestrator serving this sandbox may have restarted: retry shortly",
            "type": "orchard_relay_error", "code": 502}}).encode()
        with contextlib.suppress(OSError):
            conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/json\r\n"
                         b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        conn.close()
        up.close()
        return
    back = threading.Thread(target=_pipe, args=(up, conn), daemon=True)
    back.start()
    _pipe(conn, up)
    back.join()
    conn.close()
    up.close()


def _serve(sock, token):
    Conn(sock, token).serve()


def main(argv):
    unix = tcp = token_file = token_env = listen_fd = None
    ready_fd = lifeline = None
    forwards = {}  # listening socket -> Unix socket path it relays to
    args = iter(argv)
    for a in args:
        if a == "--unix":
            unix = next(args)
        elif a == "--forward":
            # HOST:PORT=PATH: the sandbox's way out to one service (the recording proxy), for
            # sandboxes whose network namespace has nothing but loopback.
            listen, _, target = next(args).partition("=")
            host, _, port = listen.rpartition(":")
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, int(port)))
            s.listen(128)
            forwards[s] = target
        elif a == "--listen-fd":
            # A socket already bound and listening, made by whoever started us (the local
            # backend binds it on the host, where the sandbox cannot replace it).
            listen_fd = int(next(args))
        elif a == "--tcp":
            tcp = next(args)
        elif a == "--token-file":
            token_file = next(args)
        elif a == "--token-env":
            # Popped so that no command the agent runs inherits it.
            token_env = os.environ.pop(next(args), "").encode().strip() or None
        elif a == "--ready-fd":
            ready_fd = int(next(args))
        elif a == "--lifeline-fd":
            # A pipe's read end whose writer is our orchestrator: at its EOF we end, and as
            # the sandbox's pid 1 we take the whole sandbox with us.
            lifeline = int(next(args))
        else:
            sys.exit(f"orchard-agent: unknown argument {a!r}")
    token = token_env
    if token_file:
        with open(token_file, "rb") as f:
            token = f.read().strip()
    socks = []
    if listen_fd is not None:
        socks.append(socket.socket(fileno=listen_fd))
    if unix:
        if os.path.exists(unix):
            os.unlink(unix)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(unix)
        os.chmod(unix, 0o600)
        socks.append(s)
    if tcp:
        host, _, port = tcp.rpartition(":")
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host.strip("[]"), int(port)))
        socks.append(s)
    if not socks:
        sys.exit("orchard-agent: give --listen-fd FD, --unix PATH and/or --tcp HOST:PORT")
    for s in socks:
        s.listen(512)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # As a container's PID 1 the kernel ignores an unhandled SIGTERM: exit on it, so a pod
    # deletion does not wait out the whole grace period.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    become_subreaper()
    if ready_fd is not None:
        os.write(ready_fd, b"ready\n")
        os.close(ready_fd)
    sel = selectors.DefaultSelector()
    for s in [*socks, *forwards]:
        sel.register(s, selectors.EVENT_READ)
    # SIGCHLD reaches the reaper through the wakeup fd, read by this loop. The Python-level
    # handler must do nothing: one that set the Event could be re-entered by the next SIGCHLD
    # while holding the Event's lock, deadlocking this thread and the reaper, and the zombies
    # of a killed fork bomb then held the sandbox's pids limit for good.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel.register(wake_r, selectors.EVENT_READ)
    if lifeline is not None:
        sel.register(lifeline, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            if key.fileobj == lifeline and not os.read(lifeline, 1):
                os._exit(0)
            if key.fileobj in (wake_r, lifeline):
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 4096):
                        pass
                ORPHANS.set()
                continue
            if key.data == "refused":  # its client is done with the 503 once it hangs up
                try:
                    if key.fileobj.recv(65536):
                        continue
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                sel.unregister(key.fileobj)
                key.fileobj.close()
                continue
            conn, _addr = key.fileobj.accept()
            if conn.family != socket.AF_UNIX:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            forward = forwards.get(key.fileobj)
            target, args = (_forward, (conn, forward)) if forward else (_serve, (conn, token))
            try:
                threading.Thread(target=target, args=args, daemon=True).start()
            except RuntimeError:  # no thread to spare: the sandbox's pids limit is reached
                if forward:
                    conn.close()
                    continue
                # Closed at once, the socket would discard (Unix) or reset (TCP) the request
                # still arriving, and the client would lose the answer: keep it open, unread,
                # until the client hangs up.
                with contextlib.suppress(OSError):
                    Conn(conn, token).send(503, OUT_OF_PIDS, headers=("Connection: close",))
                    conn.shutdown(socket.SHUT_WR)
                conn.setblocking(False)
                sel.register(conn, selectors.EVENT_READ, "refused")
