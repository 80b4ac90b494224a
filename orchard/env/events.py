"""The sandbox event log: what the orchestrator did to each sandbox, in order, tagged with the
sandbox's session and labels. Joined with the recording proxy's model calls it makes a
rollout's trace; it holds enough (commands, their cwd/env/stdin, file contents, patches) to redo
the sandbox side of a rollout in a fresh sandbox.

Appending never fails the action it records: the action already happened, and an error would
invite the client to repeat it. A lost event is logged and counted
(``orchard_events_lost_total``) instead.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import time
from typing import Any

from orchard.env.metrics import Metrics
from orchard.env.schema import EventKind, EventList, ExecRequest, Job, SandboxEvent, SandboxInfo
from orchard.env.state.base import StateStore

log = logging.getLogger("orchard.env")


def payload(data: bytes, limit: int) -> dict[str, Any]:
    """Bytes as an event holds them: always size and sha256, the content itself (base64) only
    up to limit bytes, so a replay can redo small writes and at least verify big ones."""
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "content_b64": base64.b64encode(data).decode() if len(data) <= limit else None}


def _output(text: str, b64: str | None, dropped: int) -> dict[str, Any]:
    data = base64.b64decode(b64) if b64 is not None else text.encode()
    # With bytes dropped from the middle, a digest would describe what nobody saw.
    return {"bytes": len(data) + dropped,
            "sha256": hashlib.sha256(data).hexdigest() if not dropped else None}


def exec_data(req: ExecRequest, job: Job, limit: int) -> dict[str, Any]:
    stdin = req.stdin_bytes()
    data: dict[str, Any] = {
        "job_id": job.job_id, "command": req.command, "argv": req.argv, "cwd": req.cwd,
        "env": req.env, "login_shell": req.login_shell, "timeout_seconds": req.timeout_seconds,
        "max_output_bytes": req.max_output_bytes,
        "stdin": None if stdin is None else payload(stdin, limit),
        "exit_code": job.exit_code, "timed_out": job.timed_out, "error": job.error,
        "stdout": _output(job.stdout, job.stdout_b64, job.stdout_dropped),
        "stderr": _output(job.stderr, job.stderr_b64, job.stderr_dropped),
    }
    if job.started_at and job.completed_at:
        data["duration_ms"] = round(
            (job.completed_at - job.started_at).total_seconds() * 1000, 3)
    return data


class EventLog:
    def __init__(self, store: StateStore, metrics: Metrics, content_limit: int) -> None:
        self.store = store
        self.metrics = metrics
        self.content_limit = content_limit

    async def record(self, rec: SandboxInfo, kind: EventKind, started: float | None = None,
                     **data: Any) -> None:
        event = SandboxEvent(sandbox_id=rec.sandbox_id, time=started or time.time(), kind=kind,
                             session=rec.session, labels=rec.labels, data=data)
        try:
            await self.store.append_event(event)
        except Exception as e:  # noqa: BLE001 - see the module docstring
            self.metrics.events_lost.inc()
            log.warning("event %s of sandbox %s not recorded: %s", kind.value, rec.sandbox_id, e)

    async def exec(self, rec: SandboxInfo, req: ExecRequest, job: Job, started: float) -> None:
        await self.record(rec, EventKind.exec, started, **exec_data(req, job, self.content_limit))

    async def list(self, *, sandbox_id: str | None = None, session: str | None = None,
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
