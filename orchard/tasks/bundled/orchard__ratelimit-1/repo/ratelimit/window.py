"""The sliding window log: remember each allowed event's time."""

from __future__ import annotations

from collections import deque

from ratelimit.clock import Clock, monotonic_clock


class SlidingWindowLog:
    """Allow at most ``limit`` events in any window of ``window`` seconds.

    The window is half-open: an event at time ``t`` counts against the limit during
    ``[t, t + window)`` and no longer from ``t + window`` on.
    """

    def __init__(self, limit: int, window: float, *, clock: Clock = monotonic_clock):
        if limit < 1:
            raise ValueError("limit must be at least 1")
        if window <= 0:
            raise ValueError("window must be positive")
        self.limit = limit
        self.window = float(window)
        self._clock = clock
        self._log: deque[float] = deque()

    def _expire(self, now: float) -> None:
        horizon = now - self.window
        while self._log and self._log[0] < horizon:
            self._log.popleft()

    def allow(self) -> bool:
        """Record an event now if the limit allows it; return whether it was allowed."""
        now = self._clock()
        self._expire(now)
        if len(self._log) < self.limit:
            self._log.append(now)
            return True
        return False

    def remaining(self) -> int:
        """How many more events would be allowed right now."""
        self._expire(self._clock())
        return self.limit - len(self._log)

    def retry_after(self) -> float:
        """Seconds until the next event would be allowed (0 if it would be now)."""
        now = self._clock()
        self._expire(now)
        if len(self._log) < self.limit:
            return 0.0
        return self._log[0] + self.window - now

    def reset(self) -> None:
        """Forget all recorded events."""
        self._log.clear()
