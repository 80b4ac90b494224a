"""intervalset: sets of half-open numeric intervals."""

from .interval import Interval
from .iset import IntervalSet

__all__ = ["Interval", "IntervalSet"]
