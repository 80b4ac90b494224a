"""Commands: one-shot execs (optionally streamed) and background processes."""

from __future__ import annotations

import base64
import errno
import os
import selectors
import threading

from .common import CHUNK, EXIT_GRACE, PIPE_MAX, PROCESS_BUFFER, next_id, now, text_or_b64
from .processes import command_argv, kill_tree, spawn, wait_exit

# Only type checkers import these: importing typing would cost every sandbox heap.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from .protocol import ExecRequest, ExecResult, ProcessInfo, ProcessOutput, ProcessRequest


class Capped:
    """Keeps the head and tail of a stream within a byte budget; counts what it drops."""

    def __init__(self, limit):
        self.half = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, data):
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            extra = len(self.tail) - self.half
            if extra > self.half:  # trim rarely: amortised O(1) per byte
                del self.tail[:extra]
                self.dropped += extra

    def value(self):
        extra = len(self.tail) - self.half
        if extra > 0:
            del self.tail[:extra]
            self.dropped += extra
        return bytes(self.head + self.tail)


def run_exec(
    req: ExecRequest, emit: Callable[[str, bytes], None] | None = None
) -> ExecResult:
    """Run one command to completion (or timeout); ``emit(kind, bytes)`` streams output."""
    exec_id = next_id("x")
    limit = int(req.get("max_output_bytes", 10 << 20))
    timeout = req.get("timeout")
    started = now()
    proc = spawn(req, exec_id)
    outs = {proc.stdout.fileno(): ("stdout", Capped(limit)),
            proc.stderr.fileno(): ("stderr", Capped(limit))}
    sel = selectors.DefaultSelector()
    for f in (proc.stdout, proc.stderr):
        os.set_blocking(f.fileno(), False)
        sel.register(f.fileno(), selectors.EVENT_READ)
    stdin_data = memoryview(base64.b64decode(req["stdin_b64"])) if req.get("stdin_b64") else None
    if stdin_data is not None:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
    # Readable once the command itself has exited, whoever still holds its pipes.
    exit_fd = os.pidfd_open(proc.pid)
    sel.register(exit_fd, selectors.EVENT_READ)
    deadline = None if timeout is None else started + float(timeout)
    timed_out = False
    grace_end = None
    # Until the command has exited and its pipes are closed, or the grace after its exit is
    # over. Waiting for the exit too keeps a command that closed its stdout and stderr
    # (`exec >/dev/null 2>&1; sleep 30`) under its timeout.
    while sel.get_map():
        wait = None
        if grace_end is not None:
            wait = grace_end - now()
        elif deadline is not None:
            wait = deadline - now()
        if wait is not None and wait <= 0:
            if grace_end is not None:
                break  # a process left behind holds the pipes open: stop reading
            timed_out = True
            kill_tree(proc.pid, exec_id)
            grace_end = now() + 1.0
            continue
        for key, _ in sel.select(wait):
            fd = key.fd
            if fd == exit_fd:
                sel.unregister(exit_fd)
                if grace_end is None:
                    grace_end = now() + EXIT_GRACE
                continue
            if stdin_data is not None and proc.stdin is not None and fd == proc.stdin.fileno():
                try:
                    n = os.write(fd, stdin_data[:CHUNK])
                    stdin_data = stdin_data[n:]
                except (BrokenPipeError, BlockingIOError) as e:
                    if isinstance(e, BrokenPipeError):
                        stdin_data = memoryview(b"")
                if not stdin_data:
                    sel.unregister(fd)
                    proc.stdin.close()
                    stdin_data = None
                continue
            try:
                data = os.read(fd, CHUNK)
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(fd)
                continue
            name, buf = outs[fd]
            buf.add(data)
            if emit is not None:
                emit(name, data)
    held = set(sel.get_map().keys() & outs.keys())  # pipes not at end-of-file
    sel.close()
    for fd in list(held):
        # What the command wrote before it exited may still sit in the pipe (a slow
        # streaming client kept us from reading it during the grace): take all of it.
        name, buf = outs[fd]
        budget = PIPE_MAX  # a pipe holds no more; a process left writing does not hold us
        while budget > 0:
            try:
                data = os.read(fd, min(CHUNK, budget))
            except BlockingIOError:
                break
            budget -= len(data)
            if not data:
                held.discard(fd)
                break
            buf.add(data)
            if emit is not None:
                emit(name, data)
    os.close(exit_fd)
    if timed_out:
        kill_tree(proc.pid, exec_id)
    code = wait_exit(proc)
    if proc.stdin is not None and not proc.stdin.closed:
        proc.stdin.close()
    for f in (proc.stdout, proc.stderr):
        if f.fileno() in held and not timed_out:
            DRAINER.adopt(f)
        else:
            f.close()
    result = {"exit_code": 124 if timed_out else code, "timed_out": timed_out,
              "started_at": started, "completed_at": now()}
    for _fd, (name, buf) in outs.items():
        text_or_b64(buf.value(), name, result)
        result[name + "_dropped"] = buf.dropped
    return result


class _Drainer:
    """Reads and drops what processes left behind by an exec still write to its pipes.

    Closing the pipes instead would kill them with SIGPIPE on their next write (a server's
    access log, say). One thread serves every such pipe, started on first use; epoll sees a
    pipe registered while it waits, so no wake-up is needed.
    """

    def __init__(self):
        self._sel = None
        self._lock = threading.Lock()

    def adopt(self, f):
        with self._lock:
            if self._sel is None:
                self._sel = selectors.EpollSelector()
                threading.Thread(target=self._run, daemon=True).start()
            self._sel.register(f.fileno(), selectors.EVENT_READ, f)

    def _run(self):
        while True:
            for key, _ in self._sel.select():
                try:
                    data = os.read(key.fd, CHUNK)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    with self._lock:
                        self._sel.unregister(key.fd)
                    key.data.close()


DRAINER = _Drainer()


class BackgroundProcess:
    """A long-lived process with rolling output buffers that clients read by offset."""

    def __init__(self, req: ProcessRequest) -> None:
        self.id = next_id("p")
        self.command = req.get("command") or " ".join(req.get("argv") or ())
        self.argv = command_argv(req)
        self.started_at = now()
        self.buffers = {"stdout": bytearray(), "stderr": bytearray()}
        self.base = {"stdout": 0, "stderr": 0}
        self.exit_code = None
        self.lock = threading.Lock()
        # The pump's thread starts before the process does. A process that forks up to the
        # pids limit at once (a fork loop) would otherwise leave no pid for the thread, and
        # it would run on untracked while the request failed.
        self.proc = None
        self._spawned = threading.Event()
        try:
            threading.Thread(target=self._pump, daemon=True).start()
        except RuntimeError:
            raise BlockingIOError(errno.EAGAIN, "no thread for the process's output") from None
        try:
            self.proc = spawn({**req, "stdin_b64": None}, self.id)
        finally:
            self._spawned.set()

    def _pump(self):
        self._spawned.wait()
        if self.proc is None:
            return  # the spawn failed, and its error went to the request
        sel = selectors.DefaultSelector()
        names = {self.proc.stdout.fileno(): "stdout", self.proc.stderr.fileno(): "stderr"}
        for fd in names:
            sel.register(fd, selectors.EVENT_READ)
        # The process has ended when it exits, even if what it left running keeps writing
        # (their output still lands in its buffers).
        exit_fd = os.pidfd_open(self.proc.pid)
        sel.register(exit_fd, selectors.EVENT_READ)
        while sel.get_map():
            for key, _ in sel.select():
                if key.fd == exit_fd:
                    sel.unregister(exit_fd)
                    os.close(exit_fd)
                    self.exit_code = wait_exit(self.proc)
                    continue
                data = os.read(key.fd, CHUNK)
                if not data:
                    sel.unregister(key.fd)
                    continue
                with self.lock:
                    buf = self.buffers[names[key.fd]]
                    buf += data
                    extra = len(buf) - PROCESS_BUFFER
                    if extra > 0:
                        del buf[:extra]
                        self.base[names[key.fd]] += extra
        sel.close()
        self.proc.stdout.close()
        self.proc.stderr.close()

    def info(self) -> ProcessInfo:
        return {"process_id": self.id, "command": self.command, "pid": self.proc.pid,
                "running": self.exit_code is None, "exit_code": self.exit_code,
                "started_at": self.started_at}

    def output(self, offsets: dict[str, int]) -> ProcessOutput:
        out = {"process_id": self.id, "running": self.exit_code is None,
               "exit_code": self.exit_code}
        with self.lock:
            for name in ("stdout", "stderr"):
                start = max(offsets.get(name, 0), self.base[name])
                data = bytes(self.buffers[name][start - self.base[name] :])
                out[name + "_b64"] = base64.b64encode(data).decode()
                out[name + "_offset"] = start + len(data)
                out[name + "_dropped"] = start - offsets.get(name, 0)
        return out

    def kill(self) -> None:
        kill_tree(self.proc.pid, self.id)


PROCESSES = {}
