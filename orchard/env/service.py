"""The sandbox service: lifecycle, admission, exec jobs. Backend- and store-agnostic.

State is reconciled from the backend (the source of truth) in a loop; a failed backend LIST
skips the orphan pass, so a transient error never mass-deletes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from orchard.env.agent.client import AgentClient, AgentError, AgentUnreachable
from orchard.env.backends.base import Backend, BackendError, SandboxSpec
from orchard.env.config import Settings
from orchard.env.errors import BadRequest, Conflict, NotFound, Overloaded, WaitTimedOut
from orchard.env.metrics import Metrics
from orchard.env.quantities import parse_cpu, parse_memory
from orchard.env.schema import (
    CreateSandboxRequest,
    ExecRequest,
    Job,
    JobAccepted,
    JobStatus,
    ProcessInfo,
    SandboxInfo,
    SandboxStatus,
)
from orchard.env.state.base import StateStore

log = logging.getLogger("orchard.env")
LIVE = (SandboxStatus.pending, SandboxStatus.running)


def _exit_line(job: Job) -> bytes:
    return json.dumps({"type": "exit", "job": job.model_dump(mode="json")}).encode() + b"\n"


def _utc(ts: float | None = None) -> datetime:
    return datetime.fromtimestamp(time.time() if ts is None else ts, UTC)


class SandboxService:
    def __init__(self, backend: Backend, store: StateStore, settings: Settings,
                 metrics: Metrics | None = None) -> None:
        self.backend = backend
        self.store = store
        self.settings = settings
        self.metrics = metrics or Metrics()
        self._records: dict[str, SandboxInfo] = {}
        self._agents: dict[str, AgentClient] = {}
        self._ready: dict[str, asyncio.Event] = {}
        self._launches: dict[str, asyncio.Task[None]] = {}
        self._teardowns: dict[str, asyncio.Task[None]] = {}
        self._jobs: dict[str, Job] = {}
        self._job_done: dict[str, asyncio.Event] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._reconciler: asyncio.Task[None] | None = None
        self.creates_in_flight = 0

    # --- start / stop -------------------------------------------------------------------

    async def start(self) -> None:
        """Re-adopt every live sandbox on record, then reconcile (removing orphans)."""
        for rec in await self.store.list_sandboxes():
            if rec.status not in LIVE:
                continue
            handle = await self.backend.adopt(rec.sandbox_id) if rec.status == "running" else None
            if handle is None:
                rec.status, rec.error = SandboxStatus.failed, (
                    "sandbox was lost while the orchestrator was down; delete and recreate it")
                await self.backend.delete(rec.sandbox_id)
            else:
                self._agents[rec.sandbox_id] = AgentClient(handle.address)
                log.info("re-adopted sandbox %s", rec.sandbox_id)
            self._remember(rec)
            await self.store.put_sandbox(rec)
        for job in await self.store.unfinished_jobs():
            # Its result went to an orchestrator that no longer exists: say so, don't hang.
            job.status, job.completed_at = JobStatus.failed, _utc()
            job.error = ("the orchestrator restarted while this job ran; its result is lost "
                         "(the command may have finished in the sandbox)")
            await self.store.put_job(job)
        await self.reconcile_once()
        self._reconciler = asyncio.create_task(self._reconcile_loop())

    async def stop(self, delete_all: bool = False) -> None:
        if self._reconciler:
            self._reconciler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconciler
        if delete_all:
            for sid in [s for s, r in self._records.items() if r.status in LIVE]:
                await self.delete(sid)
        pending = [*self._teardowns.values(), *self._launches.values(), *self._tasks]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        for agent in self._agents.values():
            await agent.close()
        self._agents.clear()

    # --- lifecycle --------------------------------------------------------------------------

    def _remember(self, rec: SandboxInfo) -> None:
        self._records[rec.sandbox_id] = rec
        self._ready.setdefault(rec.sandbox_id, asyncio.Event())
        if rec.status != SandboxStatus.pending:
            self._ready[rec.sandbox_id].set()

    def active_count(self) -> int:
        return sum(1 for r in self._records.values() if r.status in LIVE)

    async def create(self, req: CreateSandboxRequest) -> SandboxInfo:
        sid = req.sandbox_id or f"sb-{uuid.uuid4().hex[:12]}"
        existing = self._records.get(sid)
        if existing is not None and existing.status not in (SandboxStatus.deleted,
                                                            SandboxStatus.failed):
            raise Conflict(f"sandbox {sid} already exists ({existing.status.value}); choose "
                           "another sandbox_id or delete it first")
        if sid in self._teardowns:
            raise Overloaded(f"sandbox {sid} is still being torn down; retry shortly", 1)
        if req.image != "host" and not req.image.startswith("/"):
            raise BadRequest(f"image {req.image!r} must be 'host' or an absolute path to a "
                             "rootfs directory, an OCI layout or an image archive on the server")
        try:
            cpu = parse_cpu(req.cpu) if req.cpu is not None else None
            memory = parse_memory(req.memory) if req.memory is not None else None
        except ValueError as e:
            raise BadRequest(str(e)) from None
        if cpu is not None and cpu <= 0 or memory is not None and memory < 4 << 20:
            raise BadRequest("cpu must be > 0 and memory at least 4Mi")
        if self.active_count() >= self.settings.max_sandboxes:
            raise Overloaded(f"at capacity: {self.settings.max_sandboxes} sandboxes are live; "
                             "delete some or retry later", 2)
        if self.creates_in_flight >= self.settings.max_concurrent_creates:
            raise Overloaded(f"{self.creates_in_flight} creates in flight (the maximum); retry "
                             "after the delay in Retry-After", 1)
        now = time.time()
        rec = SandboxInfo(
            sandbox_id=sid, status=SandboxStatus.pending, image=req.image,
            block_network=req.block_network, cpu=req.cpu, memory=req.memory, pids=req.pids,
            labels=req.labels, created_at=_utc(now),
            expires_at=_utc(now + (req.timeout or self.settings.default_ttl)),
            backend=self.backend.name,
        )
        self._ready.pop(sid, None)
        self._remember(rec)
        await self.store.put_sandbox(rec)
        self.creates_in_flight += 1
        spec = SandboxSpec(sandbox_id=sid, image=req.image, block_network=req.block_network,
                           cpu=req.cpu, memory=req.memory, pids=req.pids, env=req.env)
        self._launches[sid] = asyncio.create_task(self._launch(rec, spec))
        return rec

    async def _launch(self, rec: SandboxInfo, spec: SandboxSpec) -> None:
        t0 = time.perf_counter()
        try:
            handle = await self.backend.create(spec)
            self._agents[rec.sandbox_id] = AgentClient(handle.address)
            rec.status, rec.ready_at, rec.limits = SandboxStatus.running, _utc(), handle.limits
            self.metrics.create_seconds.observe(time.perf_counter() - t0)
            self.metrics.creates.labels("ok").inc()
        except asyncio.CancelledError:
            rec.status = SandboxStatus.deleted
            raise
        except Exception as e:  # noqa: BLE001 - any failure becomes the record's error
            rec.status = SandboxStatus.failed
            rec.error = str(e) if isinstance(e, BackendError) else f"{type(e).__name__}: {e}"
            log.warning("sandbox %s failed to start: %s", rec.sandbox_id, rec.error)
            self.metrics.creates.labels("failed").inc()
        finally:
            self.creates_in_flight -= 1
            self._launches.pop(rec.sandbox_id, None)
            await self.store.put_sandbox(rec)
            self._ready[rec.sandbox_id].set()

    def _get(self, sid: str) -> SandboxInfo:
        rec = self._records.get(sid)
        if rec is None:
            raise NotFound(f"no sandbox {sid!r}; list them with GET /sandboxes")
        return rec

    async def get(self, sid: str) -> SandboxInfo:
        rec = self._records.get(sid) or await self.store.get_sandbox(sid)
        if rec is None:
            raise NotFound(f"no sandbox {sid!r}; list them with GET /sandboxes")
        return rec

    async def list(self, labels: dict[str, str] | None = None) -> list[SandboxInfo]:
        want = (labels or {}).items()
        return [r for r in self._records.values()
                if r.status != SandboxStatus.deleted and want <= r.labels.items()]

    async def wait(self, sid: str, timeout: float) -> SandboxInfo:
        rec = await self.get(sid)
        event = self._ready.get(sid)
        if rec.status == SandboxStatus.pending and event is not None:
            try:
                await asyncio.wait_for(event.wait(), timeout)
            except TimeoutError:
                raise WaitTimedOut(
                    f"sandbox {sid} not ready after {timeout}s; wait again") from None
        if rec.status == SandboxStatus.failed:
            raise Conflict(f"sandbox {sid} failed to start: {rec.error}")
        if rec.status == SandboxStatus.deleted:
            raise Conflict(f"sandbox {sid} was deleted")
        return rec

    async def delete(self, sid: str, reason: str = "deleted by request") -> None:
        rec = self._records.get(sid) or await self.store.get_sandbox(sid)
        if rec is None:
            raise NotFound(f"no sandbox {sid!r}; nothing to delete")
        if rec.status == SandboxStatus.deleted:
            return
        rec.status = SandboxStatus.deleted
        if reason != "deleted by request":
            rec.error = reason
        self._records.pop(sid, None)
        event = self._ready.pop(sid, None)
        if event is not None:
            event.set()
        await self.store.put_sandbox(rec)
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
        rec = self._get(sid)
        rec.last_heartbeat = _utc()
        await self.store.put_sandbox(rec)
        return rec

    # --- reconcile ------------------------------------------------------------------------

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reconcile_interval)
            try:
                await self.reconcile_once()
            except Exception:  # noqa: BLE001 - a loop that dies would stop all reaping
                log.exception("reconcile pass failed; retrying next interval")

    async def reconcile_once(self) -> None:
        now = time.time()
        for rec in list(self._records.values()):
            if rec.status == SandboxStatus.failed:
                continue
            if rec.expires_at and now > rec.expires_at.timestamp():
                await self.delete(rec.sandbox_id, "ttl expired")
            elif rec.last_heartbeat and (now - rec.last_heartbeat.timestamp()
                                         > self.settings.heartbeat_timeout):
                await self.delete(rec.sandbox_id, "heartbeat timed out")
            elif rec.status == SandboxStatus.pending and (
                now - rec.created_at.timestamp() > self.settings.pending_timeout
            ):
                await self.delete(rec.sandbox_id, "pending timeout: never became ready")
        try:
            existing = await self.backend.list()
        except Exception:  # noqa: BLE001 - never act on a partial view
            log.exception("backend list failed; skipping the orphan pass")
            return
        owned = {s for s, r in self._records.items() if r.status in LIVE}
        for sid in existing - owned - set(self._teardowns):
            log.info("removing orphan sandbox %s (no live record)", sid)
            await self.backend.delete(sid)
        for sid in owned & existing:
            rec = self._records[sid]
            if rec.status == SandboxStatus.running and await self.backend.adopt(sid) is None:
                rec.status, rec.error = SandboxStatus.failed, "sandbox exited unexpectedly"
                await self.store.put_sandbox(rec)
                self._teardowns[sid] = asyncio.create_task(self._teardown(sid))
        await self.store.prune(now - self.settings.retention)

    # --- exec -------------------------------------------------------------------------------

    def agent(self, sid: str) -> AgentClient:
        rec = self._get(sid)
        agent = self._agents.get(sid)
        if rec.status != SandboxStatus.running or agent is None:
            hint = {"pending": f"wait for it with GET /sandboxes/{sid}/wait",
                    "failed": f"it failed: {rec.error}; delete and recreate it"}
            raise Conflict(f"sandbox {sid} is {rec.status.value}: "
                           + hint.get(rec.status.value, "recreate it"))
        return agent

    @staticmethod
    def _agent_request(req: ExecRequest) -> dict[str, Any]:
        stdin = req.stdin_bytes()
        return {
            "command": req.command, "argv": req.argv, "login_shell": req.login_shell,
            "cwd": req.cwd, "env": req.env, "timeout": req.timeout_seconds,
            "max_output_bytes": req.max_output_bytes,
            "stdin_b64": None if stdin is None else base64.b64encode(stdin).decode(),
        }

    def _new_job(self, sid: str, req: ExecRequest) -> Job:
        command = req.command if req.command is not None else " ".join(req.argv or [])
        return Job(job_id=f"job-{uuid.uuid4().hex[:16]}", sandbox_id=sid, command=command,
                   argv=req.argv, status=JobStatus.running, created_at=_utc(),
                   started_at=_utc())

    @staticmethod
    def _finish(job: Job, result: dict[str, Any]) -> Job:
        for key in ("stdout", "stderr", "stdout_b64", "stderr_b64", "stdout_dropped",
                    "stderr_dropped", "exit_code", "timed_out"):
            if key in result:
                setattr(job, key, result[key])
        job.started_at = _utc(result["started_at"])
        job.completed_at = _utc(result["completed_at"])
        job.status = JobStatus.succeeded if job.exit_code == 0 else JobStatus.failed
        return job

    async def _run_job(self, agent: AgentClient, job: Job, payload: dict[str, Any]) -> Job:
        t0 = time.perf_counter()
        try:
            result = await agent.exec(payload)
        except AgentError as e:
            job.status, job.error, job.completed_at = JobStatus.failed, e.detail, _utc()
            self.metrics.execs.labels("error").inc()
            if isinstance(e, AgentUnreachable):
                raise Conflict(f"sandbox {job.sandbox_id} is not reachable ({e.detail}); it may "
                               "have crashed: check GET /sandboxes/{id} and recreate it") from None
            raise BadRequest(e.detail) from None
        finally:
            self.metrics.exec_seconds.observe(time.perf_counter() - t0)
        self.metrics.execs.labels("timeout" if result.get("timed_out") else "ok").inc()
        return self._finish(job, result)

    async def exec(self, sid: str, req: ExecRequest) -> Job | JobAccepted | ProcessInfo:
        agent = self.agent(sid)
        payload = self._agent_request(req)
        if req.background:
            try:
                info = await agent.start_process(payload)
            except AgentUnreachable as e:
                raise Conflict(f"sandbox {sid} is not reachable ({e.detail}); it may have "
                               "crashed: check GET /sandboxes/{id} and recreate it") from None
            except AgentError as e:
                raise BadRequest(e.detail) from None
            return ProcessInfo(sandbox_id=sid, **{**info, "started_at": _utc(info["started_at"])})
        job = self._new_job(sid, req)
        if req.wait:
            try:
                await self._run_job(agent, job, payload)
            finally:
                await self.store.put_job(job)
            return job
        self._jobs[job.job_id] = job
        self._job_done[job.job_id] = asyncio.Event()
        await self.store.put_job(job)
        task = asyncio.create_task(self._background_job(agent, job, payload))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return JobAccepted(job_id=job.job_id, status=job.status)

    async def _background_job(self, agent: AgentClient, job: Job, payload: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):
            await self._run_job(agent, job, payload)
        await self.store.put_job(job)
        self._jobs.pop(job.job_id, None)
        self._job_done.pop(job.job_id).set()

    async def exec_stream(self, sid: str, req: ExecRequest) -> AsyncIterator[bytes]:
        agent = self.agent(sid)
        job = self._new_job(sid, req)
        payload = self._agent_request(req)

        async def events() -> AsyncIterator[bytes]:
            try:
                async for event in agent.exec_stream(payload):
                    if event["type"] == "exit":
                        self._finish(job, event["result"])
                        await self.store.put_job(job)
                        yield _exit_line(job)
                    else:
                        yield json.dumps(event).encode() + b"\n"
            except AgentError as e:
                job.status, job.error = JobStatus.failed, e.detail
                await self.store.put_job(job)
                yield _exit_line(job)

        return events()

    async def get_job(self, job_id: str) -> Job:
        job = self._jobs.get(job_id) or await self.store.get_job(job_id)
        if job is None:
            raise NotFound(f"no job {job_id!r}; jobs are kept {self.settings.retention:.0f}s")
        return job

    async def wait_job(self, job_id: str, timeout: float) -> Job:
        done = self._job_done.get(job_id)
        if done is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), timeout)
        return await self.get_job(job_id)
