"""Calling a function again until it succeeds, following a backoff policy."""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Optional, Tuple, Type

from .policy import Exponential, Policy


class RetryError(Exception):
    """Raised when every attempt failed; ``last_exception`` is the final error."""

    def __init__(self, attempts: int, last_exception: BaseException):
        super().__init__(f"gave up after {attempts} attempt(s): {last_exception!r}")
        self.attempts = attempts
        self.last_exception = last_exception


def retry_call(
    func: Callable[..., Any],
    *args: Any,
    policy: Optional[Policy] = None,
    attempts: int = 3,
    retry_on: Tuple[Type[BaseException], ...] = (Exception,),
    deadline: Optional[float] = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    on_retry: Optional[Callable[[int, BaseException, float], None]] = None,
    **kwargs: Any,
) -> Any:
    """Call ``func(*args, **kwargs)`` up to ``attempts`` times.

    Exceptions that are not instances of ``retry_on`` propagate at once.
    ``deadline`` is a budget in seconds measured with ``clock`` from the first
    call; a retry whose delay would end past the deadline is not made.
    ``on_retry(attempt, exc, delay)`` is called before each sleep.
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    policy = policy if policy is not None else Exponential()
    start = clock()
    for attempt in range(1, attempts + 1):
        try:
            return func(*args, **kwargs)
        except retry_on as exc:
            if attempt == attempts:
                raise RetryError(attempt, exc) from exc
            delay = policy.delay(attempt - 1)
            if deadline is not None and clock() - start + delay > deadline:
                raise RetryError(attempt, exc) from exc
            if on_retry is not None:
                on_retry(attempt, exc, delay)
            sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


def retry(**options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator form of :func:`retry_call`; takes the same keyword options."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return retry_call(func, *args, **options, **kwargs)

        return wrapper

    return decorate
