"""backoff: retry policies with exponential backoff and jitter."""

from .policy import JITTER_MODES, Constant, Exponential, Policy
from .retry import RetryError, retry, retry_call

__all__ = [
    "JITTER_MODES",
    "Constant",
    "Exponential",
    "Policy",
    "RetryError",
    "retry",
    "retry_call",
]
__version__ = "0.4.0"
