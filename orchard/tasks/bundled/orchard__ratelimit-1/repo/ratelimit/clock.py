"""Clocks: zero-argument callables returning the current time in seconds."""

from __future__ import annotations

import time
from typing import Callable

Clock = Callable[[], float]


def monotonic_clock() -> float:
    """The default clock: :func:`time.monotonic`."""
    return time.monotonic()


class ManualClock:
    """A clock that only moves when told to; for tests and simulations."""

    def __init__(self, start: float = 0.0):
        self._now = float(start)

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (which must not be negative)."""
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        self._now += seconds

    def set(self, now: float) -> None:
        """Jump to ``now``, which must not be earlier than the current time."""
        if now < self._now:
            raise ValueError("a clock cannot go backwards")
        self._now = float(now)
