"""Which Host and which browser Origin a web API answers: the guard against DNS rebinding and
cross-site requests, for any ASGI app (HTTP and WebSocket).

A page in a browser on the same machine can send requests to a loopback port, and a page whose
host name an attacker re-points to 127.0.0.1 (DNS rebinding) can even read the answers. Both
are told apart from a real client by what the browser adds: the page's host name in ``Host``
and the page's origin in ``Origin``. So the guard answers only the host names it is given, and
refuses every ``Origin`` that is neither listed nor the server's own (its ``/docs`` page).
Requests without ``Origin`` (SDKs, CLIs, curl) pass the second check untouched.

    app.add_middleware(HostOriginGuard, allowed_hosts=LOOPBACK_HOSTS, allowed_origins=[])
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

# What a client on this machine calls a loopback server by. Any port: the port is not part of
# what a rebinding page can change to get past the check.
LOOPBACK_HOSTS: tuple[str, ...] = ("127.0.0.1", "localhost", "::1")

# A page's origin for a WebSocket's scheme (the Origin header carries the page's own).
_PAGE_SCHEME = {"ws": "http", "wss": "https"}


def host_patterns(patterns: Sequence[str]) -> list[str]:
    """The patterns, checked and normalised: a name or address (``[::1]`` or ``::1``), a
    ``*.example.com`` suffix, or ``*`` for any host. Raises ValueError naming a bad one."""
    out = []
    for raw in patterns:
        pattern = raw.strip().lower()
        if pattern.startswith("[") and pattern.endswith("]"):
            pattern = pattern[1:-1]
        wildcard = pattern.startswith("*.") and "*" not in pattern[2:]
        if (not pattern or ("*" in pattern and pattern != "*" and not wildcard)
                or "/" in pattern or (":" in pattern and not _is_ipv6(pattern))):
            raise ValueError(f"{raw!r} is not a host pattern: give a host name or address "
                             "(no port), '*.example.com' for its subdomains, or '*' for any")
        out.append(pattern)
    return out


def origin_patterns(patterns: Sequence[str]) -> list[str]:
    """The origins, checked and normalised: ``scheme://host[:port]`` as a browser sends it,
    ``null`` (sandboxed frames, files), or ``*`` for any. Raises ValueError naming a bad one."""
    out = []
    for raw in patterns:
        origin = raw.strip().lower().rstrip("/")
        if origin not in ("*", "null"):
            parts = urllib.parse.urlsplit(origin)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.path:
                raise ValueError(f"{raw!r} is not an origin: give scheme://host[:port] as a "
                                 "browser sends it (http://localhost:3000), or '*' for any")
        out.append(origin)
    return out


class HostOriginGuard:
    """ASGI middleware: refuses a request whose ``Host`` is not allowed (400 when it is not a
    host at all, 403 otherwise) or whose ``Origin`` is neither allowed nor the server's own
    (403); a WebSocket is refused before its handshake, so the app never sees it.

    ``hosts_setting`` and ``origins_setting`` name the settings in the answers, so that the
    operator of a refused client knows what to change.
    """

    def __init__(self, app: ASGIApp, allowed_hosts: Sequence[str],
                 allowed_origins: Sequence[str], hosts_setting: str = "allowed_hosts",
                 origins_setting: str = "allowed_origins") -> None:
        self.app = app
        self.hosts = host_patterns(allowed_hosts)
        self.origins = set(origin_patterns(allowed_origins))
        self.hosts_setting, self.origins_setting = hosts_setting, origins_setting

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        refusal = self._refusal(scope, headers.get("host"), headers.get("origin"))
        if refusal is None:
            return await self.app(scope, receive, send)
        status, detail = refusal
        # For a WebSocket, starlette sends this as the handshake's answer (the ASGI
        # denial-response extension, which uvicorn has): the app is never called.
        await JSONResponse({"detail": detail}, status)(scope, receive, send)

    def _refusal(self, scope: Scope, host: str | None,
                 origin: str | None) -> tuple[int, str] | None:
        name = _host_name(host)
        if name is None:
            return 400, (f"the Host header {host!r} names no host: send the server's host name "
                         "or address, as HTTP clients do")
        if not self._host_allowed(name):
            return 403, (f"this server does not answer for host {name!r}: it answers only the "
                         f"host names in its {self.hosts_setting} setting "
                         f"({', '.join(self.hosts)}); connect by one of those, or add {name!r} "
                         f"to {self.hosts_setting}")
        if origin is None:
            return None
        page = origin.strip().lower().rstrip("/")
        own = f"{_PAGE_SCHEME.get(scope['scheme'], scope['scheme'])}://{host}".lower()
        if "*" in self.origins or page in self.origins or page == own:
            return None
        return 403, (f"requests from pages of browser origin {origin!r} are refused; to let "
                     f"that site's pages use this API, add {origin!r} to the server's "
                     f"{self.origins_setting} setting")

    def _host_allowed(self, name: str) -> bool:
        for pattern in self.hosts:
            if pattern == "*" or name == pattern:
                return True
            if pattern.startswith("*.") and name.endswith(pattern[1:]):
                return True
        return False


def _is_ipv6(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 6
    except ValueError:
        return False


def _host_name(host: str | None) -> str | None:
    """The name in a Host header (lower case, an IPv6 address without brackets), or None if
    it holds none."""
    if not host:
        return None
    try:
        parts = urllib.parse.urlsplit(f"//{host}")
        # A port must be 1..65535 (.port raises ValueError for one that is no number in range).
        if parts.netloc != host or "@" in host or parts.port == 0:
            return None
    except ValueError:
        return None
    return parts.hostname
