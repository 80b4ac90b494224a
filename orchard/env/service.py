"""The sandbox service: lifecycle, admission, reconcile (exec jobs: exec_jobs.py). Backend- and
store-agnostic.

State is reconciled from the backend (the source of truth) in a loop; a failed backend LIST
skips the orphan pass, so a transient error never mass-deletes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from orchard.env.agent.client import AgentClient
from orchard.env.backends.base import (
    Backend,
    BackendError,
    SandboxHandle,
    SandboxSpec,
    SpecForbidden,
    SpecRejected,
)
from orchard.env.branching import Branching
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
from orchard.env.exec_jobs import ExecJobs, utc_time
from orchard.env.metrics import Metrics
from orchard.env.quantities import parse_cpu, parse_memory
from orchard.env.schema import (
    CreateSandboxRequest,
    EventKind,
    EventList,
    JobStatus,
    LimitReport,
    SandboxInfo,
    SandboxStatus,
)
from orchard.env.state.base import StateStore

log = logging.getLogger("orchard.env")
LIVE = (SandboxStatus.pending, SandboxStatus.running, SandboxStatus.paused)


# How long a request to a sandbox that is still starting waits for it.
PENDING_REQUEST_WAIT = 15.0


def _became_ready(limits: dict[str, LimitReport]) -> Callable[[SandboxInfo], bool]:
    def change(rec: SandboxInfo) -> bool:
        if rec.status != SandboxStatus.pending:
            return False
        rec.status, rec.ready_at, rec.limits = SandboxStatus.running, utc_time(), limits
        return True
    return change


def replica_id() -> str:
    """Unique per process start: a restarted orchestrator is a new replica, so jobs it ran
    before the restart are recognisably orphaned."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class SandboxService(ExecJobs, Branching):
    """Records live in the store, which several replicas may share: every decision re-reads
    the record, and every change goes through `_update` under the record's lock, so two
    replicas never overwrite each other's transitions (e.g. resurrect a deleted sandbox)."""

    def __init__(self, backend: Backend, store: StateStore, settings: Settings,
                 metrics: Metrics | None = None) -> None:
        self.backend = backend
        self.store = store
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.events = EventLog(store, self.metrics, settings.event_content_bytes)
        self.replica = replica_id()
        # Live records as of the last reconcile plus this replica's own changes since: the
        # admission count reads it (approximate across replicas by one reconcile interval).
        self._live: dict[str, SandboxInfo] = {}
        self._agents: dict[str, AgentClient] = {}
        self._launches: dict[str, asyncio.Task[None]] = {}
        self._teardowns: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._reconciler: asyncio.Task[None] | None = None
        self.creates_in_flight = 0
        # Forks queue here for a launch slot rather than being turned away.
        self._launch_slots = asyncio.Semaphore(settings.max_concurrent_creates)

    @property
    def beat_ttl(self) -> float:
        """How long this replica counts as alive after a beat: three missed passes."""
        return 3 * self.settings.reconcile_interval + 2

    # --- start / stop -------------------------------------------------------------------

    async def start(self) -> None:
        """Adopt what the store and the backend hold (a restart or another replica's work),
        fail what can no longer finish, remove orphans; then keep reconciling."""
        await self.reconcile_once()
        self._reconciler = asyncio.create_task(self._reconcile_loop())

    async def stop(self, delete_all: bool = False) -> None:
        if self._reconciler:
            self._reconciler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconciler
        if delete_all:
            for rec in await self.store.list_sandboxes():
                if rec.status in LIVE and (rec.replica == self.replica or not self.store.shared):
                    await self.delete(rec.sandbox_id)
        pending = [*self._teardowns.values(), *self._launches.values(), *self._tasks]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if delete_all and not self.store.shared:  # an embedded orchestrator's go with it
            for snap in await self.store.list_snapshots():
                await self.delete_snapshot(snap.snapshot_id)
            await self.collect_snapshots(time.time())  # those deleted earlier, unused now
        for agent in self._agents.values():
            await agent.close()
        self._agents.clear()

    # --- records ----------------------------------------------------------------------------

    async def _update(self, sid: str,
                      change: Callable[[SandboxInfo], bool]) -> SandboxInfo | None:
        """Apply change to the stored record under its lock; change returns False to leave
        it as it is. Returns the record as it now stands (None if there is none)."""
        async with self.store.lock(f"record:{sid}", ttl=15, timeout=30):
            rec = await self.store.get_sandbox(sid)
            if rec is None or not change(rec):
                return rec
            await self.store.put_sandbox(rec)
        if rec.status in LIVE:
            self._live[sid] = rec
        else:
            self._live.pop(sid, None)
        await self.store.publish(f"sandbox:{sid}")
        return rec

    async def _fail(self, sid: str, reason: str,
                    only_if: tuple[SandboxStatus, ...] = LIVE) -> None:
        changed = False

        def change(rec: SandboxInfo) -> bool:
            nonlocal changed
            if rec.status not in only_if:
                return False
            rec.status, rec.error = SandboxStatus.failed, reason
            changed = True
            return True

        rec = await self._update(sid, change)
        if changed and rec is not None:
            await self.events.record(rec, EventKind.failed, reason=reason)
        if rec is not None and rec.status == SandboxStatus.failed:
            log.warning("sandbox %s failed: %s", sid, reason)
            self._start_teardown(sid)

    def active_count(self) -> int:
        return len(self._live)

    # --- lifecycle --------------------------------------------------------------------------

    async def create(self, req: CreateSandboxRequest, *, queued: bool = False) -> SandboxInfo:
        """Record and launch a sandbox; ``queued`` ones (forks) wait for a launch slot instead
        of being turned away when max_concurrent_creates are in flight."""
        sid = req.sandbox_id or f"sb-{uuid.uuid4().hex[:12]}"
        image = req.image or "host"
        if req.from_snapshot is not None:
            image = (await self.snapshot_to_start(req)).image
        env, model_base_url = req.env, None
        if req.model_proxy:
            model_base_url = self._model_base_url(req.session or "")
            env = {**model_env(model_base_url, req.session or ""), **req.env}
        spec = SandboxSpec(sandbox_id=sid, image=image, block_network=req.block_network,
                           cpu=req.cpu, memory=req.memory, pids=req.pids, disk=req.disk,
                           env=env, labels=req.labels, model_proxy=req.model_proxy,
                           session=req.session, egress=req.egress, snapshot=req.from_snapshot)
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
        if self.active_count() >= self.settings.max_sandboxes:
            raise Overloaded(f"at capacity: {self.settings.max_sandboxes} sandboxes are live; "
                             "delete some or retry later", 2)
        if not queued and self.creates_in_flight >= self.settings.max_concurrent_creates:
            raise Overloaded(f"{self.creates_in_flight} creates in flight (the maximum); retry "
                             "after the delay in Retry-After", 1)
        if sid in self._teardowns:
            raise Overloaded(f"sandbox {sid} is still being torn down; retry shortly", 1)
        now = time.time()
        rec = SandboxInfo(
            sandbox_id=sid, status=SandboxStatus.pending, image=image,
            block_network=req.block_network, cpu=req.cpu, memory=req.memory, pids=req.pids,
            disk=req.disk, env=req.env, from_snapshot=req.from_snapshot,
            labels=req.labels, created_at=utc_time(now),
            ready_deadline=utc_time(now + (req.timeout or self.settings.pending_timeout)),
            expires_at=utc_time(now + (req.ttl or self.settings.default_ttl)),
            backend=self.backend.name, exclusive_exec=req.exclusive_exec, replica=self.replica,
            session=req.session, model_base_url=model_base_url,
            namespace=getattr(self.backend, "namespace", None), egress=req.egress,
        )
        async with self.store.lock(f"record:{sid}", ttl=15, timeout=30):
            existing = await self.store.get_sandbox(sid)
            if existing is not None and existing.status in LIVE:
                raise Conflict(f"sandbox {sid} already exists ({existing.status.value}); "
                               "choose another sandbox_id or delete it first")
            await self.store.put_sandbox(rec)
        self._live[sid] = rec
        await self.events.record(rec, EventKind.created, now, image=image,
                                 block_network=req.block_network, cpu=req.cpu,
                                 memory=req.memory, pids=req.pids, disk=req.disk, env=req.env,
                                 model_proxy=req.model_proxy, timeout=req.timeout,
                                 ttl=req.ttl, egress=req.egress,
                                 from_snapshot=req.from_snapshot)
        self.creates_in_flight += 1
        self._launches[sid] = asyncio.create_task(self._launch(spec))
        return rec

    async def _launch(self, spec: SandboxSpec) -> None:
        sid = spec.sandbox_id
        t0 = time.perf_counter()
        try:
            async with self._launch_slots:
                handle = await self.backend.create(spec)
        except asyncio.CancelledError:
            raise  # a delete cancelled us and already recorded it
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
        rec = await self._update(sid, _became_ready(handle.limits))
        if rec is not None and rec.status == SandboxStatus.running:
            await self.events.record(rec, EventKind.ready,
                                     create_ms=round((time.perf_counter() - t0) * 1000, 3))
        if rec is None or rec.status != SandboxStatus.running:
            # Deleted (or failed) while it started, perhaps through another replica.
            self._start_teardown(sid)

    async def get(self, sid: str) -> SandboxInfo:
        rec = await self.store.get_sandbox(sid)
        if rec is None:
            raise NotFound(f"no sandbox {sid!r}; list them with GET /sandboxes")
        return rec

    async def list(self, labels: dict[str, str] | None = None) -> list[SandboxInfo]:
        want = (labels or {}).items()
        return [r for r in await self.store.list_sandboxes()
                if r.status != SandboxStatus.deleted and want <= r.labels.items()]

    async def wait(self, sid: str, timeout: float) -> SandboxInfo:
        deadline = time.monotonic() + timeout
        async with self.store.subscribe(f"sandbox:{sid}") as changed:
            rec = await self.get(sid)
            while rec.status == SandboxStatus.pending:
                left = deadline - time.monotonic()
                if left <= 0 or not await changed.wait(left):
                    rec = await self.get(sid)
                    if rec.status == SandboxStatus.pending:
                        raise WaitTimedOut(f"sandbox {sid} not ready after {timeout}s; "
                                           "wait again")
                rec = await self.get(sid)
        # A failed or deleted sandbox is an answer too: its status and status_message say
        # so (clients check `ready`), as the reference system does.
        return rec

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

        rec = await self._update(sid, change)
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

        rec = await self._update(sid, change)
        if rec is None or rec.status not in LIVE:
            raise NotFound(f"no live sandbox {sid!r}; it is "
                           f"{'unknown' if rec is None else rec.status.value}: recreate it")
        return rec

    # --- reconcile ------------------------------------------------------------------------

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reconcile_interval)
            try:
                await self.reconcile_once()
            except Exception:  # noqa: BLE001 - a loop that dies would stop all reaping
                log.exception("reconcile pass failed; retrying next interval")

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

    async def reconcile_once(self) -> None:
        """One pass of making the store and the backend agree. The backend is listed BEFORE
        the records: a replica writes a record before it creates the sandbox, so whatever the
        backend listed already has its record, and no fresh sandbox is taken for an orphan."""
        now = time.time()
        await self.store.beat(self.replica, self.beat_ttl)
        alive = await self.store.live_replicas() if self.store.shared else set()
        alive.add(self.replica)
        try:
            existing: set[str] | None = await self.backend.list()
        except Exception:  # noqa: BLE001 - never act on a partial view
            log.exception("backend list failed; skipping the orphan and vanished passes")
            existing = None
        live = {r.sandbox_id: r for r in await self.store.list_sandboxes() if r.status in LIVE}
        self._live = dict(live)
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
        for job in await self.store.unfinished_jobs():
            if job.replica not in alive:
                # Its result went to a replica that no longer exists: say so, don't hang.
                job.status, job.completed_at = JobStatus.failed, utc_time()
                job.error = ("the orchestrator replica running this job stopped; its result "
                             "is lost (the command may have finished in the sandbox)")
                await self.store.put_job(job)
                await self.store.publish(f"job:{job.job_id}")
        await self.collect_snapshots(now)
        await self.store.prune(now - self.settings.retention)
        await self.store.prune_events(now - self.settings.event_retention)

    async def _adopt_pending(self, sid: str) -> None:
        handle = await self.backend.adopt(sid)
        if handle is None:
            await self._fail(sid, "the orchestrator replica launching it stopped before it was "
                             "ready; delete and recreate it", only_if=(SandboxStatus.pending,))
            return
        self._agents[sid] = self._agent_client(handle)
        await self._update(sid, _became_ready(handle.limits))
        log.info("adopted sandbox %s, launched by a replica that stopped", sid)

    # --- exec -------------------------------------------------------------------------------

    async def running(self, sid: str) -> tuple[SandboxInfo, AgentClient]:
        rec = await self.store.get_sandbox(sid)
        if rec is None or rec.status == SandboxStatus.deleted:
            raise NotFound(f"no sandbox {sid!r}; list them with GET /sandboxes")
        if rec.status == SandboxStatus.pending:
            # A request right after a create that did not wait waits for the start, briefly,
            # rather than failing a client that raced its own sandbox.
            with contextlib.suppress(WaitTimedOut):
                rec = await self.wait(sid, PENDING_REQUEST_WAIT)
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

    async def list_events(self, *, sandbox_id: str | None = None, session: str | None = None,
                          labels: dict[str, str] | None = None, after: int = 0,
                          limit: int = 1000) -> EventList:
        want = (labels or {}).items()
        events, seen = [], after
        # Labels are not indexed: filter whole pages until this one is full or the log ends.
        while len(events) < limit:
            page = await self.store.events(sandbox_id=sandbox_id, session=session, after=seen,
                                           limit=limit)
            if not page:
                break
            for event in page:
                seen = event.seq
                if want <= event.labels.items():
                    events.append(event)
                    if len(events) == limit:
                        break
            if not want:
                break
        return EventList(events=events, next_after=seen)


def model_env(base_url: str, session: str) -> dict[str, str]:
    """What a harness in a model_proxy sandbox finds in its environment. The key is a
    placeholder many clients insist on; the proxy decides what goes upstream (--api-key)."""
    return {"OPENAI_BASE_URL": base_url, "OPENAI_API_BASE": base_url,
            "OPENAI_API_KEY": "orchard-proxy", "ORCHARD_SESSION": session}
