"""The in-sandbox agent: a small HTTP/1.1 server over a Unix socket or TCP.

It runs from the read-only interpreter bundle mounted into the sandbox, so it must use the
standard library only and import as little as possible (every sandbox pays for its heap).
One thread per connection; one blocking ``waitpid`` per command; orphans are reaped on SIGCHLD
(with a once-a-second sweep as a safety net).

Wire protocol (the orchestrator's ``agent.client`` is the other side):
  GET  /health                          -> {"status": "ok", "pid", "processes"}
  POST /exec        {argv, cwd, env, stdin_b64, timeout, max_output_bytes, stream}
                    -> {exit_code, stdout|stdout_b64, stderr|stderr_b64, *_dropped, timed_out,
                        started_at, completed_at}; with stream=true chunked NDJSON events
  POST /processes   {argv, cwd, env}    -> process info ; GET /processes, GET|DELETE /processes/ID
  GET  /processes/ID/output?stdout_offset=&stderr_offset=
  PUT  /files?path=&mode=  (raw body)   GET /files?path= (raw)   DELETE /files?path=&recursive=
  GET  /files/list?path=                POST /files/mkdir?path=
  POST /patch       {patch, cwd, timeout}
  GET  /pty?argv=JSON&cols=&rows=  with "Upgrade: orchard-pty" -> 101, then framed bytes both
                    ways: [type u8][len u32][payload]; types: 0 data, 1 resize "cols,rows",
                    2 exit "code".
Errors are JSON {"detail": "..."} with a 4xx/5xx status. A request with "Expect: 100-continue"
gets "100 Continue" only once the agent is ready to read its body, so a refused upload is
never sent; one request never gets two answers (an error after a response closes instead).
"""

import base64
import contextlib
import hmac
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from urllib.parse import parse_qs, unquote, urlsplit

MARKER = "ORCHARD_EXEC_ID"
WORKDIR = "/workspace"
CHUNK = 1 << 16
PROCESS_BUFFER = 1 << 20
DRAIN_LIMIT = 1 << 20
# How long an exec keeps reading after its command exited, for output still in the pipes.
# Processes it left running in the background may hold the pipes open for ever: past this,
# their output is drained and dropped.
EXIT_GRACE = 0.1
PIPE_MAX = 1 << 20  # the most a Linux pipe buffers (/proc/sys/fs/pipe-max-size default)
_REASONS = {
    101: "Switching Protocols", 200: "OK", 400: "Bad Request", 401: "Unauthorized",
    404: "Not Found", 405: "Method Not Allowed", 409: "Conflict", 413: "Payload Too Large",
    500: "Internal Server Error", 503: "Service Unavailable",
}


class HTTPError(Exception):
    def __init__(self, status, detail):
        super().__init__(detail)
        self.status = status
        self.detail = detail


def _now():
    return time.time()


def _text_or_b64(data, key, out):
    try:
        out[key] = data.decode()
    except UnicodeDecodeError:
        out[key] = ""
        out[key + "_b64"] = base64.b64encode(data).decode()


def _resolve(path):
    if not path:
        raise HTTPError(400, "missing 'path' query parameter")
    return os.path.normpath(path if path.startswith("/") else os.path.join(WORKDIR, path))


# --- process trees -----------------------------------------------------------------------


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


def _argv(req):
    if req.get("command") is not None:
        shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
        return [shell, "-lc" if req.get("login_shell") else "-c", req["command"]]
    return req.get("argv")


# Orphaned descendants of commands are re-parented to the agent (a child subreaper), not to
# the sandbox's pid 1, which may not reap. The agent reaps every zombie child it did not
# spawn itself; the ones it spawned are left to their Popen.wait().
_TRACKED = set()
_SPAWN_LOCK = threading.Lock()
_ORPHANS = threading.Event()


def _tracked(*args, **kwargs):
    with _SPAWN_LOCK:
        proc = subprocess.Popen(*args, **kwargs)
        _TRACKED.add(proc.pid)
    return proc


def _wait(proc):
    code = proc.wait()
    _TRACKED.discard(proc.pid)
    return _exit_code(code)


def _reap_orphans():
    me = os.getpid()
    while True:
        # Woken by the main loop on SIGCHLD; the timeout is a safety net: a wake-up lost in a
        # storm of exits would otherwise leave zombies holding the sandbox's pids limit.
        _ORPHANS.wait(1.0)
        _ORPHANS.clear()
        with _SPAWN_LOCK:
            for pid, state, ppid, _pg, _sid in _processes():
                if state == b"Z" and ppid == me and pid not in _TRACKED:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)


def _become_subreaper():
    import ctypes

    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    threading.Thread(target=_reap_orphans, daemon=True).start()


def _spawn(req, exec_id):
    argv = _argv(req)
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
        return _tracked(
            argv, cwd=cwd, env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, close_fds=True,
        )
    except FileNotFoundError:
        raise HTTPError(400, f"command not found in the sandbox: {argv[0]!r}") from None
    except PermissionError as e:
        raise HTTPError(400, f"cannot execute {argv[0]!r}: {e.strerror}") from None


_exec_counter = [0]
_exec_lock = threading.Lock()


def _next_id(prefix):
    with _exec_lock:
        _exec_counter[0] += 1
        return f"{prefix}{os.getpid()}-{_exec_counter[0]}"


def run_exec(req, emit=None):
    """Run one command to completion (or timeout); ``emit(kind, bytes)`` streams output."""
    exec_id = _next_id("x")
    limit = int(req.get("max_output_bytes", 10 << 20))
    timeout = req.get("timeout")
    started = _now()
    proc = _spawn(req, exec_id)
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
            wait = grace_end - _now()
        elif deadline is not None:
            wait = deadline - _now()
        if wait is not None and wait <= 0:
            if grace_end is not None:
                break  # a process left behind holds the pipes open: stop reading
            timed_out = True
            kill_tree(proc.pid, exec_id)
            grace_end = _now() + 1.0
            continue
        for key, _ in sel.select(wait):
            fd = key.fd
            if fd == exit_fd:
                sel.unregister(exit_fd)
                if grace_end is None:
                    grace_end = _now() + EXIT_GRACE
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
    code = _wait(proc)
    if proc.stdin is not None and not proc.stdin.closed:
        proc.stdin.close()
    for f in (proc.stdout, proc.stderr):
        if f.fileno() in held and not timed_out:
            _DRAINER.adopt(f)
        else:
            f.close()
    result = {"exit_code": 124 if timed_out else code, "timed_out": timed_out,
              "started_at": started, "completed_at": _now()}
    for _fd, (name, buf) in outs.items():
        _text_or_b64(buf.value(), name, result)
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


_DRAINER = _Drainer()


def _exit_code(code):
    return 128 - code if code < 0 else code


class BackgroundProcess:
    """A long-lived process with rolling output buffers that clients read by offset."""

    def __init__(self, req):
        self.id = _next_id("p")
        self.command = req.get("command") or " ".join(req.get("argv") or ())
        self.argv = _argv(req)
        self.started_at = _now()
        self.proc = _spawn({**req, "stdin_b64": None}, self.id)
        self.buffers = {"stdout": bytearray(), "stderr": bytearray()}
        self.base = {"stdout": 0, "stderr": 0}
        self.exit_code = None
        self.lock = threading.Lock()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
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
                    self.exit_code = _wait(self.proc)
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

    def info(self):
        return {"process_id": self.id, "command": self.command, "pid": self.proc.pid,
                "running": self.exit_code is None, "exit_code": self.exit_code,
                "started_at": self.started_at}

    def output(self, offsets):
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

    def kill(self):
        kill_tree(self.proc.pid, self.id)


PROCESSES = {}


# --- files and patches ---------------------------------------------------------------------


def list_dir(path):
    try:
        names = sorted(os.listdir(path))
    except FileNotFoundError:
        raise HTTPError(404, f"no such directory in the sandbox: {path}") from None
    except NotADirectoryError:
        raise HTTPError(400, f"not a directory: {path}; download it instead") from None
    files = []
    for name in names:
        try:
            st = os.lstat(os.path.join(path, name))
        except OSError:
            continue
        kind = ("directory" if _S_ISDIR(st.st_mode) else "file" if _S_ISREG(st.st_mode)
                else "symlink" if _S_ISLNK(st.st_mode) else "other")
        files.append({"name": name, "type": kind, "size": st.st_size, "modified": st.st_mtime})
    return {"path": path, "files": files}


def _S_ISDIR(m):
    return m & 0o170000 == 0o040000


def _S_ISREG(m):
    return m & 0o170000 == 0o100000


def _S_ISLNK(m):
    return m & 0o170000 == 0o120000


def remove_path(path, recursive):
    if path == "/":
        raise HTTPError(400, "refusing to remove '/'")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise HTTPError(404, f"no such file or directory in the sandbox: {path}") from None
    if not _S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    if not recursive:
        try:
            os.rmdir(path)
        except OSError:
            raise HTTPError(409, f"directory {path} is not empty; pass recursive=true") from None
        return
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            os.unlink(os.path.join(root, name))
        for name in dirs:
            full = os.path.join(root, name)
            if os.path.islink(full):
                os.unlink(full)
            else:
                os.rmdir(full)
    os.rmdir(path)


def apply_patch(req):
    cwd = req.get("cwd") or WORKDIR
    if not os.path.isdir(cwd):
        raise HTTPError(400, f"cwd {cwd!r} is not a directory in the sandbox")
    patch_path = f"/tmp/.orchard-patch-{_next_id('')}.diff"
    with open(patch_path, "w") as f:
        f.write(req["patch"])
    timeout = float(req.get("timeout", 60))
    methods = [
        ("git apply", ["git", "apply", "--verbose", patch_path]),
        ("git apply --reject", ["git", "apply", "--reject", "--verbose", patch_path]),
        ("patch --fuzz=5", None),
    ]
    attempts = []
    try:
        for name, argv in methods:
            try:
                if argv is None:
                    r = _run_patch(patch_path, cwd, timeout)
                else:
                    r = run_exec({"argv": argv, "cwd": cwd, "timeout": timeout})
            except HTTPError as e:
                attempts.append(f"{name}: {e.detail}")
                continue
            if r["exit_code"] == 0:
                return {"success": True, "method": name, "stdout": r["stdout"],
                        "stderr": r["stderr"], "exit_code": 0, "attempts": attempts}
            attempts.append(f"{name}: exit {r['exit_code']}: {(r['stderr'] or r['stdout'])[-500:]}")
            if name == "git apply --reject":
                # --reject leaves the hunks that did apply: undo them before the next method
                # (only then: a blind -R would revert hunks the tree already had).
                if "applied cleanly" in r["stderr"] + r["stdout"]:
                    run_exec({"argv": ["git", "apply", "-R", "--reject", patch_path],
                              "cwd": cwd, "timeout": timeout})
                run_exec({"argv": ["sh", "-c", "find . -name '*.rej' -newer \"$0\" -delete",
                                   patch_path], "cwd": cwd, "timeout": timeout})
        return {"success": False, "method": None, "stdout": "", "stderr": attempts[-1],
                "exit_code": 1, "attempts": attempts}
    finally:
        os.unlink(patch_path)


# GNU patch, then BusyBox patch (which knows neither --batch nor --fuzz). --forward/-N refuse
# an already-applied patch instead of reversing it.
_PATCH_FLAVOURS = (
    ["patch", "--batch", "--forward", "--fuzz=5", "--no-backup-if-mismatch", "-p1"],
    ["patch", "-N", "-p1"],
)


def _run_patch(patch_path, cwd, timeout):
    """Dry-run first, so a patch that only partly applies leaves the tree untouched."""
    r = None
    for flags in _PATCH_FLAVOURS:
        r = run_exec({"argv": [*flags, "--dry-run", "-i", patch_path], "cwd": cwd,
                      "timeout": timeout})
        if "unrecognized option" in r["stderr"] or "invalid option" in r["stderr"]:
            continue  # another patch implementation: try the next flavour's flags
        if r["exit_code"] != 0:
            return r
        if "ing file " not in r["stdout"]:  # BusyBox exits 0 on input without any diff
            return {**r, "exit_code": 1, "stderr": r["stderr"] + "no diff found in the patch\n"}
        return run_exec({"argv": [*flags, "-i", patch_path], "cwd": cwd, "timeout": timeout})
    return r


# --- HTTP ------------------------------------------------------------------------------------


class Conn:
    def __init__(self, sock, token):
        self.sock = sock
        self.rfile = sock.makefile("rb", buffering=CHUNK)
        self.token = token
        self.body_done = True
        self.responded = False
        self.expects_continue = False

    def send(self, status, body=b"", ctype="application/json", headers=()):
        self.responded = True
        head = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
                f"Content-Type: {ctype}", f"Content-Length: {len(body)}", *headers]
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)

    def send_json(self, obj, status=200):
        self.send(status, json.dumps(obj, separators=(",", ":")).encode())

    def start_chunked(self, ctype):
        self.responded = True
        self.sock.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\n"
                          "Transfer-Encoding: chunked\r\n\r\n".encode())

    def chunk(self, data):
        if data:
            self.sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))

    def end_chunked(self):
        self.sock.sendall(b"0\r\n\r\n")

    def body_chunks(self, headers):
        if self.expects_continue:
            # The request was accepted: only now may the client send its (large) body.
            self.expects_continue = False
            self.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    self.body_done = True
                    return
                remaining = size
                while remaining:
                    data = self.rfile.read(min(remaining, CHUNK))
                    if not data:
                        raise HTTPError(400, "request body ended early")
                    remaining -= len(data)
                    yield data
                self.rfile.readline()
        remaining = int(headers.get("content-length", 0))
        while remaining:
            data = self.rfile.read(min(remaining, CHUNK))
            if not data:
                raise HTTPError(400, "request body ended early")
            remaining -= len(data)
            yield data
        self.body_done = True

    def json_body(self, headers):
        raw = b"".join(self.body_chunks(headers))
        try:
            body = json.loads(raw or b"{}")
        except ValueError as e:
            raise HTTPError(400, f"request body is not JSON: {e}") from None
        if not isinstance(body, dict):
            raise HTTPError(400, "request body must be a JSON object")
        return body

    def serve(self):
        try:
            while self.handle_one():
                pass
        except (ConnectionError, OSError):
            pass
        finally:
            self.rfile.close()
            self.sock.close()

    def handle_one(self):
        line = self.rfile.readline(65536)
        if not line:
            return False
        try:
            method, target, _version = line.decode("latin-1").split(" ", 2)
        except ValueError:
            self.send(400, b'{"detail":"malformed request line"}', headers=("Connection: close",))
            return False
        headers = {}
        while True:
            h = self.rfile.readline(65536)
            if h in (b"\r\n", b"\n", b""):
                break
            k, _, v = h.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        self.body_done = (headers.get("transfer-encoding", "").lower() != "chunked"
                          and headers.get("content-length", "0").strip() in ("", "0"))
        self.responded = False
        self.expects_continue = headers.get("expect", "").lower() == "100-continue"
        url = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        path = unquote(url.path)
        try:
            if path == "/health" and method == "GET" and self.token:
                # Kubelet probes carry no secret; they learn only that the agent is up.
                self.send_json({"status": "ok"})
                return True
            if self.token and not hmac.compare_digest(
                headers.get("x-agent-token", "").encode(), self.token
            ):
                raise HTTPError(401, "missing or wrong X-Agent-Token")
            if "x-orchard-fence" in headers:
                _check_fence(headers["x-orchard-fence"])
            return route(self, method, path, query, headers) is not False
        except HTTPError as e:
            return self.send_error(e.status, e.detail, headers)
        except BlockingIOError:
            # EAGAIN from fork or a new thread: the pids limit. Retryable, like a refused
            # connection at the limit, once the sandbox's processes are fewer.
            return self.send_error(503, _OUT_OF_PIDS_DETAIL, headers)
        except Exception as e:  # noqa: BLE001 - report, never kill the agent
            return self.send_error(500, f"agent error: {type(e).__name__}: {e}", headers)
        return True

    def send_error(self, status, detail, headers=None):
        """Answer an error; True keeps the connection. An unread request body would be parsed
        as the next request on this keep-alive connection: a small one is read and dropped
        first (a client still sending it would otherwise fail to write and never see this
        answer); past that, answer and close."""
        if self.responded:
            return False  # a second answer to one request would put the connection out of step
        body = json.dumps({"detail": detail}, separators=(",", ":")).encode()
        if not self.body_done and headers is not None and not self.expects_continue:
            with contextlib.suppress(HTTPError, OSError):
                drained = 0
                for chunk in self.body_chunks(headers):
                    drained += len(chunk)
                    if drained > DRAIN_LIMIT:
                        break
        if self.body_done:
            self.send(status, body)
            return True
        self.send(status, body, headers=("Connection: close",))
        return False


def _proc_or_404(pid):
    proc = PROCESSES.get(pid)
    if proc is None:
        raise HTTPError(404, f"no background process {pid!r} in this sandbox")
    return proc


_FENCE = [0]
_FENCE_LOCK = threading.Lock()


def _check_fence(value):
    """Refuse a holder of an exclusive-exec lock that has since expired and been re-granted:
    its token is lower than one this agent already saw."""
    try:
        token = int(value)
    except ValueError:
        raise HTTPError(400, "X-Orchard-Fence must be an integer") from None
    with _FENCE_LOCK:
        if token < _FENCE[0]:
            raise HTTPError(409, f"stale fencing token {token} (the lock was re-granted as "
                                 f"{_FENCE[0]}); acquire the sandbox's exec lock again")
        _FENCE[0] = token


def route(c, method, path, query, headers):
    if path == "/health":
        c.send_json({"status": "ok", "pid": os.getpid(), "processes": len(PROCESSES)})
    elif path == "/exec" and method == "POST":
        req = c.json_body(headers)
        if not req.get("stream"):
            c.send_json(run_exec(req))
            return None
        lock = threading.Lock()
        started = []

        def emit(kind, data):
            with lock:
                if not started:
                    c.start_chunked("application/x-ndjson")
                    started.append(True)
                line = json.dumps({"type": kind, "data_b64": base64.b64encode(data).decode()})
                c.chunk(line.encode() + b"\n")

        result = run_exec(req, emit)
        if not started:
            c.start_chunked("application/x-ndjson")
        c.chunk(json.dumps({"type": "exit", "result": result}).encode() + b"\n")
        c.end_chunked()
    elif path == "/processes" and method == "POST":
        proc = BackgroundProcess(c.json_body(headers))
        PROCESSES[proc.id] = proc
        c.send_json(proc.info())
    elif path == "/processes" and method == "GET":
        c.send_json({"processes": [p.info() for p in PROCESSES.values()]})
    elif path.startswith("/processes/"):
        pid, _, rest = path[len("/processes/") :].partition("/")
        proc = _proc_or_404(pid)
        if rest == "output":
            offsets = {k[:-7]: int(v) for k, v in query.items() if k.endswith("_offset")}
            c.send_json(proc.output(offsets))
        elif method == "DELETE":
            proc.kill()
            c.send_json(proc.info())
        else:
            c.send_json(proc.info())
    elif path == "/files" and method == "PUT":
        c.send_json(write_file(c, query, headers))
    elif path == "/files" and method == "GET":
        send_file(c, _resolve(query.get("path")))
    elif path == "/files" and method == "DELETE":
        target = _resolve(query.get("path"))
        remove_path(target, query.get("recursive") in ("1", "true", "True"))
        c.send_json({"path": target})
    elif path == "/files/list":
        c.send_json(list_dir(_resolve(query.get("path", WORKDIR))))
    elif path == "/files/mkdir" and method == "POST":
        target = _resolve(query.get("path"))
        try:
            os.makedirs(target, exist_ok=True)
        except FileExistsError:
            raise HTTPError(409, f"{target} exists and is not a directory") from None
        c.send_json({"path": target})
    elif path == "/patch" and method == "POST":
        c.send_json(apply_patch(c.json_body(headers)))
    elif path == "/pty":
        run_pty(c, query)
        return False
    else:
        raise HTTPError(404, f"no agent route {method} {path}")
    return None


def write_file(c, query, headers):
    target = _resolve(query.get("path"))
    if os.path.isdir(target):
        raise HTTPError(400, f"{target} is a directory; give a file path")
    parent = os.path.dirname(target)
    try:
        os.makedirs(parent, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise HTTPError(400, f"parent {parent} is not a directory") from None
    tmp = f"{target}.orchard-upload-{_next_id('')}"
    size = 0
    try:
        with open(tmp, "wb") as f:
            for data in c.body_chunks(headers):
                f.write(data)
                size += len(data)
        if "mode" in query:
            os.chmod(tmp, int(query["mode"]))
        os.rename(tmp, target)  # atomic: a failed upload never truncates the old file
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return {"path": target, "size": size}


def send_file(c, target):
    try:
        # O_NONBLOCK: opening a FIFO must not hang the connection waiting for a writer.
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise HTTPError(404, f"no such file in the sandbox: {target}") from None
    except IsADirectoryError:
        raise HTTPError(400, f"{target} is a directory; list it instead") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not _S_ISREG(st.st_mode):
            raise HTTPError(400, f"{target} is not a regular file; read it with exec instead")
        # Files like those in /proc report size 0 yet have content: read those whole.
        data = f.read(DRAIN_LIMIT) if st.st_size == 0 else None
        size = len(data) if data is not None else st.st_size
        c.responded = True
        c.sock.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                       f"Content-Length: {size}\r\n\r\n".encode())
        if data is not None:
            c.sock.sendall(data)
        elif c.sock.sendfile(f, 0, size) != size:
            raise OSError("the file shrank while it was being sent")  # closes the connection


def run_pty(c, query):
    import pty  # only PTY sessions pay for this import

    try:
        argv = json.loads(query.get("argv", '["/bin/sh"]'))
    except ValueError:
        raise HTTPError(400, "'argv' must be a JSON list of strings") from None
    master, slave = pty.openpty()
    _set_winsize(master, int(query.get("cols", 80)), int(query.get("rows", 24)))
    exec_id = _next_id("t")
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
    while grace_end is None or _now() < grace_end:
        ready = sel.select(None if grace_end is None else max(0.0, grace_end - _now()))
        if any(key.fd == exit_fd for key, _ in ready):
            sel.unregister(exit_fd)
            grace_end = _now() + EXIT_GRACE
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
    code = _wait(proc)
    os.close(master)
    frame(2, str(code).encode())


def _spawn_pty(req, exec_id, slave):
    import fcntl
    import termios

    def make_controlling_tty():
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    try:
        return _tracked(
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


_OUT_OF_PIDS_DETAIL = (
    "the sandbox is at its pids limit: the agent cannot start a process or thread for this "
    "request; kill processes in the sandbox (or create it with a larger pids) and retry")
_OUT_OF_PIDS = json.dumps({"detail": _OUT_OF_PIDS_DETAIL}).encode()


def main(argv):
    unix = tcp = token_file = token_env = None
    ready_fd = None
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
        elif a == "--tcp":
            tcp = next(args)
        elif a == "--token-file":
            token_file = next(args)
        elif a == "--token-env":
            # Popped so that no command the agent runs inherits it.
            token_env = os.environ.pop(next(args), "").encode().strip() or None
        elif a == "--ready-fd":
            ready_fd = int(next(args))
        else:
            sys.exit(f"orchard-agent: unknown argument {a!r}")
    token = token_env
    if token_file:
        with open(token_file, "rb") as f:
            token = f.read().strip()
    socks = []
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
        sys.exit("orchard-agent: give --unix PATH and/or --tcp HOST:PORT")
    for s in socks:
        s.listen(512)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # As a container's PID 1 the kernel ignores an unhandled SIGTERM: exit on it, so a pod
    # deletion does not wait out the whole grace period.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    _become_subreaper()
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
    while True:
        for key, _ in sel.select():
            if key.fileobj == wake_r:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 4096):
                        pass
                _ORPHANS.set()
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
                    Conn(conn, token).send(503, _OUT_OF_PIDS, headers=("Connection: close",))
                    conn.shutdown(socket.SHUT_WR)
                conn.setblocking(False)
                sel.register(conn, selectors.EVENT_READ, "refused")


if __name__ == "__main__":
    main(sys.argv[1:])
