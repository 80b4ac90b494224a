"""The sandbox lifecycle: admission, create and launch, delete and teardown, heartbeats, the
agents of running sandboxes, and the reconcile pass that makes the records and the backend
(the source of truth) agree.

A failed backend LIST skips the orphan and vanished parts of that pass, so a transient error
never mass-deletes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Protocol

from orchard.env.agent.client import AgentClient
from orchard.env.backends.base import (
    Backend,
    BackendError,
    ImageUnavailable,
    SandboxHandle,
    SandboxSpec,
    SpecForbidden,
    SpecRejected,
)
from orchard.env.build_schema import names_an_image
from orchard.env.config import Settings
from orchard.env.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    NotFound,
    Overloaded,
    WaitTimedOut,
)
from orchard.env.events import EventLog
from orchard.env.image_schema import ImageConfig
from orchard.env.metrics import Metrics
from orchard.env.quantities import parse_cpu, parse_memory
from orchard.env.schema import CreateSandboxRequest, EventKind, SandboxInfo, SandboxStatus
from orchard.env.service.images import image_error
from orchard.env.service.reconciler import PartialPass, listed
from orchard.env.service.records import (
    LIVE,
    POOL_LABEL,
    SandboxRecords,
    became_ready,
    utc_time,
)
from orchard.env.snapshot_schema import SnapshotInfo
from orchard.env.state.base import StateStore

log = logging.getLogger("orchard.env")

# How long a request to a sandbox that is still starting waits for it.
PENDING_REQUEST_WAIT = 15.0
# A pending sandbox's progress (its image's pull) is written to its record at most this often.
PROGRESS_INTERVAL = 0.5


class SnapshotSource(Protocol):
    """Where a create from a snapshot finds it (the snapshots part)."""

    async def snapshot_to_start(self, req: CreateSandboxRequest) -> SnapshotInfo: ...

    async def built_image(self, name: str) -> tuple[SnapshotInfo, ImageConfig] | None: ...


class PoolTaker(Protocol):
    """Where a create first looks for a ready sandbox (the warm pools)."""

    async def take(self, req: CreateSandboxRequest) -> SandboxInfo | None: ...


class Lifecycle:
    def __init__(self, records: SandboxRecords, store: StateStore, backend: Backend,
                 settings: Settings, metrics: Metrics, events: EventLog, replica: str,
                 snapshots: SnapshotSource) -> None:
        self.records = records
        self.store = store
        self.backend = backend
        self.settings = settings
        self.metrics = metrics
        self.events = events
        self.replica = replica
        self.snapshots = snapshots
        self.pool: PoolTaker | None = None
        self._agents: dict[str, AgentClient] = {}
        self._launches: dict[str, asyncio.Task[None]] = {}
        self._teardowns: dict[str, asyncio.Task[None]] = {}
        self.creates_in_flight = 0
        # Forks queue here for a launch slot rather than being turned away.
        self._launch_slots = asyncio.Semaphore(settings.max_concurrent_creates)

    async def _fail(self, sid: str, reason: str,
                    only_if: tuple[SandboxStatus, ...] = LIVE,
                    image_error: str | None = None) -> None:
        changed = False

        def change(rec: SandboxInfo) -> bool:
            nonlocal changed
            if rec.status not in only_if:
                return False
            rec.status, rec.error = SandboxStatus.failed, reason
            rec.image_error = image_error
            changed = True
            return True

        rec = await self.records.update(sid, change)
        if changed and rec is not None:
            await self.events.record(rec, EventKind.failed, reason=reason)
        if rec is not None and rec.status == SandboxStatus.failed:
            log.warning("sandbox %s failed: %s", sid, reason)
            self._start_teardown(sid)

    # --- lifecycle --------------------------------------------------------------------------

    async def create(self, req: CreateSandboxRequest, *, queued: bool = False,
                     for_pool: bool = False) -> SandboxInfo:
        """Record and launch a sandbox; ``queued`` ones (forks, pools) wait for a launch slot
        instead of being turned away when max_concurrent_creates are in flight. A create that
        a warm pool can serve takes its sandbox instead, ready at once; ``for_pool`` ones are
        the pool's own launches."""
        if not for_pool:
            if POOL_LABEL in req.labels:  # else a user's sandbox could join a pool
                raise BadRequest(f"the label {POOL_LABEL!r} is reserved for warm pools; "
                                 "use another key")
            if self.pool is not None and (taken := await self.pool.take(req)) is not None:
                return taken
        sid = req.sandbox_id or f"sb-{uuid.uuid4().hex[:12]}"
        image = req.image or "host"
        from_snapshot, env, workdir = req.from_snapshot, req.env, req.workdir
        if from_snapshot is not None:
            image = (await self.snapshots.snapshot_to_start(req)).image
        elif names_an_image(image) and (built := await self.snapshots.built_image(image)):
            # A name a Dockerfile build tagged: its last step's files over its base image,
            # with the ENV and WORKDIR it recorded (what the request gives wins).
            snap, config = built
            from_snapshot, image = snap.snapshot_id, snap.image
            env, workdir = {**config.env, **req.env}, workdir or config.workdir
        asked_env, model_base_url = env, None
        if req.model_proxy:
            model_base_url = self._model_base_url(req.session or "")
            env = {**model_env(model_base_url, req.session or ""), **env}
        spec = SandboxSpec(sandbox_id=sid, image=image, block_network=req.block_network,
                           cpu=req.cpu, memory=req.memory, pids=req.pids, disk=req.disk,
                           env=env, labels=req.labels, model_proxy=req.model_proxy,
                           session=req.session, egress=req.egress, snapshot=from_snapshot)
        try:
            self.backend.check(spec)
            cpu = parse_cpu(req.cpu) if req.cpu is not None else None
            memory = parse_memory(req.memory) if req.memory is not None else None
            disk = parse_memory(req.disk) if req.disk is not None else None
        except SpecForbidden as e:
            raise Forbidden(str(e)) from None
        except ValueError as e:
            raise BadRequest(str(e)) from None
        if cpu is not None and cpu <= 0 or memory is not None and memory < 4 << 20:
            raise BadRequest("cpu must be > 0 and memory at least 4Mi")
        if disk is not None and disk < 16 << 20:  # room for ext4's metadata and the overlay
            raise BadRequest(f"disk {req.disk!r} is below the minimum of 16Mi; ask for more")
        if self.records.active_count() >= self.settings.max_sandboxes:
            raise Overloaded(f"at capacity: {self.settings.max_sandboxes} sandboxes are live; "
                             "delete some or retry later", 2)
        if not queued and self.creates_in_flight >= self.settings.max_concurrent_creates:
            raise Overloaded(f"{self.creates_in_flight} creates in flight (the maximum); retry "
                             "after the delay in Retry-After", 1)
        if sid in self._teardowns:
            raise Overloaded(f"sandbox {sid} is still being torn down; retry shortly", 1)
        await self._check_image(image)
        now = time.time()
        rec = SandboxInfo(
            sandbox_id=sid, status=SandboxStatus.pending, image=image,
            block_network=req.block_network, cpu=req.cpu, memory=req.memory, pids=req.pids,
            disk=req.disk, env=asked_env, from_snapshot=from_snapshot, workdir=workdir,
            labels=req.labels, created_at=utc_time(now),
            ready_deadline=utc_time(now + (req.timeout or self.settings.pending_timeout)),
            expires_at=utc_time(now + (req.ttl or self.settings.default_ttl)),
            backend=self.backend.name, exclusive_exec=req.exclusive_exec, replica=self.replica,
            session=req.session, model_base_url=model_base_url,
            namespace=self.backend.namespace, egress=req.egress,
        )
        await self.records.insert(rec)
        await self.events.record(rec, EventKind.created, now, image=image,
                                 block_network=req.block_network, cpu=req.cpu,
                                 memory=req.memory, pids=req.pids, disk=req.disk, env=req.env,
                                 model_proxy=req.model_proxy, timeout=req.timeout,
                                 ttl=req.ttl, egress=req.egress,
                                 from_snapshot=from_snapshot, workdir=workdir)
        self.creates_in_flight += 1
        self._launches[sid] = asyncio.create_task(self._launch(spec))
        return rec

    async def _check_image(self, image: str) -> None:
        """Fail the create itself when its image cannot be had (unknown, refused, not for
        this platform, registry down), before anything is recorded."""
        if self.backend.image_cache is None:
            return
        try:
            await self.backend.image_cache.check(image)
        except ImageUnavailable as e:
            raise image_error(e) from None

    def _reporter(self, sid: str) -> Callable[[str], Awaitable[None]]:
        """Writes a pending sandbox's progress to its record, at most every
        PROGRESS_INTERVAL, and at once when a new stage (pulling, unpacking) begins."""
        last, stage = 0.0, ""

        async def report(message: str) -> None:
            nonlocal last, stage
            now, new_stage = time.monotonic(), message.split(" ", 1)[0]
            if now - last < PROGRESS_INTERVAL and new_stage == stage:
                return
            last, stage = now, new_stage

            def change(rec: SandboxInfo) -> bool:
                if rec.status != SandboxStatus.pending:
                    return False
                rec.progress = message
                return True

            await self.records.update(sid, change)

        return report

    async def _launch(self, spec: SandboxSpec) -> None:
        sid = spec.sandbox_id
        t0 = time.perf_counter()
        try:
            if self.backend.image_cache is not None:
                # Outside the launch slots: a long pull must not hold up other creates.
                await self.backend.image_cache.pull(spec.image, self._reporter(sid))
            async with self._launch_slots:
                handle = await self.backend.create(spec)
        except asyncio.CancelledError:
            raise  # a delete cancelled us and already recorded it
        except ImageUnavailable as e:
            self.metrics.creates.labels("failed").inc()
            await self._fail(sid, str(e), image_error=e.kind)
            return
        except Exception as e:  # noqa: BLE001 - any failure becomes the record's error
            self.metrics.creates.labels("failed").inc()
            await self._fail(sid, str(e) if isinstance(e, BackendError)
                             else f"{type(e).__name__}: {e}")
            return
        finally:
            self.creates_in_flight -= 1
            self._launches.pop(sid, None)
        self.metrics.create_seconds.observe(time.perf_counter() - t0)
        self.metrics.creates.labels("ok").inc()
        self._agents[sid] = self._agent_client(handle)
        rec = await self.records.update(sid, became_ready(handle.limits))
        if rec is not None and rec.status == SandboxStatus.running:
            await self.events.record(rec, EventKind.ready,
                                     create_ms=round((time.perf_counter() - t0) * 1000, 3))
        if rec is None or rec.status != SandboxStatus.running:
            # Deleted (or failed) while it started, perhaps through another replica.
            self._start_teardown(sid)

    async def delete(self, sid: str, reason: str = "deleted by request") -> bool:
        """Delete a sandbox; False if there was none by that id (deleting is idempotent)."""
        changed = False

        def change(rec: SandboxInfo) -> bool:
            nonlocal changed
            if rec.status == SandboxStatus.deleted:
                return False
            rec.status = SandboxStatus.deleted
            if reason != "deleted by request":
                rec.error = reason
            changed = True
            return True

        rec = await self.records.update(sid, change)
        if rec is None:
            return False
        if changed:
            await self.events.record(rec, EventKind.deleted, reason=reason)
        self._start_teardown(sid)
        return True

    def _start_teardown(self, sid: str) -> None:
        if sid not in self._teardowns:
            self._teardowns[sid] = asyncio.create_task(self._teardown(sid))

    async def _teardown(self, sid: str) -> None:
        try:
            launch = self._launches.get(sid)
            if launch is not None:
                launch.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await launch
            agent = self._agents.pop(sid, None)
            if agent is not None:
                await agent.close()
            await self.backend.delete(sid)
        except Exception:  # noqa: BLE001 - the reconcile loop retries orphans
            log.exception("teardown of %s failed; the reconcile loop will retry", sid)
        finally:
            self._teardowns.pop(sid, None)

    async def heartbeat(self, sid: str) -> SandboxInfo:
        def change(rec: SandboxInfo) -> bool:
            if rec.status not in LIVE:
                return False
            rec.last_heartbeat = utc_time()
            return True

        rec = await self.records.update(sid, change)
        if rec is None or rec.status not in LIVE:
            raise NotFound(f"no live sandbox {sid!r}; it is "
                           f"{'unknown' if rec is None else rec.status.value}: recreate it")
        return rec

    # --- stop -----------------------------------------------------------------------------

    async def delete_own(self) -> None:
        """Delete the live sandboxes this replica answers for: its own, or all of them when
        nobody else shares the store."""
        for rec in await self.store.list_sandboxes():
            if rec.status in LIVE and (rec.replica == self.replica or not self.store.shared):
                await self.delete(rec.sandbox_id)

    async def settle(self) -> None:
        """Wait for every launch and teardown under way."""
        await asyncio.gather(*self._teardowns.values(), *self._launches.values(),
                             return_exceptions=True)

    async def launched(self, sandbox_ids: list[str]) -> None:
        """Wait until none of these sandboxes is still launching (each started or failed)."""
        launches = [t for s in sandbox_ids if (t := self._launches.get(s)) is not None]
        await asyncio.gather(*launches, return_exceptions=True)

    async def close_agents(self) -> None:
        for agent in self._agents.values():
            await agent.close()
        self._agents.clear()

    # --- reconcile ------------------------------------------------------------------------

    def _expired(self, rec: SandboxInfo, now: float) -> str | None:
        if rec.expires_at and now > rec.expires_at.timestamp():
            return "ttl expired"
        # A paused sandbox has nobody to beat for it until it resumes.
        if (rec.last_heartbeat and rec.status != SandboxStatus.paused
                and now - rec.last_heartbeat.timestamp() > self.settings.heartbeat_timeout):
            return "heartbeat timed out"
        deadline = (rec.ready_deadline.timestamp() if rec.ready_deadline
                    else rec.created_at.timestamp() + self.settings.pending_timeout)
        if rec.status == SandboxStatus.pending and now > deadline:
            return "pending timeout: never became ready"
        return None

    async def reconcile(self) -> None:
        """One pass of making the store and the backend agree. The backend is listed BEFORE
        the records: a replica writes a record before it creates the sandbox, so whatever the
        backend listed already has its record, and no fresh sandbox is taken for an orphan.

        Raises PartialPass, after the rest, when the backend could not be listed."""
        now = time.time()
        alive = await self.store.live_replicas() if self.store.shared else set()
        alive.add(self.replica)
        existing, unlisted = await listed(self.backend.list())
        live = await self.records.read_live()
        for sid, rec in live.items():
            if reason := self._expired(rec, now):
                await self.delete(sid, reason)
            elif rec.status == SandboxStatus.pending:
                if rec.replica not in alive:  # its launch died with its replica
                    await self._adopt_pending(sid)
            elif existing is not None and (sid not in existing
                                           or await self.backend.adopt(sid) is None):
                await self._fail(sid, "sandbox exited unexpectedly; delete and recreate it",
                                 only_if=(SandboxStatus.running, SandboxStatus.paused))
        if existing is not None:
            for sid in existing - live.keys() - self._teardowns.keys() - self._launches.keys():
                log.info("removing orphan sandbox %s (no live record)", sid)
                await self.backend.delete(sid)
        for sid in [s for s in self._agents if s not in live]:
            await self._agents.pop(sid).close()
        if unlisted is not None:
            raise PartialPass("backend list failed; skipped the orphan and vanished "
                              f"sandboxes: {unlisted}") from unlisted

    async def _adopt_pending(self, sid: str) -> None:
        handle = await self.backend.adopt(sid)
        if handle is None:
            await self._fail(sid, "the orchestrator replica launching it stopped before it was "
                             "ready; delete and recreate it", only_if=(SandboxStatus.pending,))
            return
        self._agents[sid] = self._agent_client(handle)
        await self.records.update(sid, became_ready(handle.limits))
        log.info("adopted sandbox %s, launched by a replica that stopped", sid)

    # --- agents -------------------------------------------------------------------------------

    async def running(self, sid: str) -> tuple[SandboxInfo, AgentClient]:
        rec = await self.store.get_sandbox(sid)
        # A pool's sandbox is reached by nobody before it is taken: it must stay untouched.
        if rec is None or rec.status == SandboxStatus.deleted or POOL_LABEL in rec.labels:
            raise NotFound(f"no sandbox {sid!r}; list them with GET /sandboxes")
        if rec.status == SandboxStatus.pending:
            # A request right after a create that did not wait waits for the start, briefly,
            # rather than failing a client that raced its own sandbox.
            with contextlib.suppress(WaitTimedOut):
                rec = await self.records.wait(sid, PENDING_REQUEST_WAIT)
        if rec.status != SandboxStatus.running:
            hint = {"pending": f"wait for it with GET /sandboxes/{sid}/wait",
                    "paused": f"resume it with POST /sandboxes/{sid}/resume",
                    "failed": f"it failed: {rec.error}; delete and recreate it"}
            raise Conflict(f"sandbox {sid} is {rec.status.value}: "
                           + hint.get(rec.status.value, "recreate it"))
        agent = self._agents.get(sid)
        if agent is None:  # launched by another replica, or before a restart
            handle = await self.backend.adopt(sid)
            if handle is None:
                raise Conflict(f"sandbox {sid} is running on record but its agent cannot be "
                               "found; it may have just exited: check GET /sandboxes/{id}")
            agent = self._agents[sid] = self._agent_client(handle)
        return rec, agent

    def _agent_client(self, handle: SandboxHandle) -> AgentClient:
        return AgentClient(handle.address, token=handle.token,
                           timeout=self.settings.agent_timeout, **self.settings.agent_limits())

    async def agent(self, sid: str) -> AgentClient:
        return (await self.running(sid))[1]

    def _model_base_url(self, session: str) -> str:
        if self.settings.model_proxy is None:
            raise BadRequest("this orchestrator has no recording proxy for model_proxy "
                             "sandboxes: start it with --model-proxy URL (see "
                             "docs/guides/harnesses.md)")
        try:
            return self.backend.model_base_url(session)
        except SpecRejected as e:
            raise BadRequest(str(e)) from None


def model_env(base_url: str, session: str) -> dict[str, str]:
    """What a harness in a model_proxy sandbox finds in its environment. The key is a
    placeholder many clients insist on; the proxy decides what goes upstream (--api-key)."""
    return {"OPENAI_BASE_URL": base_url, "OPENAI_API_BASE": base_url,
            "OPENAI_API_KEY": "orchard-proxy", "ORCHARD_SESSION": session}
