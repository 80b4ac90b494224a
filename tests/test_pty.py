"""Interactive PTY sessions over the real WebSocket endpoint."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.conftest import needs_root, run, wait_until

pytestmark = needs_root


def ws_url(orchestrator: str, sid: str, **query: str) -> str:
    qs = "&".join(f"{k}={v}" for k, v in {"command": "/bin/sh", **query}.items())
    return f"{orchestrator.replace('http://', 'ws://')}/sandboxes/{sid}/exec/pty?{qs}"


def read_until(ws: ClientConnection, needle: bytes, timeout: float = 10) -> bytes:
    """Terminal output up to and including ``needle``."""
    buf = b""
    deadline = time.monotonic() + timeout
    while needle not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{needle!r} not seen in {timeout}s; got {buf[-500:]!r}")
        msg = ws.recv(timeout=left)
        assert isinstance(msg, bytes), f"unexpected text frame {msg!r} before {needle!r}"
        buf += msg
    return buf


def exit_frame(ws: ClientConnection, timeout: float = 10) -> dict:
    """Skip terminal output until the final text frame; then the socket closes."""
    deadline = time.monotonic() + timeout
    while True:
        msg = ws.recv(timeout=max(0.01, deadline - time.monotonic()))
        if isinstance(msg, str):
            return json.loads(msg)


def test_echo_and_exit_code(orchestrator: str, sandbox: str) -> None:
    with connect(ws_url(orchestrator, sandbox), open_timeout=30) as ws:
        ws.send(b"echo hi-$((40 + 2))\n")
        # The computed value proves a shell ran it, not just the terminal's echo of input.
        read_until(ws, b"hi-42")
        ws.send(b"tty; pwd\n")
        out = read_until(ws, b"/workspace")
        assert b"/dev/pts/" in out
        ws.send(b"exit 3\n")
        assert exit_frame(ws) == {"exit_code": 3}
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)


def test_the_session_ends_when_its_shell_exits_despite_setsid(orchestrator: str,
                                                             sandbox: str) -> None:
    """A process left holding the terminal used to keep the session open for ever."""
    with connect(ws_url(orchestrator, sandbox), open_timeout=30) as ws:
        ws.send(b"setsid sleep 300 & echo bg-$((1 + 1))\n")
        read_until(ws, b"bg-2")
        ws.send(b"exit 5\n")
        assert exit_frame(ws) == {"exit_code": 5}


def test_resize_changes_the_terminal_size(orchestrator: str, sandbox: str) -> None:
    with connect(ws_url(orchestrator, sandbox, cols="100", rows="30"), open_timeout=30) as ws:
        ws.send(b"echo size=$(stty size)=\n")
        assert b"size=30 100=" in read_until(ws, b"size=30 100=")
        ws.send(json.dumps({"resize": [132, 43]}))
        ws.send(b"echo size=$(stty size)=\n")
        assert b"size=43 132=" in read_until(ws, b"size=43 132=")
        ws.send(b"exit\n")
        assert exit_frame(ws) == {"exit_code": 0}


def test_command_with_arguments(orchestrator: str, sandbox: str) -> None:
    url = ws_url(orchestrator, sandbox, command="/bin/sh%20-c%20'echo%20from-pty;%20exit%205'")
    with connect(url, open_timeout=30) as ws:
        read_until(ws, b"from-pty")
        assert exit_frame(ws) == {"exit_code": 5}


def test_client_disconnect_kills_the_session(orchestrator: str, sandbox: str,
                                             http: httpx.Client) -> None:
    def running() -> bool:
        return "sleep 4242" in run(http, sandbox, command="ps -eo args")["stdout"]

    with connect(ws_url(orchestrator, sandbox), open_timeout=30) as ws:
        ws.send(b"sleep 4242\n")
        assert wait_until(running, timeout=10)

    def gone() -> bool:
        return not running()

    assert wait_until(gone, timeout=10), "the PTY's processes outlived the WebSocket"


def test_unknown_sandbox_closes_with_1008(orchestrator: str) -> None:
    try:
        with connect(ws_url(orchestrator, "no-such-sandbox"), open_timeout=30) as ws:
            ws.recv(timeout=10)
    except ConnectionClosed as e:
        assert e.rcvd is not None and e.rcvd.code == 1008, e
        assert "no-such-sandbox" in e.rcvd.reason
    except InvalidStatus as e:  # pragma: no cover - reported below
        pytest.fail(f"handshake rejected with HTTP {e.response.status_code} instead of a "
                    "1008 close frame")
    else:  # pragma: no cover
        pytest.fail("the WebSocket stayed open")
