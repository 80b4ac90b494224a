"""HTTP/1.1 over one accepted socket: parsing, authentication, fencing and routing."""

import base64
import contextlib
import hmac
import json
import os
import threading
from urllib.parse import parse_qs, unquote, urlsplit

from .archive import receive_archive, send_archive, signal_all
from .common import CHUNK, DRAIN_LIMIT, WORKDIR, HTTPError, resolve
from .execution import PROCESSES, BackgroundProcess, run_exec
from .files import apply_patch, list_dir, remove_path, send_file, write_file
from .forward import forward
from .terminal import run_pty

_REASONS = {
    101: "Switching Protocols", 200: "OK", 400: "Bad Request", 401: "Unauthorized",
    404: "Not Found", 405: "Method Not Allowed", 409: "Conflict", 413: "Payload Too Large",
    500: "Internal Server Error", 503: "Service Unavailable",
}

OUT_OF_PIDS_DETAIL = (
    "the sandbox is at its pids limit: the agent cannot start a process or thread for this "
    "request; kill processes in the sandbox (or create it with a larger pids) and retry")
OUT_OF_PIDS = json.dumps({"detail": OUT_OF_PIDS_DETAIL}).encode()


class Conn:
    def __init__(self, sock, token):
        self.sock = sock
        self.rfile = sock.makefile("rb", buffering=CHUNK)
        self.token = token
        self.body_done = True
        self.responded = False
        self.expects_continue = False
        self.query_all = {}

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
                yield from self._read_exactly(size)
                self.rfile.readline()
        yield from self._read_exactly(int(headers.get("content-length", 0)))
        self.body_done = True

    def _read_exactly(self, remaining):
        while remaining:
            data = self.rfile.read(min(remaining, CHUNK))
            if not data:
                raise HTTPError(400, "request body ended early")
            remaining -= len(data)
            yield data

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
        self.query_all = parse_qs(url.query)  # every value, for parameters given repeatedly
        query = {k: v[-1] for k, v in self.query_all.items()}
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
            return self.send_error(503, OUT_OF_PIDS_DETAIL, headers)
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
        send_file(c, resolve(query.get("path")))
    elif path == "/files" and method == "DELETE":
        target = resolve(query.get("path"))
        remove_path(target, query.get("recursive") in ("1", "true", "True"))
        c.send_json({"path": target})
    elif path == "/files/list":
        c.send_json(list_dir(resolve(query.get("path", WORKDIR))))
    elif path == "/files/mkdir" and method == "POST":
        target = resolve(query.get("path"))
        try:
            os.makedirs(target, exist_ok=True)
        except FileExistsError:
            raise HTTPError(409, f"{target} exists and is not a directory") from None
        c.send_json({"path": target})
    elif path == "/patch" and method == "POST":
        c.send_json(apply_patch(c.json_body(headers)))
    elif path == "/archive" and method == "GET":
        send_archive(c, c.query_all)
    elif path == "/archive" and method == "PUT":
        c.send_json(receive_archive(c, headers))
    elif path == "/signal" and method == "POST":
        c.send_json(signal_all(c.json_body(headers)))
    elif path == "/browser" and method == "POST":
        # Loaded on first use: most sandboxes never browse, and every one pays for its heap.
        from .browser import browser_action

        c.send_json(browser_action(c.json_body(headers)))
    elif path == "/http" and method == "POST":
        c.send_json(forward(c.json_body(headers)))
    elif path == "/pty":
        run_pty(c, query)
        return False
    else:
        raise HTTPError(404, f"no agent route {method} {path}")
    return None
