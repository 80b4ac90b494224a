"""API keys: where a request may carry one, and the constant-time check."""

from __future__ import annotations

import hmac

from starlette.requests import HTTPConnection

from orchard.env.errors import ServiceError
from orchard.serving import presented_key

SUBPROTOCOL_PREFIX = "api_key."
# The console's login form stores the key here (HttpOnly, SameSite=Strict): its pages, the
# terminal's WebSocket and the metrics charts call the API with it.
KEY_COOKIE = "orchard_key"


class AuthError(ServiceError):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


def check_key(keys: list[str], given: str | None) -> None:
    if not keys:
        return
    if not given:
        raise AuthError(401, "missing API key: send it in the X-API-Key header")
    # Compare against every key so the time taken says nothing about which one nearly matched.
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(given.encode(), key.encode())
    if not ok:
        raise AuthError(403, "invalid API key")


def given_key(conn: HTTPConnection) -> str | None:
    """The key in ``X-API-Key`` or ``Authorization: Bearer``, else the console's cookie."""
    return presented_key(conn.headers) or conn.cookies.get(KEY_COOKIE)


def websocket_key(conn: HTTPConnection) -> tuple[str | None, str | None]:
    """A WebSocket's key and the subprotocol to accept with it.

    Browsers cannot set headers on a WebSocket, so the key may also come as ``?api_key=`` or
    as a ``Sec-WebSocket-Protocol: api_key.<key>`` offer, which the server must echo back.
    """
    offered = [p.strip() for p in conn.headers.get("sec-websocket-protocol", "").split(",")]
    for proto in offered:
        if proto.startswith(SUBPROTOCOL_PREFIX):
            return proto[len(SUBPROTOCOL_PREFIX):], proto
    return given_key(conn) or conn.query_params.get("api_key"), None
