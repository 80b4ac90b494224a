"""The blocking side of the few things the two clients do differently.

The names and signatures are ``_async_io``'s: ``sync_client.py`` and ``sync_sandbox.py``,
generated from their async sources by ``scripts/unasync.py``, call these where those await
``_async_io``'s.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO, Literal

import wsproto.events
from httpx_ws import WebSocketSession


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def for_each(fn: Callable[[str], None], items: Iterable[str]) -> None:
    """``fn`` on every item in turn: a blocking client has no tasks to spread them over."""
    for item in items:
        fn(item)


def open_file(path: Path, mode: Literal["rb", "wb"]) -> BinaryIO:
    return path.open(mode)


def replace_file(source: Path, target: Path) -> None:
    source.replace(target)


def remove_file(path: Path) -> None:
    path.unlink(missing_ok=True)


def receive(ws: WebSocketSession, timeout: float | None) -> wsproto.events.Event:
    """Raises :class:`TimeoutError`, as the async side does, where httpx_ws raises
    ``queue.Empty``."""
    try:
        return ws.receive(timeout)
    except queue.Empty:
        raise TimeoutError(f"no terminal output within {timeout} s") from None
