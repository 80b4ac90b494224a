"""Token bucket and sliding window rate limiters with an injected clock."""

from ratelimit.bucket import TokenBucket
from ratelimit.clock import Clock, ManualClock, monotonic_clock
from ratelimit.window import SlidingWindowLog

__all__ = ["Clock", "ManualClock", "SlidingWindowLog", "TokenBucket", "monotonic_clock"]
__version__ = "0.4.2"
