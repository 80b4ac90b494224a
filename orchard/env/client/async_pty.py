"""A terminal in a sandbox, over a websocket: :class:`AsyncPtySession`.

``scripts/unasync.py`` writes the blocking terminal from the async one, as it does the clients.
"""

from __future__ import annotations

import contextlib
from typing import Self

import httpx
import wsproto.events
from httpx_ws import (
    AsyncWebSocketSession,
    WebSocketDisconnect,
    WebSocketNetworkError,
    WebSocketUpgradeError,
    aconnect_ws,
)

from orchard.env.client import errors
from orchard.env.client._async_io import receive
from orchard.env.client.pty_frames import pty_exit_code, pty_refused, pty_resize_message


class AsyncPtySession:
    """An interactive terminal: :meth:`send` keystrokes, :meth:`recv` what the screen shows.

    Get one from :meth:`AsyncSandbox.pty`.
    """

    def __init__(self, ws: AsyncWebSocketSession, stack: contextlib.AsyncExitStack) -> None:
        self.exit_code: int | None = None
        self._done = False
        self._ws = ws
        self._stack = stack

    @classmethod
    async def open(
        cls, http: httpx.AsyncClient, path: str, params: dict[str, str | int]
    ) -> AsyncPtySession:
        stack = contextlib.AsyncExitStack()
        try:
            ws: AsyncWebSocketSession = await stack.enter_async_context(
                aconnect_ws(path, http, params=params)
            )
        except WebSocketUpgradeError as exc:
            raise pty_refused(exc.response) from None
        except httpx.TransportError as exc:
            raise errors.TransportError(f"opening terminal: {exc}") from exc
        return cls(ws, stack)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def send(self, data: bytes) -> None:
        await self._ws.send_bytes(data)

    async def resize(self, cols: int, rows: int) -> None:
        await self._ws.send_text(pty_resize_message(cols, rows))

    async def recv(self, timeout: float | None = None) -> bytes:
        """The next chunk of output; ``b""`` once the command exited (see ``exit_code``).

        Raises :class:`TimeoutError` if nothing came within ``timeout`` seconds.
        """
        while not self._done:
            try:
                event = await receive(self._ws, timeout)
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

    async def close(self) -> None:
        await self._stack.aclose()
