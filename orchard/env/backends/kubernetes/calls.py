"""Bounded, retried Kubernetes API calls: a semaphore caps what one replica has in flight, and
429s, 5xx and timeouts are retried with jittered backoff (honouring Retry-After)."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger("orchard.env.kubernetes")
RETRYABLE = frozenset({429, 500, 502, 503, 504})


def retry_after(e: ApiException) -> float | None:
    value = (e.headers or {}).get("Retry-After")
    try:
        return None if value is None else max(0.0, float(value))
    except ValueError:
        return None


class Backoff:
    """Exponential backoff with full jitter, capped."""

    def __init__(self, base: float = 0.1, cap: float = 5.0) -> None:
        self.base, self.cap, self.attempt = base, cap, 0

    def next(self) -> float:
        delay = random.uniform(0, min(self.cap, self.base * 2 ** self.attempt))
        self.attempt += 1
        return delay

    def reset(self) -> None:
        self.attempt = 0


class ApiCaller:
    def __init__(self, concurrency: int, retries: int, timeout: float) -> None:
        self._slots = asyncio.Semaphore(concurrency)
        self.retries, self.timeout = retries, timeout
        self.counts: Counter[str] = Counter()  # by verb name, for /resources and benchmarks

    async def __call__(self, verb: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """Run call (a fresh coroutine per attempt, made with ``_preload_content=False``) and
        return the response's JSON, skipping the client's slow model classes; ApiException
        for a final error."""
        backoff = Backoff()
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                async with self._slots:
                    self.counts[verb] += 1
                    return await asyncio.wait_for(self._json(call), self.timeout)
            except ApiException as e:
                if e.status not in RETRYABLE or last:
                    raise
                delay = retry_after(e) or backoff.next()
                log.info("kubernetes %s: %s %s; retrying in %.2fs", verb, e.status, e.reason,
                         delay)
            except (TimeoutError, aiohttp.ClientError, OSError) as e:
                if last:
                    raise ApiException(status=0, reason=f"{verb}: {e!r}") from None
                delay = backoff.next()
                log.info("kubernetes %s: %r; retrying in %.2fs", verb, e, delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")


    @staticmethod
    async def _json(call: Callable[[], Awaitable[Any]]) -> Any:
        response = await call()
        try:
            data = await response.read()
        finally:
            response.release()
        if not 200 <= response.status <= 299:  # unread responses are not checked by the client
            error = ApiException(status=response.status, reason=_reason(response.reason, data))
            error.headers, error.body = response.headers, data
            raise error
        return json.loads(data) if data else {}


def _reason(reason: str | None, body: bytes) -> str:
    """The API server's own message (a Status object) beats the bare HTTP reason."""
    try:
        return str(json.loads(body)["message"])
    except (ValueError, KeyError, TypeError):
        return reason or ""


def not_found(e: Any) -> bool:
    return isinstance(e, ApiException) and e.status == 404
