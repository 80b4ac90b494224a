"""Publish/subscribe for RedisStore: every subscription of a store shares one connection.

One dispatcher task reads that connection and wakes the local subscribers of each channel,
so a replica with a thousand waiters holds two connections (this one and the command pool's),
not a thousand.

Not redis-py's ``PubSub``: a waiter may read the state it waits on only once Redis confirmed
its SUBSCRIBE, and must re-read it after a reconnect, since publishes sent while the
connection was down are lost. ``PubSub`` hands confirmations out as ordinary messages and
resubscribes silently on reconnect, so neither moment would be visible here.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from redis.asyncio import ConnectionPool
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError

from orchard.env.state.base import EventSubscription, StoreUnavailable
from orchard.env.state.redis._net import (
    NETWORK_ERRORS,
    cancels_requested,
    reraise_swallowed_cancel,
)

log = logging.getLogger(__name__)


class _Channel:
    """One Redis subscription, shared by every local subscriber of its channel."""

    def __init__(self) -> None:
        self.subscribers: set[EventSubscription] = set()
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def confirmed(self) -> None:
        if not self.ready.done():
            self.ready.set_result(None)

    def resubscribed(self) -> None:
        """After a reconnect: anything published while the connection was down is lost, so
        wake everyone already subscribed to re-read the state they wait on."""
        if self.ready.done():
            for sub in self.subscribers:
                sub.wake()
        else:
            self.ready.set_result(None)


class Subscribe(AbstractAsyncContextManager[EventSubscription]):
    def __init__(self, pubsub: PubSub, key: str) -> None:
        self._pubsub = pubsub
        self._key = key
        self._sub = EventSubscription()

    async def __aenter__(self) -> EventSubscription:
        pubsub, key = self._pubsub, self._key
        try:
            async with asyncio.timeout(pubsub.timeout):
                ch = await pubsub._join(key, self._sub)
                # Until Redis confirms, a publish would not reach us, and the caller is
                # about to read the state it waits on.
                await asyncio.shield(ch.ready)
        except TimeoutError:
            await pubsub._leave(key, self._sub)
            raise StoreUnavailable(
                f"Redis at {pubsub.url_redacted} did not confirm a subscription within "
                f"{pubsub.timeout:g}s; check that the server is up and reachable"
            ) from None
        except BaseException:
            await pubsub._leave(key, self._sub)
            raise
        return self._sub

    async def __aexit__(self, *exc: object) -> None:
        await self._pubsub._leave(self._key, self._sub)


class PubSub:
    """The subscriptions of one RedisStore, over one connection of its pool."""

    def __init__(self, pool: ConnectionPool, url_redacted: str, *, timeout: float,
                 health_interval: float) -> None:
        self.url_redacted = url_redacted
        self.timeout = timeout
        self._pool = pool
        self._health_interval = health_interval
        self._closed = False
        # _channels is what Redis should deliver to us; the connection state after it changes
        # only under _lock, so commands and (re)subscriptions never interleave.
        self._channels: dict[str, _Channel] = {}
        self._lock = asyncio.Lock()
        self._conn: AbstractConnection | None = None  # None while (re)connecting
        self._broken = asyncio.Event()  # a command on _conn failed: reconnect
        self._last_rx = 0.0
        # (SUBSCRIBE or UNSUBSCRIBE, key, run on its confirmation): Redis confirms commands
        # in the order they were sent, one confirmation per single-channel command.
        self._pending: deque[tuple[str, str, Callable[[], None]]] = deque()
        self._dispatcher: asyncio.Task[None] | None = None

    def subscribe(self, key: str) -> Subscribe:
        return Subscribe(self, key)

    async def close(self) -> None:
        self._closed = True
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            await asyncio.gather(self._dispatcher, return_exceptions=True)
        for ch in self._channels.values():
            ch.confirmed()  # release subscribe() calls still waiting for Redis
            for sub in ch.subscribers:
                sub.wake()  # a waiter re-reads state and finds the store closed, not a hang

    async def _join(self, key: str, sub: EventSubscription) -> _Channel:
        if self._closed:
            raise RuntimeError(f"RedisStore for {self.url_redacted} is closed")
        ch = self._channels.get(key)
        if ch is None:
            ch = self._channels[key] = _Channel()
            ch.subscribers.add(sub)
            if self._dispatcher is None:
                self._dispatcher = asyncio.ensure_future(self._dispatch())
            await self._command("SUBSCRIBE", key, ch.confirmed)
        else:
            ch.subscribers.add(sub)
        return ch

    async def _leave(self, key: str, sub: EventSubscription) -> None:
        ch = self._channels.get(key)
        if ch is None or sub not in ch.subscribers:
            return
        ch.subscribers.discard(sub)
        if not ch.subscribers:
            del self._channels[key]
            await self._command("UNSUBSCRIBE", key, lambda: None)

    async def _command(self, command: str, key: str, on_confirm: Callable[[], None]) -> None:
        async with self._lock:
            conn = self._conn
            # Without a connection the dispatcher subscribes every channel in _channels as
            # soon as it has one, so there is nothing to send now.
            if conn is None or self._closed:
                return
            self._pending.append((command.lower(), key, on_confirm))
            try:
                await self._send(conn, command, key)
            except NETWORK_ERRORS:
                self._broken.set()

    @staticmethod
    async def _send(conn: AbstractConnection, *args: str) -> None:
        if not conn.is_connected:  # send_command would silently open a fresh socket
            raise RedisConnectionError("pub/sub connection is closed")
        before = cancels_requested()
        await conn.send_command(*args, check_health=False)
        reraise_swallowed_cancel(before)

    async def _dispatch(self) -> None:
        outage_logged = False
        while True:
            conn = await self._connect(outage_logged)
            try:
                await self._serve(conn)
            except NETWORK_ERRORS as e:
                log.warning(
                    "pub/sub connection to %s lost (%s); reconnecting", self.url_redacted, e
                )
                outage_logged = True
            finally:
                async with self._lock:
                    self._conn = None
                    self._pending.clear()
                await conn.disconnect(nowait=True)

    async def _connect(self, outage_logged: bool) -> AbstractConnection:
        delay = 0.05
        while True:
            conn = self._pool.make_connection()
            try:
                await conn.connect()
                async with self._lock:
                    self._pending.clear()
                    for key, ch in self._channels.items():
                        self._pending.append(("subscribe", key, ch.resubscribed))
                        await self._send(conn, "SUBSCRIBE", key)
                    self._conn = conn
                    self._broken = asyncio.Event()
                    self._last_rx = time.monotonic()
                if outage_logged:
                    log.warning("pub/sub connection to %s restored", self.url_redacted)
                return conn
            except NETWORK_ERRORS as e:
                await conn.disconnect(nowait=True)
                if not outage_logged:
                    log.warning(
                        "cannot open pub/sub connection to %s (%s); retrying", self.url_redacted, e
                    )
                    outage_logged = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _serve(self, conn: AbstractConnection) -> None:
        """Route messages until the connection fails: it raises, a command on it failed, or it
        stayed silent through a PING."""
        reader = asyncio.ensure_future(self._read(conn))
        broken = asyncio.ensure_future(self._broken.wait())
        pinged_at: float | None = None
        try:
            while True:
                done, _ = await asyncio.wait(
                    {reader, broken},
                    timeout=self._health_interval,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if reader in done:
                    reader.result()  # raises what ended it
                    raise RedisConnectionError("pub/sub reader stopped")
                if broken in done:
                    raise RedisConnectionError("a command on the pub/sub connection failed")
                now = time.monotonic()
                if now - self._last_rx < self._health_interval:
                    pinged_at = None
                elif pinged_at is None:
                    async with self._lock:
                        await self._send(conn, "PING")
                    pinged_at = now
                elif self._last_rx < pinged_at:
                    raise RedisConnectionError(
                        f"no reply to PING within {self._health_interval:g}s"
                    )
        finally:
            for task in (reader, broken):
                task.cancel()
            await asyncio.gather(reader, broken, return_exceptions=True)

    async def _read(self, conn: AbstractConnection) -> None:
        while True:
            reply = await conn.read_response(timeout=math.inf)
            self._last_rx = time.monotonic()
            if not isinstance(reply, list):  # PONG, once no channel is subscribed
                continue
            kind, key = reply[0], reply[1]
            if kind == "message":
                ch = self._channels.get(key)
                if ch is not None:
                    for sub in ch.subscribers:
                        sub.wake()
            elif kind in ("subscribe", "unsubscribe"):
                if not self._pending or self._pending[0][:2] != (kind, key):
                    expected = self._pending[0][:2] if self._pending else None
                    raise RedisConnectionError(
                        f"pub/sub confirmation {kind} {key!r} out of order "
                        f"(expected {expected}); resynchronising"
                    )
                self._pending.popleft()[2]()
