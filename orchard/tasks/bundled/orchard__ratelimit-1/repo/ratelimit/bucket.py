"""The token bucket: tokens drip in at ``rate`` per second up to ``capacity``."""

from __future__ import annotations

from ratelimit.clock import Clock, monotonic_clock


class TokenBucket:
    """A token bucket that starts full.

    Each request takes ``n`` tokens; requests are allowed while enough tokens are left, so
    bursts of up to ``capacity`` pass and the long-run rate is ``rate`` per second.
    """

    def __init__(self, rate: float, capacity: float, *, clock: Clock = monotonic_clock):
        if rate <= 0 or capacity <= 0:
            raise ValueError("rate and capacity must be positive")
        self.rate = float(rate)
        self.capacity = float(capacity)
        self._clock = clock
        self._tokens = self.capacity
        self._updated = clock()

    def _refill(self) -> None:
        now = self._clock()
        elapsed = max(0.0, now - self._updated)
        self._tokens = min(self.capacity, self._tokens + elapsed * self.rate)
        self._updated = now

    @property
    def tokens(self) -> float:
        """Tokens available now."""
        self._refill()
        return self._tokens

    def _check(self, n: float) -> None:
        if n <= 0:
            raise ValueError("n must be positive")
        if n > self.capacity:
            raise ValueError(f"cannot take {n} tokens from a bucket of capacity {self.capacity:g}")

    def try_acquire(self, n: float = 1) -> bool:
        """Take ``n`` tokens if available; return whether they were taken."""
        self._check(n)
        self._refill()
        if self._tokens >= n:
            self._tokens -= n
            return True
        return False

    def wait_time(self, n: float = 1) -> float:
        """Seconds until ``n`` tokens will be available (0 if they are now)."""
        self._check(n)
        self._refill()
        missing = n - self._tokens
        return max(0.0, missing / self.rate)
