"""What every Redis call here shares: which errors mean the network failed, and a guard against
redis-py swallowing a cancellation."""

from __future__ import annotations

import asyncio

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

NETWORK_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)


def cancels_requested() -> int:
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


def reraise_swallowed_cancel(before: int) -> None:
    """redis-py sends each command under ``asyncio.wait_for``, which before Python 3.12 can
    swallow a cancellation that lands just as the send completes: raise it again, or a
    cancelled loop (the reconciler, a lock renewer, the pub/sub dispatcher) runs on forever
    and whatever awaits it (shutdown, a lock release) hangs."""
    if cancels_requested() > before:
        raise asyncio.CancelledError
