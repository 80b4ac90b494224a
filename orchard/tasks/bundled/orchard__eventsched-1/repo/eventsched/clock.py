"""Clocks are zero-argument callables returning the current time as a float."""

from __future__ import annotations


class ManualClock:
    """A clock that only moves when told to."""

    def __init__(self, start: float = 0.0):
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` and return the new time."""
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        self.now += seconds
        return self.now
