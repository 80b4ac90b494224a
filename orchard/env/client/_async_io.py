"""The asyncio side of the few things the two clients do differently.

``_sync_io`` holds the blocking side under the same names and signatures, so that
``scripts/unasync.py`` writes ``sync_client.py`` and ``sync_sandbox.py`` from their async
sources by renaming tokens alone (``async def`` to ``def``, ``_async_io`` to ``_sync_io``, ...).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Literal

import anyio
import wsproto.events
from httpx_ws import AsyncWebSocketSession


async def sleep(seconds: float) -> None:
    await anyio.sleep(seconds)


async def for_each(fn: Callable[[str], Awaitable[None]], items: Iterable[str]) -> None:
    """``fn`` on every item at once, each in a task of one group."""
    async with anyio.create_task_group() as tg:
        for item in items:
            tg.start_soon(fn, item)


async def open_file(path: Path, mode: Literal["rb", "wb"]) -> anyio.AsyncFile[bytes]:
    return await anyio.open_file(path, mode)


async def replace_file(source: Path, target: Path) -> None:
    await anyio.Path(source).replace(target)


async def remove_file(path: Path) -> None:
    """Shielded: it cleans up after a cancelled download, and must finish all the same."""
    with anyio.CancelScope(shield=True):
        await anyio.Path(path).unlink(missing_ok=True)


async def receive(ws: AsyncWebSocketSession, timeout: float | None) -> wsproto.events.Event:
    """httpx_ws raises :class:`TimeoutError` itself when nothing came within ``timeout``."""
    return await ws.receive(timeout)
