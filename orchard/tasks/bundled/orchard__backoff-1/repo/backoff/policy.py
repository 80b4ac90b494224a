"""Backoff policies: how long to wait before each retry.

A policy maps the zero-based retry number to a delay in seconds.  Policies
never sleep themselves; :mod:`backoff.retry` does that with an injected
``sleep`` function.
"""

from __future__ import annotations

import random
from typing import Iterator

#: Supported jitter strategies (see the AWS architecture blog post
#: "Exponential Backoff And Jitter"):
#:
#: - ``"none"``:  exactly the exponential delay
#: - ``"full"``:  uniformly random between 0 and the exponential delay
#: - ``"equal"``: half the exponential delay plus a random half
JITTER_MODES = ("none", "full", "equal")


class Policy:
    """Base class: subclasses implement :meth:`delay`."""

    def delay(self, retry_number: int) -> float:
        raise NotImplementedError

    def delays(self, count: int) -> Iterator[float]:
        """The first ``count`` delays."""
        for n in range(count):
            yield self.delay(n)


class Constant(Policy):
    """Wait the same ``seconds`` before every retry."""

    def __init__(self, seconds: float):
        if seconds < 0:
            raise ValueError("delay must not be negative")
        self.seconds = seconds

    def delay(self, retry_number: int) -> float:
        return self.seconds

    def __repr__(self) -> str:
        return f"Constant({self.seconds!r})"


class Exponential(Policy):
    """``base * factor ** n`` seconds before retry ``n``, capped at ``max_delay``.

    ``rng`` is any :class:`random.Random`-like object; pass a seeded one to
    make jittered delays reproducible.
    """

    def __init__(
        self,
        base: float = 0.1,
        factor: float = 2,
        max_delay: float = 30,
        jitter: str = "full",
        rng: random.Random | None = None,
    ):
        if base <= 0:
            raise ValueError("base must be positive")
        if factor < 1:
            raise ValueError("factor must be at least 1")
        if max_delay < base:
            raise ValueError("max_delay must be at least base")
        if jitter not in JITTER_MODES:
            raise ValueError(f"jitter must be one of {JITTER_MODES}, not {jitter!r}")
        self.base = base
        self.factor = factor
        self.max_delay = max_delay
        self.jitter = jitter
        self._rng = rng if rng is not None else random.Random()

    def ceiling(self, retry_number: int) -> float:
        """The un-jittered delay for ``retry_number``."""
        if retry_number < 0:
            raise ValueError("retry_number must not be negative")
        return min(self.max_delay, self.base * self.factor ** retry_number)

    def delay(self, retry_number: int) -> float:
        ceiling = self.ceiling(retry_number)
        if self.jitter == "none":
            return ceiling
        if self.jitter == "full":
            return self._rng.randint(0, ceiling)
        half = ceiling / 2
        return half + self._rng.randint(0, half)

    def __repr__(self) -> str:
        return (
            f"Exponential(base={self.base!r}, factor={self.factor!r}, "
            f"max_delay={self.max_delay!r}, jitter={self.jitter!r})"
        )
