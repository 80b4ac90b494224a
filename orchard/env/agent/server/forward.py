"""POST /http: an HTTP request to a service on the sandbox's own loopback, and its answer."""

import base64
import http.client
import socket

from .common import HTTPError

MAX_RESPONSE_BYTES = 8 << 20  # orchard/env/http_schema.py says the same


class _Loopback(http.client.HTTPConnection):
    def connect(self):
        # Not socket.create_connection: its getaddrinfo wants the idna codec, which the
        # agent's fork-server does not load.
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(("127.0.0.1", self.port))


def forward(req):
    port = int(req["port"])
    conn = _Loopback("127.0.0.1", port, timeout=float(req.get("timeout", 30)))
    try:
        conn.request(req.get("method", "GET"), req.get("path", "/"),
                     body=req.get("body", "").encode() or None,
                     headers=req.get("headers") or {})
        answer = conn.getresponse()
        body = answer.read(MAX_RESPONSE_BYTES + 1)
    except ConnectionRefusedError:
        raise HTTPError(502, f"nothing listens on port {port} in the sandbox: start the service "
                        "first (a process that serves 127.0.0.1)") from None
    except TimeoutError:
        raise HTTPError(504, f"the service on port {port} did not answer within "
                        f"{req.get('timeout', 30)}s") from None
    except (OSError, http.client.HTTPException) as e:
        raise HTTPError(502, f"the service on port {port} broke the exchange: "
                        f"{type(e).__name__}: {e}") from None
    finally:
        conn.close()
    if len(body) > MAX_RESPONSE_BYTES:
        raise HTTPError(502, f"the service on port {port} answered more than "
                        f"{MAX_RESPONSE_BYTES} bytes; ask it for less")
    try:
        text, encoding = body.decode(), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(body).decode(), "base64"
    return {"status": answer.status, "headers": dict(answer.getheaders()), "body": text,
            "encoding": encoding}
