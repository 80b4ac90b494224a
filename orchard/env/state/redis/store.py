"""RedisStore: what lets several orchestrator replicas share sandboxes, jobs and events.

Its locks are in ``lock.py`` and its publish/subscribe in ``pubsub.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis

from orchard.env.schema import Job, JobStatus, SandboxEvent, SandboxInfo, SandboxStatus
from orchard.env.snapshot_schema import SnapshotInfo
from orchard.env.state.base import StoreUnavailable
from orchard.env.state.redis import lock
from orchard.env.state.redis._net import (
    NETWORK_ERRORS,
    cancels_requested,
    reraise_swallowed_cancel,
)
from orchard.env.state.redis.lock import RedisLock
from orchard.env.state.redis.pubsub import PubSub, Subscribe

P = ParamSpec("P")
T = TypeVar("T")

_UNFINISHED = {JobStatus.queued, JobStatus.running}

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
    # Not urlunsplit: with no host it writes "unix:/path", which redis-py 8.2 refuses.
    base = url.split("?", 1)[0]
    return (f"{base}?{rest}" if rest else base), prefixes[0] if prefixes else "orchard"


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
        # RESP2: the pub/sub reader parses replies itself, and RESP2 runs on every server.
        self._redis = aioredis.from_url(
            client_url,
            decode_responses=True,
            protocol=2,
            socket_connect_timeout=timeout,
            socket_timeout=timeout,
        )
        self._acquire_script = self._redis.register_script(lock.ACQUIRE)
        self._renew_script = self._redis.register_script(lock.RENEW)
        self._release_script = self._redis.register_script(lock.RELEASE)
        self._prune_script = self._redis.register_script(_PRUNE)
        self._append_event_script = self._redis.register_script(_APPEND_EVENT)
        self._prune_events_script = self._redis.register_script(_PRUNE_EVENTS)
        self._beat_script = self._redis.register_script(_BEAT)
        self._live_script = self._redis.register_script(_LIVE)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._pubsub = PubSub(self._redis.connection_pool, self.url_redacted, timeout=timeout,
                              health_interval=health_interval)

    def _unavailable(self, e: BaseException) -> StoreUnavailable:
        return StoreUnavailable(
            f"Redis state store at {self.url_redacted} is unavailable ({e}); check that the "
            "server is running and reachable and that the URL's host, port, password and "
            "TLS scheme are right"
        )

    async def _call(self, fn: Callable[P, Awaitable[T]], *args: P.args, **kw: P.kwargs) -> T:
        if self._closed:
            raise RuntimeError(f"RedisStore for {self.url_redacted} is closed")
        before = cancels_requested()
        try:
            result = await fn(*args, **kw)
        except NETWORK_ERRORS as e:
            raise self._unavailable(e) from e
        reraise_swallowed_cancel(before)
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

    async def put_snapshot(self, info: SnapshotInfo) -> None:
        await self._call(self._redis.hset, self._k("snapshots"), info.snapshot_id,
                         info.model_dump_json())

    async def get_snapshot(self, snapshot_id: str) -> SnapshotInfo | None:
        data = await self._call(self._redis.hget, self._k("snapshots"), snapshot_id)
        return None if data is None else SnapshotInfo.model_validate_json(data)

    async def list_snapshots(self) -> list[SnapshotInfo]:
        rows = await self._call(self._redis.hvals, self._k("snapshots"))
        return sorted((SnapshotInfo.model_validate_json(r) for r in rows),
                      key=lambda s: s.created_at)

    async def drop_snapshot(self, snapshot_id: str) -> None:
        await self._call(self._redis.hdel, self._k("snapshots"), snapshot_id)

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

    def subscribe(self, channel: str) -> Subscribe:
        return self._pubsub.subscribe(self._k("ch", channel))

    # --- locks and liveness -----------------------------------------------------------

    def lock(self, name: str, ttl: float, timeout: float) -> RedisLock:
        return RedisLock(self, name, ttl, timeout)

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
        await self._pubsub.close()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._redis.aclose()
