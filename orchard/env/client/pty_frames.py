"""The terminal's wire format, without I/O: what both terminal twins (``async_pty.py`` and the
generated ``sync_pty.py``) send and read on the PTY websocket besides raw keystrokes."""

from __future__ import annotations

import json

import httpx

from orchard.env.client import errors
from orchard.env.client.http_errors import error_for_status


def pty_refused(response: httpx.Response) -> errors.APIError:
    # httpx-ws closes the refused handshake's response unread, so only its status is left.
    return error_for_status(
        response.status_code, f"terminal refused: {response.reason_phrase or 'no reason given'}"
    )


def pty_resize_message(cols: int, rows: int) -> str:
    return json.dumps({"resize": [cols, rows]})


def pty_exit_code(text: str) -> int | None:
    """The exit code carried by the server's last text frame, ``{"exit_code": N}``."""
    try:
        message = json.loads(text)
    except ValueError:
        return None
    code = message.get("exit_code") if isinstance(message, dict) else None
    return code if isinstance(code, int) else None
