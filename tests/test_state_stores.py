"""The StateStore contract, checked against SQLite and a real Redis server alike."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from urllib.parse import parse_qs, urlsplit

import pytest
import redis.asyncio as aioredis

from orchard.env.schema import Job, JobStatus, SandboxInfo, SandboxStatus
from orchard.env.snapshot_schema import SnapshotInfo, SnapshotStatus
from orchard.env.state import (
    LockLost,
    LockTimeout,
    RedisStore,
    SqliteStore,
    StateStore,
    StoreUnavailable,
    open_store,
)
from tests.conftest import MakeStore

WAIT = 10.0  # generous bound for things that should happen promptly



def sandbox(sid: str, status: SandboxStatus = SandboxStatus.running) -> SandboxInfo:
    return SandboxInfo(
        sandbox_id=sid,
        status=status,
        image="host",
        block_network=True,
        labels={"team": "a"},
        created_at=datetime.now(UTC),
    )


def job(jid: str, status: JobStatus = JobStatus.queued) -> Job:
    return Job(
        job_id=jid,
        sandbox_id="sb",
        command="echo hi",
        status=status,
        created_at=datetime.now(UTC),
        stdout="hi\n",
        replica="r1",
    )




@pytest.fixture()
async def redis_admin(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


def prefix_of(url: str) -> str:
    return parse_qs(urlsplit(url).query)["prefix"][0]


# --- records ------------------------------------------------------------------------------


async def test_snapshot_round_trip(make_store: MakeStore) -> None:
    store = make_store()
    assert await store.get_snapshot("s1") is None
    made = [SnapshotInfo(snapshot_id=f"s{i}", sandbox_id="sb", image="host",
                         status=SnapshotStatus.ready, size_bytes=i,
                         created_at=datetime.fromtimestamp(1000 + i, UTC), labels={"k": "v"})
            for i in (2, 1)]
    for info in made:
        await store.put_snapshot(info)
    assert await store.get_snapshot("s1") == made[1]
    assert [s.snapshot_id for s in await store.list_snapshots()] == ["s1", "s2"]  # by age
    again = make_store()  # a restart, or another replica
    gone = made[0].model_copy(update={"status": SnapshotStatus.deleted})
    await again.put_snapshot(gone)
    assert await store.get_snapshot("s2") == gone
    await again.drop_snapshot("s2")
    assert [s.snapshot_id for s in await store.list_snapshots()] == ["s1"]
    await again.drop_snapshot("missing")  # dropping nothing is no error


async def test_sandbox_round_trip(store: StateStore) -> None:
    assert await store.get_sandbox("a") is None
    a, b = sandbox("a"), sandbox("b", SandboxStatus.pending)
    await store.put_sandbox(a)
    await store.put_sandbox(b)
    assert await store.get_sandbox("a") == a
    assert [s.sandbox_id for s in await store.list_sandboxes()] == ["a", "b"]

    a2 = a.model_copy(update={"status": SandboxStatus.failed, "error": "boom"})
    await store.put_sandbox(a2)
    assert await store.get_sandbox("a") == a2
    assert [s.sandbox_id for s in await store.list_sandboxes()] == ["b", "a"]  # by last write

    await store.drop_sandbox("a")
    await store.drop_sandbox("never-existed")
    assert await store.get_sandbox("a") is None
    assert await store.list_sandboxes() == [b]


async def test_jobs_and_unfinished(store: StateStore) -> None:
    assert await store.get_job("j") is None
    assert await store.unfinished_jobs() == []
    jobs = {s: job(f"j-{s.value}", s) for s in JobStatus}
    for j in jobs.values():
        await store.put_job(j)
    assert await store.get_job("j-failed") == jobs[JobStatus.failed]
    unfinished = {j.job_id: j for j in await store.unfinished_jobs()}
    assert unfinished == {"j-queued": jobs[JobStatus.queued], "j-running": jobs[JobStatus.running]}

    done = jobs[JobStatus.running].model_copy(update={"status": JobStatus.succeeded})
    await store.put_job(done)
    assert [j.job_id for j in await store.unfinished_jobs()] == ["j-queued"]
    # a finished job put back to running (e.g. retried) is unfinished again
    await store.put_job(done.model_copy(update={"status": JobStatus.running}))
    assert {j.job_id for j in await store.unfinished_jobs()} == {"j-queued", "j-running"}


async def test_prune_forgets_only_old_deleted_and_finished(store: StateStore) -> None:
    await store.put_sandbox(sandbox("gone", SandboxStatus.deleted))
    await store.put_sandbox(sandbox("alive"))
    await store.put_job(job("finished", JobStatus.succeeded))
    await store.put_job(job("failed", JobStatus.failed))
    await store.put_job(job("running", JobStatus.running))
    assert await store.prune(time.time() - 3600) == 0

    cutoff = time.time() + 1
    await store.put_sandbox(sandbox("deleted-later", SandboxStatus.deleted))
    # a sandbox revived from deleted is no longer prunable
    await store.put_sandbox(sandbox("revived", SandboxStatus.deleted))
    await store.put_sandbox(sandbox("revived"))
    assert await store.prune(cutoff) == 4  # gone, finished, failed, deleted-later
    assert await store.get_sandbox("gone") is None
    assert await store.get_sandbox("deleted-later") is None
    assert {s.sandbox_id for s in await store.list_sandboxes()} == {"alive", "revived"}
    assert await store.get_job("finished") is None
    assert await store.get_job("failed") is None
    assert await store.get_job("running") is not None
    assert await store.prune(cutoff) == 0


# --- publish / subscribe ------------------------------------------------------------------


async def test_publish_between_subscribe_and_wait_is_not_lost(store: StateStore) -> None:
    async with store.subscribe("c") as sub:
        await store.publish("c")
        assert await sub.wait(WAIT) is True
        # consumed: the next wait needs a new publish
        assert await sub.wait(0.2) is False
        await store.publish("c")
        await store.publish("c")
        assert await sub.wait(WAIT) is True


async def test_wait_times_out_without_publish(store: StateStore) -> None:
    async with store.subscribe("quiet") as sub:
        await store.publish("other")
        assert await sub.wait(0.3) is False


async def test_publish_from_another_task_wakes_every_subscriber(store: StateStore) -> None:
    async with store.subscribe("c") as s1, store.subscribe("c") as s2:
        async with store.subscribe("c") as s3:
            pass  # leaving must not unsubscribe the others
        del s3
        waiters = [asyncio.create_task(s.wait(WAIT)) for s in (s1, s2)]
        await asyncio.sleep(0.05)
        await store.publish("c")
        assert await asyncio.gather(*waiters) == [True, True]
    # resubscribing to a channel just left works
    async with store.subscribe("c") as s4:
        await store.publish("c")
        assert await s4.wait(WAIT) is True


# --- locks --------------------------------------------------------------------------------


async def test_lock_is_mutually_exclusive(make_store: MakeStore) -> None:
    first = make_store()
    # SQLite locks are per process; Redis ones hold across replicas, so test that there
    second = make_store() if first.shared else first
    inside: list[int] = []
    tokens: list[int] = []

    async def worker(store: StateStore) -> None:
        for _ in range(15):
            async with store.lock("excl", ttl=5, timeout=WAIT * 3) as token:
                assert not inside, "two holders at once"
                inside.append(token)
                tokens.append(token)
                await asyncio.sleep(0.005)
                inside.pop()

    await asyncio.gather(worker(first), worker(second))
    assert tokens == sorted(tokens) and len(set(tokens)) == 30


async def test_fencing_tokens_increase_across_restarts(make_store: MakeStore) -> None:
    store = make_store()
    tokens = []
    for _ in range(3):
        async with store.lock("f", ttl=5, timeout=WAIT) as token:
            tokens.append(token)
    async with store.lock("other", ttl=5, timeout=WAIT) as other:
        assert other >= 1
    await store.close()
    async with make_store().lock("f", ttl=5, timeout=WAIT) as token:
        tokens.append(token)
    assert tokens == sorted(set(tokens)) and len(tokens) == 4


async def test_lock_timeout_names_the_lock(store: StateStore) -> None:
    async with store.lock("busy", ttl=5, timeout=WAIT):
        with pytest.raises(LockTimeout, match="'busy'.*0.2s"):
            async with store.lock("busy", ttl=5, timeout=0.2):
                pytest.fail("acquired a held lock")
    async with store.lock("busy", ttl=5, timeout=0.2):
        pass


async def test_waiter_gets_lock_when_released(store: StateStore) -> None:
    held = asyncio.Event()

    async def holder() -> None:
        async with store.lock("w", ttl=5, timeout=WAIT):
            held.set()
            await asyncio.sleep(0.3)

    task = asyncio.create_task(holder())
    await held.wait()
    async with store.lock("w", ttl=5, timeout=WAIT):
        assert task.done()
    await task


async def test_lock_expires_after_holder_dies(make_store: MakeStore) -> None:
    dead = make_store()
    first = await dead.lock("d", ttl=1, timeout=WAIT).__aenter__()
    await dead.close()  # dies holding it: no release, no renewal
    async with make_store().lock("d", ttl=1, timeout=WAIT) as second:
        assert second > first


async def test_body_exception_propagates_and_releases(store: StateStore) -> None:
    with pytest.raises(KeyError):
        async with store.lock("e", ttl=5, timeout=WAIT):
            raise KeyError("boom")
    async with store.lock("e", ttl=5, timeout=0.5):
        pass


# --- liveness -----------------------------------------------------------------------------


async def test_beats_expire(make_store: MakeStore) -> None:
    a, b = make_store(), make_store()
    assert await a.live_replicas() == set()
    await a.beat("short", ttl=0.5)
    await b.beat("long", ttl=60)
    assert await a.live_replicas() == {"short", "long"}
    deadline = time.monotonic() + WAIT
    while await b.live_replicas() != {"long"}:
        assert time.monotonic() < deadline, "a beat outlived its ttl"
        await asyncio.sleep(0.1)
    await a.beat("short", ttl=60)  # beating again revives it
    assert await b.live_replicas() == {"short", "long"}


# --- opening ------------------------------------------------------------------------------


async def test_open_store_picks_by_scheme(tmp_path) -> None:
    sqlite = open_store(f"sqlite:///{tmp_path}/s.db")
    assert isinstance(sqlite, SqliteStore) and isinstance(sqlite, StateStore)
    assert not sqlite.shared
    await sqlite.close()
    for url in ("redis://localhost:6379/0", "rediss://:pw@h:6380/1", "unix:///run/r.sock?db=2"):
        store = open_store(url)
        assert isinstance(store, RedisStore) and isinstance(store, StateStore) and store.shared
        await store.close()
    assert RedisStore("redis://localhost/0").prefix == "orchard"
    assert RedisStore("redis://localhost/0?prefix=blue&db=1").prefix == "blue"
    with pytest.raises(ValueError, match=r"sqlite:///.*redis://"):
        open_store("postgres://db/state")
    with pytest.raises(ValueError, match="sqlite:///"):
        open_store("/var/lib/orchard/state.db")


# --- Redis: several replicas on one server ------------------------------------------------


async def test_replicas_share_records_and_publishes(redis_store_url: str) -> None:
    a, b = RedisStore(redis_store_url), RedisStore(redis_store_url)
    try:
        await a.put_sandbox(sandbox("s1"))
        await a.put_job(job("j1"))
        assert await b.get_sandbox("s1") == await a.get_sandbox("s1")
        assert [j.job_id for j in await b.unfinished_jobs()] == ["j1"]
        async with b.subscribe("jobs") as sub:
            await a.publish("jobs")  # right after subscribe returned: must not be lost
            assert await sub.wait(WAIT) is True
    finally:
        await a.close()
        await b.close()


async def test_prefixes_isolate(redis_url: str) -> None:
    a = RedisStore(f"{redis_url}?prefix=iso-a")
    b = RedisStore(f"{redis_url}?prefix=iso-b")
    try:
        await a.put_sandbox(sandbox("x"))
        assert await b.get_sandbox("x") is None
        async with b.subscribe("c") as sub:
            await a.publish("c")
            assert await sub.wait(0.3) is False
    finally:
        await a.drop_sandbox("x")
        await a.close()
        await b.close()


async def test_stolen_lock_raises_lock_lost_on_exit(
    redis_store_url: str, redis_admin: aioredis.Redis
) -> None:
    a, b = RedisStore(redis_store_url), RedisStore(redis_store_url)
    try:
        with pytest.raises(LockLost, match="'s'"):
            async with a.lock("s", ttl=1, timeout=WAIT) as mine:
                # as if a's renewals had stalled past the ttl: the key vanishes, b takes it
                await redis_admin.delete(f"{prefix_of(redis_store_url)}:lock:s")
                async with b.lock("s", ttl=5, timeout=WAIT) as theirs:
                    assert theirs > mine
                    await asyncio.sleep(0.6)  # a's renewal runs meanwhile and finds it gone
                    assert await b.live_replicas() == set()  # b is still usable
        # b released normally; a did not delete b's key on its way out
        async with a.lock("s", ttl=1, timeout=0.5):
            pass
    finally:
        await a.close()
        await b.close()


async def test_lost_lock_does_not_mask_body_exception(
    redis_store_url: str, redis_admin: aioredis.Redis
) -> None:
    store = RedisStore(redis_store_url)
    try:
        with pytest.raises(KeyError) as info:
            async with store.lock("m", ttl=5, timeout=WAIT):
                await redis_admin.delete(f"{prefix_of(redis_store_url)}:lock:m")
                raise KeyError("body failed")
        assert any("'m'" in note for note in info.value.__notes__)
    finally:
        await store.close()


async def test_renewal_keeps_lock_past_ttl(redis_store_url: str) -> None:
    a, b = RedisStore(redis_store_url), RedisStore(redis_store_url)
    try:
        # A ttl of seconds, not a fraction: renewals on a loaded 2-core CI machine can be
        # late by a few hundred milliseconds without anything being wrong.
        async with a.lock("long", ttl=2.0, timeout=WAIT):
            await asyncio.sleep(5.0)  # two and a half ttls: only renewals keep it
            with pytest.raises(LockTimeout):
                async with b.lock("long", ttl=2.0, timeout=0.1):
                    pass
    finally:
        await a.close()
        await b.close()


async def test_pubsub_connection_killed_is_survived(
    redis_store_url: str, redis_admin: aioredis.Redis
) -> None:
    a, b = RedisStore(redis_store_url), RedisStore(redis_store_url)
    try:
        async with a.subscribe("c") as sub:
            assert await redis_admin.client_kill_filter(_type="pubsub") >= 1
            # everyone subscribed is woken once resubscribed, for what the outage swallowed
            assert await sub.wait(WAIT) is True
            await b.publish("c")
            assert await sub.wait(WAIT) is True
            async with a.subscribe("d") as fresh:
                await b.publish("d")
                assert await fresh.wait(WAIT) is True
        # locks (which wait via pub/sub) still work across the kill
        async with a.lock("k", ttl=1, timeout=WAIT):
            pass
    finally:
        await a.close()
        await b.close()


async def test_unreachable_redis_raises_store_unavailable(redis_url: str) -> None:
    # a port that was free a moment ago: nothing listens there
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = RedisStore(f"redis://:hunter2@127.0.0.1:{port}/0", timeout=0.5)
    try:
        with pytest.raises(StoreUnavailable, match=rf"127\.0\.0\.1:{port}") as info:
            await store.get_sandbox("x")
        assert "hunter2" not in str(info.value)
        with pytest.raises(StoreUnavailable, match="did not confirm"):
            async with store.subscribe("c"):
                pass
    finally:
        await store.close()


async def test_close_leaks_no_tasks_or_connections(
    redis_store_url: str, redis_admin: aioredis.Redis
) -> None:
    async def clients() -> int:
        return len(await redis_admin.client_list())

    baseline = await clients()
    tasks_before = asyncio.all_tasks()
    store = RedisStore(redis_store_url)
    async with store.subscribe("c") as sub:
        lock = store.lock("held", ttl=5, timeout=WAIT)
        await lock.__aenter__()
        waiter = asyncio.create_task(sub.wait(WAIT))
        await asyncio.sleep(0.05)
        assert await clients() > baseline
        await store.close()
        assert await asyncio.wait_for(waiter, WAIT) is True  # woken, not left hanging
    assert asyncio.all_tasks() - tasks_before == {asyncio.current_task()} - tasks_before
    deadline = time.monotonic() + WAIT
    while await clients() != baseline:
        assert time.monotonic() < deadline, "connections left open after close()"
        await asyncio.sleep(0.05)


class SilenceableRelay:
    """A loopback TCP relay to Redis that can stop answering on the connections it already
    carries while it still relays new ones: a half-open connection that lasts until the client
    gives it up, whatever the machine's load (a CLIENT PAUSE would end on a timer)."""

    def __init__(self, port: int) -> None:
        self.redis_port = port
        self.connections = 0
        self._open: list[asyncio.StreamWriter] = []
        self._silenced: set[asyncio.StreamWriter] = set()
        self._pumps: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> int:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._open:
            writer.close()
        for task in self._pumps:
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    def silence_open_connections(self) -> None:
        self._silenced.update(self._open)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.redis_port)
        self._open += [writer, up_writer]
        for src, dst, key in ((reader, up_writer, writer), (up_reader, writer, writer)):
            task = asyncio.ensure_future(self._pump(src, dst, key))
            self._pumps.add(task)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    key: asyncio.StreamWriter) -> None:
        while data := await src.read(65536):
            if key not in self._silenced:  # a silenced connection swallows what it reads
                dst.write(data)
                await dst.drain()


async def test_silent_pubsub_connection_is_replaced(
    redis_store_url: str, redis_admin: aioredis.Redis
) -> None:
    # The store's pub/sub connection goes silent, as a half-open TCP connection would; the
    # store must notice, reconnect and wake its waiters, who may have missed a publish.
    url = urlsplit(redis_store_url)
    relay = SilenceableRelay(url.port or 6379)
    async with relay as port:
        store = RedisStore(url._replace(netloc=f"127.0.0.1:{port}").geturl(),
                           health_interval=0.2)
        try:
            async with store.subscribe("c") as sub:
                before = relay.connections
                relay.silence_open_connections()
                assert await sub.wait(WAIT) is True
                assert relay.connections > before  # woken by a new connection's SUBSCRIBE
                await redis_admin.publish(f"{prefix_of(redis_store_url)}:ch:c", "")
                assert await sub.wait(WAIT) is True
        finally:
            await store.close()
