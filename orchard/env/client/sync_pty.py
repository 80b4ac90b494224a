# Generated from async_pty.py by scripts/unasync.py: do not edit by hand.
# Edit async_pty.py, then run `python scripts/unasync.py`; the tests fail while
# this file is stale. Its imports keep the source's order, and an `async with` nested
# around a `with` stays nested here.
# ruff: noqa: I001, SIM117
"""A terminal in a sandbox, over a websocket: :class:`PtySession`.

``scripts/unasync.py`` writes the blocking terminal from the async one, as it does the clients.
"""

from __future__ import annotations

import contextlib
from typing import Self

import httpx
import wsproto.events
from httpx_ws import (
    WebSocketSession,
    WebSocketDisconnect,
    WebSocketNetworkError,
    WebSocketUpgradeError,
    connect_ws,
)

from orchard.env.client import errors
from orchard.env.client._sync_io import receive
from orchard.env.client.pty_frames import pty_exit_code, pty_refused, pty_resize_message


class PtySession:
    """An interactive terminal: :meth:`send` keystrokes, :meth:`recv` what the screen shows.

    Get one from :meth:`Sandbox.pty`.
    """

    def __init__(self, ws: WebSocketSession, stack: contextlib.ExitStack) -> None:
        self.exit_code: int | None = None
        self._done = False
        self._ws = ws
        self._stack = stack

    @classmethod
    def open(
        cls, http: httpx.Client, path: str, params: dict[str, str | int]
    ) -> PtySession:
        stack = contextlib.ExitStack()
        try:
            ws: WebSocketSession = stack.enter_context(
                connect_ws(path, http, params=params)
            )
        except WebSocketUpgradeError as exc:
            raise pty_refused(exc.response) from None
        except httpx.TransportError as exc:
            raise errors.TransportError(f"opening terminal: {exc}") from exc
        return cls(ws, stack)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self._ws.send_bytes(data)

    def resize(self, cols: int, rows: int) -> None:
        self._ws.send_text(pty_resize_message(cols, rows))

    def recv(self, timeout: float | None = None) -> bytes:
        """The next chunk of output; ``b""`` once the command exited (see ``exit_code``).

        Raises :class:`TimeoutError` if nothing came within ``timeout`` seconds.
        """
        while not self._done:
            try:
                event = receive(self._ws, timeout)
            except WebSocketDisconnect:
                self._done = True
            except WebSocketNetworkError as exc:
                raise errors.TransportError("terminal connection lost") from exc
            else:
                if isinstance(event, wsproto.events.BytesMessage):
                    return bytes(event.data)
                if isinstance(event, wsproto.events.TextMessage):
                    self.exit_code = pty_exit_code(event.data)
                    self._done = self.exit_code is not None
        return b""

    def close(self) -> None:
        self._stack.close()
