"""Redis state: what lets several orchestrator replicas share sandboxes, jobs and locks.

Every key lives under a prefix (``?prefix=NAME`` in the URL, default ``orchard``), so several
deployments, or several tests, can share one server. Layout under prefix P:

    P:sandboxes            hash  sandbox_id -> SandboxInfo JSON
    P:sandboxes:updated    zset  sandbox_id scored by last write (listing order)
    P:sandboxes:deleted    zset  deleted sandboxes scored by last write (what prune may drop)
    P:jobs                 hash  job_id -> Job JSON
    P:jobs:unfinished      set   queued or running job ids
    P:jobs:finished        zset  finished job ids scored by last write (what prune may drop)
    P:replicas             zset  replica scored by expiry, in the server's clock
    P:lock:NAME            str   owner of lock NAME, with a PX expiry
    P:fence:NAME           int   last fencing token handed out for lock NAME
    P:ch:CHANNEL           pub/sub channel behind publish/subscribe
    P:unlocked:NAME        pub/sub channel announcing that lock NAME was released
    P:events               hash  seq -> SandboxEvent JSON
    P:events:seq           int   last seq handed out
    P:events:time          zset  seq scored by event time (what prune_events may drop)
    P:events:order         zset  seq scored by seq (all events, in order)
    P:events:sb:ID         zset  seq scored by seq, one sandbox's events
    P:events:ses:SESSION   zset  seq scored by seq, one session's events

All subscriptions of a store share one pub/sub connection, read by one dispatcher task, so a
replica with a thousand waiters holds two connections, not a thousand.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, ParamSpec, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from orchard.env.schema import Job, JobStatus, SandboxEvent, SandboxInfo, SandboxStatus
from orchard.env.state.base import EventSubscription, LockLost, LockTimeout, StoreUnavailable

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

_NETWORK_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)


def _cancels_requested() -> int:
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


def _reraise_swallowed_cancel(before: int) -> None:
    """redis-py sends each command under ``asyncio.wait_for``, which before Python 3.12 can
    swallow a cancellation that lands just as the send completes: raise it again, or a
    cancelled loop (the reconciler, a lock renewer, the pub/sub dispatcher) runs on forever
    and whatever awaits it (shutdown, a lock release) hangs."""
    if _cancels_requested() > before:
        raise asyncio.CancelledError
_UNFINISHED = {JobStatus.queued, JobStatus.running}

# A waiter for a lock normally wakes on the holder's release publish, or when the key's own
# expiry is due; this cap bounds the wait should both signals be missed.
_LOCK_RETRY_S = 1.0

_PRUNE = """
local n = 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[1])) do
    redis.call('HDEL', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZREM', KEYS[3], id)
    n = n + 1
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', '(' .. ARGV[1])) do
    redis.call('HDEL', KEYS[4], id)
    redis.call('ZREM', KEYS[5], id)
    n = n + 1
end
return n
"""

# Idempotent, because the client retries commands whose reply was lost: an acquirer whose
# SET went through must find the lock its own on the retry, not wait for itself to expire.
# Atomic, so no reader sees seq N before seq N-1 is stored. ARGV[1] is the event's JSON with
# its leading '{"seq":0' cut off; the seq is spliced in, which keeps the body byte-identical.
_APPEND_EVENT = """
local seq = redis.call('INCR', KEYS[1])
redis.call('HSET', KEYS[2], seq, '{"seq":' .. seq .. ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[2], seq)
for i = 4, #KEYS do redis.call('ZADD', KEYS[i], seq, seq) end
return seq
"""

# In batches of ARGV[3], so a backlog (say, after downtime) never blocks Redis for long.
_PRUNE_EVENTS = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[1], 'LIMIT', 0, ARGV[3])
for _, seq in ipairs(ids) do
    local body = redis.call('HGET', KEYS[1], seq)
    if body then
        local event = cjson.decode(body)
        redis.call('ZREM', ARGV[2] .. ':sb:' .. event.sandbox_id, seq)
        if type(event.session) == 'string' then
            redis.call('ZREM', ARGV[2] .. ':ses:' .. event.session, seq)
        end
    end
    redis.call('HDEL', KEYS[1], seq)
    redis.call('ZREM', KEYS[2], seq)
    redis.call('ZREM', KEYS[3], seq)
end
return #ids
"""

_ACQUIRE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return {1, tonumber(redis.call('GET', KEYS[2]))}
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return {1, redis.call('INCR', KEYS[2])}
end
return {0, redis.call('PTTL', KEYS[1])}
"""

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', KEYS[2], '')
    return 1
end
return 0
"""

# Liveness uses the server's clock, so replicas whose clocks disagree still agree on who died.
_BEAT = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return 1
"""

_LIVE = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""


def _redact(url: str) -> str:
    """The URL without its password (in the userinfo or, for unix://, the query)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{netloc.rsplit('@', 1)[1]}"
    query = [(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query, True)]
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query, safe="*")))


def _split_prefix(url: str) -> tuple[str, str]:
    """(URL for redis-py, key prefix): redis-py would pass an unknown ``prefix`` query
    argument on to its connection class, which rejects it."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    prefixes = [v for k, v in query if k == "prefix"]
    if len(prefixes) > 1 or (prefixes and not prefixes[0]):
        raise ValueError(f"state URL {_redact(url)!r}: give at most one non-empty ?prefix=NAME")
    rest = urlencode([(k, v) for k, v in query if k != "prefix"])
    return urlunsplit(parts._replace(query=rest)), prefixes[0] if prefixes else "orchard"


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


class _Subscribe(AbstractAsyncContextManager[EventSubscription]):
    def __init__(self, store: RedisStore, key: str) -> None:
        self._store = store
        self._key = key
        self._sub = EventSubscription()

    async def __aenter__(self) -> EventSubscription:
        store, key = self._store, self._key
        try:
            async with asyncio.timeout(store.timeout):
                ch = await store._join(key, self._sub)
                # Until Redis confirms, a publish would not reach us, and the caller is
                # about to read the state it waits on.
                await asyncio.shield(ch.ready)
        except TimeoutError:
            await store._leave(key, self._sub)
            raise StoreUnavailable(
                f"Redis at {store.url_redacted} did not confirm a subscription within "
                f"{store.timeout:g}s; check that the server is up and reachable"
            ) from None
        except BaseException:
            await store._leave(key, self._sub)
            raise
        return self._sub

    async def __aexit__(self, *exc: object) -> None:
        await self._store._leave(self._key, self._sub)


class _Lock(AbstractAsyncContextManager[int]):
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
            async with store._subscribe_key(store._k("unlocked", self._name)) as sub:
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


class RedisStore:
    """State shared by every orchestrator replica that opens the same Redis URL and prefix."""

    shared = True

    def __init__(self, url: str, *, timeout: float = 10.0, health_interval: float = 15.0) -> None:
        """``timeout`` bounds connecting and each subscription's confirmation;
        ``health_interval`` is how long the pub/sub connection may stay silent before a PING
        checks it (a half-open TCP connection would otherwise lose wake-ups forever)."""
        client_url, self.prefix = _split_prefix(url)
        self.url_redacted = _redact(url)
        self.timeout = timeout
        self._health_interval = health_interval
        # RESP2: the pub/sub reader parses replies itself, and RESP2 runs on every server.
        self._redis = aioredis.from_url(
            client_url,
            decode_responses=True,
            protocol=2,
            socket_connect_timeout=timeout,
            socket_timeout=timeout,
        )
        self._pool = self._redis.connection_pool
        self._acquire_script = self._redis.register_script(_ACQUIRE)
        self._renew_script = self._redis.register_script(_RENEW)
        self._release_script = self._redis.register_script(_RELEASE)
        self._prune_script = self._redis.register_script(_PRUNE)
        self._append_event_script = self._redis.register_script(_APPEND_EVENT)
        self._prune_events_script = self._redis.register_script(_PRUNE_EVENTS)
        self._beat_script = self._redis.register_script(_BEAT)
        self._live_script = self._redis.register_script(_LIVE)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        # pub/sub: _channels is what Redis should deliver to us; the connection state after
        # it changes only under _ps_lock, so commands and (re)subscriptions never interleave
        self._channels: dict[str, _Channel] = {}
        self._ps_lock = asyncio.Lock()
        self._ps_conn: AbstractConnection | None = None  # None while (re)connecting
        self._ps_broken = asyncio.Event()  # a command on _ps_conn failed: reconnect
        self._ps_last_rx = 0.0
        # (SUBSCRIBE or UNSUBSCRIBE, key, run on its confirmation): Redis confirms commands
        # in the order they were sent, one confirmation per single-channel command.
        self._ps_pending: deque[tuple[str, str, Callable[[], None]]] = deque()
        self._dispatcher: asyncio.Task[None] | None = None

    def _unavailable(self, e: BaseException) -> StoreUnavailable:
        return StoreUnavailable(
            f"Redis state store at {self.url_redacted} is unavailable ({e}); check that the "
            "server is running and reachable and that the URL's host, port, password and "
            "TLS scheme are right"
        )

    async def _call(self, fn: Callable[P, Awaitable[T]], *args: P.args, **kw: P.kwargs) -> T:
        if self._closed:
            raise RuntimeError(f"RedisStore for {self.url_redacted} is closed")
        before = _cancels_requested()
        try:
            result = await fn(*args, **kw)
        except _NETWORK_ERRORS as e:
            raise self._unavailable(e) from e
        _reraise_swallowed_cancel(before)
        return result

    def _k(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def _spawn(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- records ----------------------------------------------------------------------

    async def put_sandbox(self, info: SandboxInfo) -> None:
        sid, now = info.sandbox_id, time.time()
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(self._k("sandboxes"), sid, info.model_dump_json())
        pipe.zadd(self._k("sandboxes", "updated"), {sid: now})
        if info.status == SandboxStatus.deleted:
            pipe.zadd(self._k("sandboxes", "deleted"), {sid: now})
        else:
            pipe.zrem(self._k("sandboxes", "deleted"), sid)
        await self._call(pipe.execute)

    async def get_sandbox(self, sandbox_id: str) -> SandboxInfo | None:
        data = await self._call(self._redis.hget, self._k("sandboxes"), sandbox_id)
        return None if data is None else SandboxInfo.model_validate_json(data)

    async def list_sandboxes(self) -> list[SandboxInfo]:
        ids = await self._call(self._redis.zrange, self._k("sandboxes", "updated"), 0, -1)
        if not ids:
            return []
        rows = await self._call(self._redis.hmget, self._k("sandboxes"), ids)
        # a row is None when the sandbox was dropped between the two reads
        return [SandboxInfo.model_validate_json(r) for r in rows if r is not None]

    async def drop_sandbox(self, sandbox_id: str) -> None:
        pipe = self._redis.pipeline(transaction=True)
        pipe.hdel(self._k("sandboxes"), sandbox_id)
        pipe.zrem(self._k("sandboxes", "updated"), sandbox_id)
        pipe.zrem(self._k("sandboxes", "deleted"), sandbox_id)
        await self._call(pipe.execute)

    async def put_job(self, job: Job) -> None:
        jid = job.job_id
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(self._k("jobs"), jid, job.model_dump_json())
        if job.status in _UNFINISHED:
            pipe.sadd(self._k("jobs", "unfinished"), jid)
            pipe.zrem(self._k("jobs", "finished"), jid)
        else:
            pipe.srem(self._k("jobs", "unfinished"), jid)
            pipe.zadd(self._k("jobs", "finished"), {jid: time.time()})
        await self._call(pipe.execute)

    async def get_job(self, job_id: str) -> Job | None:
        data = await self._call(self._redis.hget, self._k("jobs"), job_id)
        return None if data is None else Job.model_validate_json(data)

    async def unfinished_jobs(self) -> list[Job]:
        ids = await self._call(self._redis.smembers, self._k("jobs", "unfinished"))
        if not ids:
            return []
        rows = await self._call(self._redis.hmget, self._k("jobs"), list(ids))
        jobs = [Job.model_validate_json(r) for r in rows if r is not None]
        # a job may have finished between the two reads
        return [j for j in jobs if j.status in _UNFINISHED]

    async def prune(self, older_than: float) -> int:
        keys = [
            self._k("sandboxes"),
            self._k("sandboxes", "deleted"),
            self._k("sandboxes", "updated"),
            self._k("jobs"),
            self._k("jobs", "finished"),
        ]
        return int(await self._call(self._prune_script, keys=keys, args=[repr(older_than)]))

    # --- the event log ------------------------------------------------------------------

    async def append_event(self, event: SandboxEvent) -> SandboxEvent:
        body = event.model_copy(update={"seq": 0}).model_dump_json()
        head = '{"seq":0'
        assert body.startswith(head), "SandboxEvent.seq must stay its first field"
        keys = [self._k("events", "seq"), self._k("events"), self._k("events", "time"),
                self._k("events", "order"), self._k("events", "sb", event.sandbox_id)]
        if event.session is not None:
            keys.append(self._k("events", "ses", event.session))
        seq = await self._call(self._append_event_script, keys=keys,
                               args=[body[len(head):], repr(event.time)])
        return event.model_copy(update={"seq": int(seq)})

    async def events(self, *, sandbox_id: str | None = None, session: str | None = None,
                     after: int = 0, limit: int = 1000) -> list[SandboxEvent]:
        # Either index narrows the search; the other condition is checked on the bodies.
        if sandbox_id is not None:
            index = self._k("events", "sb", sandbox_id)
        elif session is not None:
            index = self._k("events", "ses", session)
        else:
            index = self._k("events", "order")
        out: list[SandboxEvent] = []
        while len(out) < limit:
            seqs = await self._call(self._redis.zrangebyscore, index, f"({after}", "+inf",
                                    start=0, num=limit)
            if not seqs:
                break
            rows = await self._call(self._redis.hmget, self._k("events"), seqs)
            for row in rows:
                if row is None:  # pruned between the two reads
                    continue
                event = SandboxEvent.model_validate_json(row)
                if session is None or event.session == session:
                    out.append(event)
            after = int(seqs[-1])
        return out[:limit]

    async def prune_events(self, older_than: float) -> int:
        keys = [self._k("events"), self._k("events", "time"), self._k("events", "order")]
        total, batch = 0, 500
        while True:
            n = int(await self._call(self._prune_events_script, keys=keys,
                                     args=[repr(older_than), self._k("events"), batch]))
            total += n
            if n < batch:
                return total

    # --- publish / subscribe ------------------------------------------------------------

    async def publish(self, channel: str) -> None:
        await self._call(self._redis.publish, self._k("ch", channel), "")

    def subscribe(self, channel: str) -> _Subscribe:
        return self._subscribe_key(self._k("ch", channel))

    def _subscribe_key(self, key: str) -> _Subscribe:
        return _Subscribe(self, key)

    async def _join(self, key: str, sub: EventSubscription) -> _Channel:
        if self._closed:
            raise RuntimeError(f"RedisStore for {self.url_redacted} is closed")
        ch = self._channels.get(key)
        if ch is None:
            ch = self._channels[key] = _Channel()
            ch.subscribers.add(sub)
            if self._dispatcher is None:
                self._dispatcher = self._spawn(self._dispatch())
            await self._ps_command("SUBSCRIBE", key, ch.confirmed)
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
            await self._ps_command("UNSUBSCRIBE", key, lambda: None)

    async def _ps_command(self, command: str, key: str, on_confirm: Callable[[], None]) -> None:
        async with self._ps_lock:
            conn = self._ps_conn
            # Without a connection the dispatcher subscribes every channel in _channels as
            # soon as it has one, so there is nothing to send now.
            if conn is None or self._closed:
                return
            self._ps_pending.append((command.lower(), key, on_confirm))
            try:
                await self._ps_send(conn, command, key)
            except _NETWORK_ERRORS:
                self._ps_broken.set()

    @staticmethod
    async def _ps_send(conn: AbstractConnection, *args: str) -> None:
        if not conn.is_connected:  # send_command would silently open a fresh socket
            raise RedisConnectionError("pub/sub connection is closed")
        before = _cancels_requested()
        await conn.send_command(*args, check_health=False)
        _reraise_swallowed_cancel(before)

    async def _dispatch(self) -> None:
        outage_logged = False
        while True:
            conn = await self._ps_connect(outage_logged)
            try:
                await self._ps_serve(conn)
            except _NETWORK_ERRORS as e:
                log.warning(
                    "pub/sub connection to %s lost (%s); reconnecting", self.url_redacted, e
                )
                outage_logged = True
            finally:
                async with self._ps_lock:
                    self._ps_conn = None
                    self._ps_pending.clear()
                await conn.disconnect(nowait=True)

    async def _ps_connect(self, outage_logged: bool) -> AbstractConnection:
        delay = 0.05
        while True:
            conn = self._pool.make_connection()
            try:
                await conn.connect()
                async with self._ps_lock:
                    self._ps_pending.clear()
                    for key, ch in self._channels.items():
                        self._ps_pending.append(("subscribe", key, ch.resubscribed))
                        await self._ps_send(conn, "SUBSCRIBE", key)
                    self._ps_conn = conn
                    self._ps_broken = asyncio.Event()
                    self._ps_last_rx = time.monotonic()
                if outage_logged:
                    log.warning("pub/sub connection to %s restored", self.url_redacted)
                return conn
            except _NETWORK_ERRORS as e:
                await conn.disconnect(nowait=True)
                if not outage_logged:
                    log.warning(
                        "cannot open pub/sub connection to %s (%s); retrying", self.url_redacted, e
                    )
                    outage_logged = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _ps_serve(self, conn: AbstractConnection) -> None:
        """Route messages until the connection fails: it raises, a command on it failed, or it
        stayed silent through a PING."""
        reader = asyncio.ensure_future(self._ps_read(conn))
        broken = asyncio.ensure_future(self._ps_broken.wait())
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
                if now - self._ps_last_rx < self._health_interval:
                    pinged_at = None
                elif pinged_at is None:
                    async with self._ps_lock:
                        await self._ps_send(conn, "PING")
                    pinged_at = now
                elif self._ps_last_rx < pinged_at:
                    raise RedisConnectionError(
                        f"no reply to PING within {self._health_interval:g}s"
                    )
        finally:
            for task in (reader, broken):
                task.cancel()
            await asyncio.gather(reader, broken, return_exceptions=True)

    async def _ps_read(self, conn: AbstractConnection) -> None:
        while True:
            reply = await conn.read_response(timeout=math.inf)
            self._ps_last_rx = time.monotonic()
            if not isinstance(reply, list):  # PONG, once no channel is subscribed
                continue
            kind, key = reply[0], reply[1]
            if kind == "message":
                ch = self._channels.get(key)
                if ch is not None:
                    for sub in ch.subscribers:
                        sub.wake()
            elif kind in ("subscribe", "unsubscribe"):
                if not self._ps_pending or self._ps_pending[0][:2] != (kind, key):
                    expected = self._ps_pending[0][:2] if self._ps_pending else None
                    raise RedisConnectionError(
                        f"pub/sub confirmation {kind} {key!r} out of order "
                        f"(expected {expected}); resynchronising"
                    )
                self._ps_pending.popleft()[2]()

    # --- locks and liveness -----------------------------------------------------------

    def lock(self, name: str, ttl: float, timeout: float) -> _Lock:
        return _Lock(self, name, ttl, timeout)

    async def beat(self, replica: str, ttl: float) -> None:
        await self._call(
            self._beat_script,
            keys=[self._k("replicas")],
            args=[replica, max(1, int(ttl * 1000))],
        )

    async def live_replicas(self) -> set[str]:
        return set(await self._call(self._live_script, keys=[self._k("replicas")]))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for ch in self._channels.values():
            ch.confirmed()  # release subscribe() calls still waiting for Redis
            for sub in ch.subscribers:
                sub.wake()  # a waiter re-reads state and finds the store closed, not a hang
        await self._redis.aclose()
