"""A priority-based event scheduler with an injected clock."""

from eventsched.clock import ManualClock
from eventsched.scheduler import Event, Scheduler

__all__ = ["Event", "ManualClock", "Scheduler"]
__version__ = "0.6.0"
