"""Exec jobs: blocking, background and streamed execs, their job records, the exec lock of
exclusive_exec sandboxes, and the reconcile pass that fails the jobs of replicas gone.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import posixpath
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from orchard.env.agent.client import AgentClient, AgentError
from orchard.env.config import Settings
from orchard.env.errors import (
    NotFound,
    Overloaded,
    from_agent,
)
from orchard.env.events import EventLog
from orchard.env.metrics import Metrics
from orchard.env.schema import (
    EventKind,
    ExecRequest,
    Job,
    JobAccepted,
    JobStatus,
    ProcessInfo,
    SandboxInfo,
)
from orchard.env.service.background import Background
from orchard.env.service.records import RunningSandboxes, utc_time
from orchard.env.state.base import LockLost, LockTimeout, StateStore

log = logging.getLogger("orchard.env")


def _exit_line(job: Job) -> bytes:
    return json.dumps({"type": "exit", "job": job.model_dump(mode="json")}).encode() + b"\n"


class ExecJobs:
    def __init__(self, sandboxes: RunningSandboxes, store: StateStore, settings: Settings,
                 metrics: Metrics, events: EventLog, replica: str,
                 background: Background) -> None:
        self.sandboxes = sandboxes
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self.events = events
        self.replica = replica
        self.background = background

    @contextlib.asynccontextmanager
    async def _exclusive(self, rec: SandboxInfo, wait: float) -> AsyncIterator[int | None]:
        """For exclusive_exec sandboxes, the sandbox's exec lock and its fencing token (which
        the agent checks, refusing a holder whose lock expired and was re-granted)."""
        if not rec.exclusive_exec:
            yield None
            return
        try:
            async with self.store.lock(f"exec:{rec.sandbox_id}", ttl=30, timeout=wait) as fence:
                yield fence
        except LockTimeout:
            raise Overloaded(f"sandbox {rec.sandbox_id} runs one exec at a time "
                             f"(exclusive_exec) and stayed busy for {wait:.0f}s; retry later",
                             5) from None
        except LockLost:
            log.warning("exec lock of %s expired while an exec held it", rec.sandbox_id)

    @staticmethod
    def _agent_request(req: ExecRequest, rec: SandboxInfo) -> dict[str, Any]:
        stdin = req.stdin_bytes()
        # The sandbox's workdir (a built image's WORKDIR) is where a relative cwd starts.
        cwd = (posixpath.normpath(posixpath.join(rec.workdir, req.cwd or "."))
               if rec.workdir else req.cwd)
        return {
            "command": req.command, "argv": req.argv, "login_shell": req.login_shell,
            "cwd": cwd, "env": req.env, "timeout": req.timeout_seconds,
            "max_output_bytes": req.max_output_bytes,
            "stdin_b64": None if stdin is None else base64.b64encode(stdin).decode(),
        }

    def _new_job(self, sid: str, req: ExecRequest) -> Job:
        command = req.command if req.command is not None else " ".join(req.argv or [])
        return Job(job_id=f"job-{uuid.uuid4().hex[:16]}", sandbox_id=sid, command=command,
                   argv=req.argv, status=JobStatus.running, created_at=utc_time(),
                   started_at=utc_time(), replica=self.replica)

    @staticmethod
    def _finish(job: Job, result: dict[str, Any]) -> Job:
        for key in ("stdout", "stderr", "stdout_b64", "stderr_b64", "stdout_dropped",
                    "stderr_dropped", "exit_code", "timed_out"):
            if key in result:
                setattr(job, key, result[key])
        job.started_at = utc_time(result["started_at"])
        job.completed_at = utc_time(result["completed_at"])
        job.status = JobStatus.succeeded if job.exit_code == 0 else JobStatus.failed
        return job

    async def _record_job(self, job: Job) -> None:
        await self.store.put_job(job)
        await self.store.publish(f"job:{job.job_id}")

    @staticmethod
    def _lock_wait(req: ExecRequest) -> float:
        return min(req.timeout_seconds or 3600, 3600)

    async def _run_job(self, rec: SandboxInfo, agent: AgentClient, job: Job,
                       req: ExecRequest) -> Job:
        t0, started = time.perf_counter(), time.time()
        try:
            async with self._exclusive(rec, self._lock_wait(req)) as fence:
                result = await agent.exec(self._agent_request(req, rec), fence)
        except AgentError as e:
            job.status, job.error, job.completed_at = JobStatus.failed, e.detail, utc_time()
            self.metrics.execs.labels("error").inc()
            await self.events.exec(rec, req, job, started)
            raise from_agent(e, job.sandbox_id) from None
        finally:
            self.metrics.exec_seconds.observe(time.perf_counter() - t0)
        self.metrics.execs.labels("timeout" if result.get("timed_out") else "ok").inc()
        self._finish(job, result)
        await self.events.exec(rec, req, job, started)
        return job

    async def exec(self, sid: str, req: ExecRequest) -> Job | JobAccepted | ProcessInfo:
        rec, agent = await self.sandboxes.running(sid)
        if req.background:
            try:
                info = await agent.start_process(self._agent_request(req, rec))
            except AgentError as e:
                raise from_agent(e, sid) from None
            await self.events.record(
                rec, EventKind.process, info["started_at"], process_id=info["process_id"],
                command=req.command, argv=req.argv, cwd=req.cwd, env=req.env,
                login_shell=req.login_shell)
            started = utc_time(info["started_at"])
            return ProcessInfo(sandbox_id=sid, **{**info, "started_at": started})
        job = self._new_job(sid, req)
        if not req.wait:
            await self.store.put_job(job)
            self.background.spawn(self._settle(job, self._run_job(rec, agent, job, req)))
            return JobAccepted(job_id=job.job_id, status=job.status)
        run = asyncio.ensure_future(self._run_job(rec, agent, job, req))
        try:
            # The answer waits for the command up to its timeout plus a margin (a queue for
            # the exclusive lock, a slow agent); past that the client polls the job.
            done, _ = await asyncio.wait({run}, timeout=(req.timeout_seconds or 0)
                                         + self.settings.exec_wait_margin)
        except asyncio.CancelledError:  # the client hung up: the command runs on, recorded
            self.background.spawn(self._settle(job, run))
            raise
        if not done:
            await self.store.put_job(job)
            self.background.spawn(self._settle(job, run))
            return JobAccepted(job_id=job.job_id, status=job.status)
        try:
            run.result()
        finally:
            await self.store.put_job(job)
        return job

    async def _settle(self, job: Job, run: Awaitable[Job]) -> None:
        """Finish a job nobody waits for, and record how it ended."""
        with contextlib.suppress(Exception):
            await run
        if job.status == JobStatus.running:  # e.g. Overloaded while queued for the lock
            job.status, job.completed_at = JobStatus.failed, utc_time()
            job.error = job.error or "the job could not start; see the orchestrator's log"
        await self._record_job(job)

    async def exec_stream(self, sid: str, req: ExecRequest) -> AsyncIterator[bytes]:
        rec, agent = await self.sandboxes.running(sid)
        job = self._new_job(sid, req)

        async def events() -> AsyncIterator[bytes]:
            started, recorded = time.time(), False
            try:
                async with self._exclusive(rec, self._lock_wait(req)) as fence:
                    async for event in agent.exec_stream(self._agent_request(req, rec), fence):
                        if event["type"] == "exit":
                            self._finish(job, event["result"])
                            await self.store.put_job(job)
                            recorded = True
                            await self.events.exec(rec, req, job, started)
                            yield _exit_line(job)
                        else:
                            yield json.dumps(event).encode() + b"\n"
            except (AgentError, Overloaded) as e:
                job.status, job.error = JobStatus.failed, e.detail
                await self.store.put_job(job)
                recorded = True
                await self.events.exec(rec, req, job, started)
                yield _exit_line(job)
            finally:
                if not recorded:
                    # The client hung up mid-stream; the command may have run on, changing
                    # the sandbox: the trace must still show it was started. A task of its
                    # own, since a closing generator cannot wait.
                    job.error = "the client disconnected from the stream; the command may " \
                                "have run on (its outcome is unknown)"
                    self.background.spawn(self.events.exec(rec, req, job, started))

        return events()

    async def get_job(self, job_id: str) -> Job:
        job = await self.store.get_job(job_id)
        if job is None:
            raise NotFound(f"no job {job_id!r}; jobs are kept {self.settings.retention:.0f}s")
        return job

    async def wait_job(self, job_id: str, timeout: float) -> Job:
        deadline = time.monotonic() + timeout
        async with self.store.subscribe(f"job:{job_id}") as changed:
            job = await self.get_job(job_id)
            while job.status in (JobStatus.queued, JobStatus.running):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                await changed.wait(left)
                job = await self.get_job(job_id)
        return job

    async def fail_orphans(self) -> None:
        """A reconcile pass: fail the unfinished jobs of replicas that no longer beat. Their
        results went to a replica that is gone: say so, rather than leave waiters hanging."""
        alive = await self.store.live_replicas() if self.store.shared else set()
        alive.add(self.replica)
        for job in await self.store.unfinished_jobs():
            if job.replica not in alive:
                job.status, job.completed_at = JobStatus.failed, utc_time()
                job.error = ("the orchestrator replica running this job stopped; its result "
                             "is lost (the command may have finished in the sandbox)")
                await self._record_job(job)
