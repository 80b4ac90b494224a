"""The reconciler: level-triggered control loops, as in a Kubernetes controller.

Each loop runs one pass every period: it reads the source of truth (the backend, the store)
and acts on what it finds, never on remembered events, so a missed or failed pass is made
good by the next one. A pass that fails is logged and retried after a backoff that doubles
with each failure in a row (up to a cap), so a store outage is not hammered; the loop itself
never dies. Every loop exports its passes, errors and the time of its last success.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from orchard.env.errors import OrchestratorError
from orchard.env.metrics import Metrics

log = logging.getLogger("orchard.env")


class PartialPass(OrchestratorError):
    """A pass did what it safely could but skipped a part whose source of truth could not be
    read; it counts as a failed pass."""


class ControlLoop:
    def __init__(self, name: str, period: float, run_pass: Callable[[], Awaitable[None]],
                 metrics: Metrics, max_backoff: float) -> None:
        self.name = name
        self.period = period
        self.run_pass = run_pass
        self.max_backoff = max(max_backoff, period)
        self.failures = 0  # failed passes in a row
        self._metrics = metrics
        # Exported from the start, at zero: a loop that never ran shows as such.
        metrics.loop_passes.labels(name)
        metrics.loop_errors.labels(name)
        metrics.loop_last_success.labels(name)
        metrics.loop_period.labels(name).set(period)

    def delay(self) -> float:
        """How long until the next pass: the period, doubled for each failure in a row."""
        return min(self.period * 2 ** self.failures, self.max_backoff)

    async def run_once(self) -> None:
        """One pass, counted; its error is raised."""
        self._metrics.loop_passes.labels(self.name).inc()
        try:
            await self.run_pass()
        except Exception:
            self.failures += 1
            self._metrics.loop_errors.labels(self.name).inc()
            raise
        self.failures = 0
        self._metrics.loop_last_success.labels(self.name).set(time.time())

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.delay())
            try:
                await self.run_once()
            except Exception:  # noqa: BLE001 - a loop that dies would stop its reaping for good
                log.exception("%s reconcile pass failed (%d in a row); retrying in %.1fs",
                              self.name, self.failures, self.delay())


class Reconciler:
    """A set of control loops started and stopped together."""

    def __init__(self, loops: list[ControlLoop]) -> None:
        self.loops = loops
        self._tasks: list[asyncio.Task[None]] = []

    async def run_once(self) -> None:
        """One pass of every loop, in order, now; the first error is raised after all ran."""
        errors: list[Exception] = []
        for loop in self.loops:
            try:
                await loop.run_once()
            except Exception as e:  # noqa: BLE001 - raised below, once every loop has run
                errors.append(e)
        if errors:
            raise errors[0]

    async def start(self) -> None:
        """A first pass of every loop (a partial one is logged: its loop retries it), then
        every loop on its own period. Any other error is raised: the service cannot start."""
        for loop in self.loops:
            try:
                await loop.run_once()
            except PartialPass as e:
                log.warning("first %s reconcile pass was partial: %s", loop.name, e)
        self._tasks = [asyncio.create_task(loop.run(), name=f"reconcile-{loop.name}")
                       for loop in self.loops]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
