"""The scheduler: a heap of events ordered by (time, priority, sequence number)."""

from __future__ import annotations

import heapq
import itertools
import time
from typing import Any, Callable, Optional


class Event:
    """A scheduled call. Returned by :meth:`Scheduler.schedule`; use it to cancel.

    ``state`` is ``"pending"``, ``"done"`` or ``"cancelled"``.
    """

    __slots__ = ("time", "priority", "seq", "callback", "args", "kwargs", "state")

    def __init__(self, time: float, priority: int, seq: int, callback: Callable[..., Any],
                 args: tuple, kwargs: dict):
        self.time = time
        self.priority = priority
        self.seq = seq
        self.callback = callback
        self.args = args
        self.kwargs = kwargs
        self.state = "pending"

    @property
    def key(self) -> tuple[float, int, int]:
        return (self.time, self.priority, self.seq)

    def __lt__(self, other: Event) -> bool:
        return self.key < other.key

    def __repr__(self) -> str:
        name = getattr(self.callback, "__name__", repr(self.callback))
        return f"<Event {name} at {self.time:g} prio {self.priority} {self.state}>"


class Scheduler:
    """Runs callbacks at given times, as told by ``clock`` (default :func:`time.monotonic`).

    Nothing runs by itself: call :meth:`run_pending` regularly. Events due at the same time
    run by ``priority`` (lower first), then in the order they were scheduled.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._heap: list[Event] = []
        self._seq = itertools.count()
        self._pending = 0

    def __len__(self) -> int:
        """The number of pending events."""
        return self._pending

    def schedule(self, at: float, callback: Callable[..., Any], *args: Any,
                 priority: int = 0, **kwargs: Any) -> Event:
        """Call ``callback(*args, **kwargs)`` at time ``at`` (or as soon as possible after)."""
        event = Event(float(at), priority, next(self._seq), callback, args, kwargs)
        heapq.heappush(self._heap, event)
        self._pending += 1
        return event

    def schedule_in(self, delay: float, callback: Callable[..., Any], *args: Any,
                    priority: int = 0, **kwargs: Any) -> Event:
        """Like :meth:`schedule`, ``delay`` seconds from now."""
        if delay < 0:
            raise ValueError("delay cannot be negative")
        return self.schedule(self.clock() + delay, callback, *args, priority=priority,
                             **kwargs)

    def cancel(self, event: Event) -> bool:
        """Cancel a pending event; returns False if it already ran or was cancelled."""
        if event.state != "pending":
            return False
        event.state = "cancelled"  # left in the heap, skipped when popped
        self._pending -= 1
        return True

    def _discard_cancelled(self) -> None:
        while self._heap and self._heap[0].state == "cancelled":
            heapq.heappop(self._heap)

    def next_time(self) -> Optional[float]:
        """When the next pending event is due, or None if there is none."""
        self._discard_cancelled()
        return self._heap[0].time if self._heap else None

    def pending(self) -> list[Event]:
        """The pending events in the order they would run."""
        return sorted(e for e in self._heap if e.state == "pending")

    def run_pending(self) -> int:
        """Run every event that is due now, in order; return how many ran.

        Events that callbacks schedule for a time that is already due run in the same call.
        An exception from a callback propagates; the events after it stay pending.
        """
        ran = 0
        now = self.clock()
        while True:
            self._discard_cancelled()
            if not self._heap or self._heap[0].time > now:
                return ran
            event = heapq.heappop(self._heap)
            event.state = "done"
            self._pending -= 1
            ran += 1
            event.callback(*event.args, **event.kwargs)
