"""RedisStore's lock: exclusive across replicas, renewed while held, with a fencing token."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING

from orchard.env.state.base import LockLost, LockTimeout, StoreUnavailable

if TYPE_CHECKING:
    from orchard.env.state.redis.store import RedisStore

log = logging.getLogger(__name__)

# A waiter for a lock normally wakes on the holder's release publish, or when the key's own
# expiry is due; this cap bounds the wait should both signals be missed.
_LOCK_RETRY_S = 1.0

# Idempotent, because the client retries commands whose reply was lost: an acquirer whose
# SET went through must find the lock its own on the retry, not wait for itself to expire.
ACQUIRE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return {1, tonumber(redis.call('GET', KEYS[2]))}
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return {1, redis.call('INCR', KEYS[2])}
end
return {0, redis.call('PTTL', KEYS[1])}
"""

RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', KEYS[2], '')
    return 1
end
return 0
"""


class RedisLock(AbstractAsyncContextManager[int]):
    def __init__(self, store: RedisStore, name: str, ttl: float, timeout: float) -> None:
        if ttl <= 0:
            raise ValueError(f"lock {name!r}: ttl must be positive, got {ttl!r}")
        self._store = store
        self._name = name
        self._ttl = ttl
        self._timeout = timeout
        self._key = store._k("lock", name)
        self._owner = uuid.uuid4().hex
        self._held_until = 0.0  # monotonic time up to which the lock is known to be ours
        self._lost = False
        self._renewer: asyncio.Task[None] | None = None

    @property
    def _ttl_ms(self) -> int:
        return max(1, int(self._ttl * 1000))

    async def _try(self) -> tuple[bool, int]:
        sent = time.monotonic()
        got, value = await self._store._call(
            self._store._acquire_script,
            keys=[self._key, self._store._k("fence", self._name)],
            args=[self._owner, self._ttl_ms],
        )
        if got:
            self._held_until = sent + self._ttl
        return bool(got), int(value)

    async def __aenter__(self) -> int:
        store = self._store
        deadline = time.monotonic() + self._timeout
        got, value = await self._try()
        if not got:
            # Subscribe, then retry, so a release between the failed try and the
            # subscription is not missed.
            async with store._pubsub.subscribe(store._k("unlocked", self._name)) as sub:
                while True:
                    got, value = await self._try()
                    if got:
                        break
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise LockTimeout(
                            f"lock {self._name!r} still held by another holder after waiting "
                            f"{self._timeout:g}s; retry later, or wait longer if holders "
                            "legitimately keep it that long (a holder that died frees it "
                            "within its ttl)"
                        )
                    # value is the key's PTTL: a dead holder never publishes, its key just
                    # expires then (-2: it already has; -1: someone set it without expiry).
                    expiry = _LOCK_RETRY_S if value == -1 else max(value, 0) / 1000 + 0.005
                    await sub.wait(min(remaining, expiry, _LOCK_RETRY_S))
        self._renewer = store._spawn(self._renew())
        return value

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self._ttl / 3)
            sent = time.monotonic()
            try:
                ours = await self._store._call(
                    self._store._renew_script, keys=[self._key], args=[self._owner, self._ttl_ms]
                )
            except StoreUnavailable as e:
                if time.monotonic() < self._held_until:
                    log.warning("renewing lock %r failed, will retry: %s", self._name, e)
                    continue
                ours = 0
            if not ours:
                self._lost = True
                log.warning("lock %r expired or was taken over while held", self._name)
                return
            self._held_until = sent + self._ttl

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        store = self._store
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)
        lost = self._lost
        try:
            released = await store._call(
                store._release_script,
                keys=[self._key, store._k("unlocked", self._name)],
                args=[self._owner],
            )
            lost = lost or not released
        except StoreUnavailable as e:
            # Renewed within the ttl means nobody else could have held it meanwhile; the
            # unreleased key merely delays the next holder until it expires.
            if time.monotonic() >= self._held_until:
                lost = True
            else:
                log.warning("releasing lock %r failed, it expires on its own: %s", self._name, e)
        if not lost:
            return
        msg = (
            f"lock {self._name!r} (ttl {self._ttl:g}s) expired or was taken over while held, "
            "so another holder may have overlapped with this one; check that the event loop "
            "is not blocked past the ttl and that Redis stays reachable, and make resources "
            "refuse stale fencing tokens"
        )
        if exc is None:
            raise LockLost(msg)
        exc.add_note(msg)
