"""Work the service finishes after its answer has gone (a job nobody waits for, a fork's
snapshot to drop): tasks that stop() waits for rather than cuts short."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class Background:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for every task spawned so far; their errors were theirs to record."""
        await asyncio.gather(*self._tasks, return_exceptions=True)
