"""Redo the sandbox side of a rollout in fresh sandboxes and check it comes out the same.

The orchestrator's event log holds each action with what it needs to be redone (command, cwd,
env, stdin, file contents up to ``event_content_bytes``, patches) and, for execs, the outcome
(exit code, output digests). ``replay`` creates one fresh sandbox per sandbox of the trace, like
the original (image, limits, network, default env), redoes the actions one at a time in the
order the log holds them (``seq``: the order they finished), and compares outcomes. A
divergence means the environment is not deterministic (time, randomness, network) or differs
(another image); a skipped step means the log did not keep what it takes to redo it.

``until=N`` stops after event seq N, and ``keep=True`` leaves the sandboxes running: together
they restore the state a rollout had at some turn, to branch from there.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import uuid
from typing import Any, Literal

from pydantic import BaseModel, Field

from orchard.env.client import OrchardError, SandboxClient
from orchard.env.client.sync_sandbox import Sandbox
from orchard.env.http_schema import ServiceRequest
from orchard.env.schema import EventKind, SandboxEvent
from orchard.rollout.traces.trace import Trace

REPLAY_LABEL = "orchard-replay-of"
# Nothing to redo: they change no file (a snapshot or a pause leaves the files as they are).
_LIFECYCLE = (EventKind.created, EventKind.ready, EventKind.failed, EventKind.deleted,
              EventKind.snapshot, EventKind.paused, EventKind.resumed)

StepStatus = Literal["matched", "diverged", "skipped"]


class ReplayStep(BaseModel):
    seq: int
    kind: EventKind
    sandbox_id: str = Field(description="The original sandbox.")
    original: dict[str, Any] = Field(default_factory=dict, description="The recorded outcome.")
    replayed: dict[str, Any] | None = Field(None, description="The outcome now; None: skipped.")
    matches: bool
    status: StepStatus
    detail: str = ""


class ReplayReport(BaseModel):
    rollout_id: str
    steps: list[ReplayStep] = Field(default_factory=list)
    matched: int = 0
    diverged: int = 0
    skipped: int = 0
    sandbox_ids: dict[str, str] = Field(
        default_factory=dict, description="Original sandbox id -> the replay's.")
    kept: bool = Field(False, description="True: the replay's sandboxes were left running.")

    @property
    def ok(self) -> bool:
        """Every step was redone and came out as recorded."""
        return self.diverged == 0 and self.skipped == 0

    def add(self, step: ReplayStep) -> None:
        self.steps.append(step)
        setattr(self, step.status, getattr(self, step.status) + 1)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _step(event: SandboxEvent, original: dict[str, Any], replayed: dict[str, Any] | None,
          problems: list[str], detail: str = "") -> ReplayStep:
    if replayed is None:
        status: StepStatus = "skipped"
    else:
        status = "diverged" if problems else "matched"
    text = "; ".join(problems) if problems else detail
    return ReplayStep(seq=event.seq, kind=event.kind, sandbox_id=event.sandbox_id,
                      original=original, replayed=replayed, matches=status == "matched",
                      status=status, detail=text)


def _exec_outcome(d: dict[str, Any]) -> dict[str, Any]:
    return {"exit_code": d.get("exit_code"), "timed_out": d.get("timed_out"),
            "error": d.get("error"), "stdout_sha256": (d.get("stdout") or {}).get("sha256"),
            "stderr_sha256": (d.get("stderr") or {}).get("sha256")}


def _redo_exec(sandbox: Sandbox, event: SandboxEvent) -> ReplayStep:
    d = event.data
    original = _exec_outcome(d)
    stdin: bytes | None = None
    if d.get("stdin") is not None:
        if d["stdin"].get("content_b64") is None:
            return _step(event, original, None, [],
                         f"skipped: stdin not kept (size {d['stdin'].get('size')} bytes > the "
                         "orchestrator's event_content_bytes)")
        stdin = base64.b64decode(d["stdin"]["content_b64"])
    program = d["command"] if d.get("command") is not None else d.get("argv")
    if not program:
        return _step(event, original, None, [], "skipped: the event has neither command nor "
                     "argv")
    try:
        job = sandbox.exec(program, timeout=d.get("timeout_seconds"), cwd=d.get("cwd"),
                           env=d.get("env") or {}, stdin=stdin,
                           login_shell=bool(d.get("login_shell")))
    except OrchardError as e:
        replayed: dict[str, Any] = {"error": str(e)}
        problems = [] if original["error"] else [f"the exec failed now: {e}"]
        return _step(event, original, replayed, problems)
    replayed = {"exit_code": job.exit_code, "timed_out": job.timed_out, "error": job.error,
                # Output cut in the middle has no digest, as in the event log.
                "stdout_sha256": None if job.stdout_dropped else _sha(job.stdout_bytes),
                "stderr_sha256": None if job.stderr_dropped else _sha(job.stderr_bytes)}
    problems = []
    if bool(original["timed_out"]) != job.timed_out:
        problems.append(f"timed out: {bool(original['timed_out'])} then, {job.timed_out} now")
    elif not job.timed_out:  # a timed-out command's exit code and output are arbitrary
        if original["exit_code"] != job.exit_code:
            problems.append(f"exit code {original['exit_code']} then, {job.exit_code} now")
        for stream in ("stdout", "stderr"):
            then, now = original[f"{stream}_sha256"], replayed[f"{stream}_sha256"]
            if then is not None and now is not None and then != now:
                problems.append(f"{stream} differs ({d[stream]['bytes']} bytes then, "
                                f"{len(getattr(job, f'{stream}_bytes'))} now)")
    return _step(event, original, replayed, problems)


def _redo_file_write(sandbox: Sandbox, event: SandboxEvent) -> ReplayStep:
    d = event.data
    original = {"size": d.get("size"), "sha256": d.get("sha256")}
    if d.get("content_b64") is None:
        return _step(event, original, None, [],
                     f"skipped: content not kept (size {d.get('size')} bytes > the "
                     "orchestrator's event_content_bytes)")
    data = base64.b64decode(d["content_b64"])
    try:
        result = sandbox.upload_content(data, d["path"], d.get("mode"))
    except OrchardError as e:
        return _step(event, original, {"error": str(e)}, [f"the write failed now: {e}"])
    replayed = {"size": result.size, "sha256": _sha(data)}
    problems = [] if (result.size, _sha(data)) == (d.get("size"), d.get("sha256")) else [
        f"wrote {result.size} bytes (sha256 {_sha(data)[:12]}), the original "
        f"{d.get('size')} (sha256 {str(d.get('sha256'))[:12]})"]
    return _step(event, original, replayed, problems)


def _redo_path_op(sandbox: Sandbox, event: SandboxEvent) -> ReplayStep:
    # Only successful mkdir/remove calls are logged, so success is the outcome to match.
    d = event.data
    try:
        if event.kind == EventKind.mkdir:
            sandbox.mkdir(d["path"])
        else:
            sandbox.remove(d["path"], bool(d.get("recursive")))
    except OrchardError as e:
        return _step(event, {"ok": True}, {"ok": False, "error": str(e)},
                     [f"{event.kind.value} {d['path']} failed now: {e}"])
    return _step(event, {"ok": True}, {"ok": True}, [])


def _redo_patch(sandbox: Sandbox, event: SandboxEvent) -> ReplayStep:
    d = event.data
    original = {"success": d.get("success"), "exit_code": d.get("exit_code"),
                "method": d.get("method")}
    try:
        result = sandbox.apply_patch(d["patch"], timeout=d.get("timeout_seconds") or 60,
                                     cwd=d.get("cwd"))
    except OrchardError as e:
        return _step(event, original, {"error": str(e)}, [f"apply_patch failed now: {e}"])
    replayed = {"success": result.success, "exit_code": result.exit_code,
                "method": result.method}
    problems = []
    if result.success != bool(d.get("success")):
        problems.append(f"patch {'applied' if d.get('success') else 'failed'} then, "
                        f"{'applied' if result.success else 'failed'} now"
                        + (f": {'; '.join(result.attempts)}" if result.attempts else ""))
    elif result.exit_code != d.get("exit_code"):
        problems.append(f"exit code {d.get('exit_code')} then, {result.exit_code} now")
    return _step(event, original, replayed, problems)


def _redo_process(sandbox: Sandbox, event: SandboxEvent) -> ReplayStep:
    d = event.data
    program = d["command"] if d.get("command") is not None else d.get("argv")
    original = {"process_id": d.get("process_id")}
    try:
        info = sandbox.start_process(program, cwd=d.get("cwd"), env=d.get("env") or {},
                                     login_shell=bool(d.get("login_shell")))
    except OrchardError as e:
        return _step(event, original, {"error": str(e)}, [f"the process did not start: {e}"])
    return _step(event, original, {"process_id": info.process_id}, [],
                 "started (background processes are not compared)")


_BROWSER_OUTCOME = ("page_url", "title", "error", "tree_sha256")


def _redo_browser(sandbox: Sandbox, event: SandboxEvent) -> ReplayStep:
    """The same action; it matches when it lands on the same URL with the same error (or
    none). The tree may differ (a timestamp on the page) without the state differing."""
    d = event.data
    original = {k: d.get(k) for k in _BROWSER_OUTCOME}
    params = {k: v for k, v in d.items() if k not in _BROWSER_OUTCOME}
    try:
        page = sandbox.browser(**params)
    except OrchardError as e:
        return _step(event, original, {"error": str(e)}, [f"the browser action failed now: {e}"])
    replayed = {"page_url": page.url, "title": page.title, "error": page.error,
                "tree_sha256": hashlib.sha256(page.tree.encode()).hexdigest()}
    problems = []
    if page.url != d.get("page_url"):
        problems.append(f"at {d.get('page_url')} then, at {page.url} now")
    if (page.error is None) != (d.get("error") is None):
        problems.append(f"error {d.get('error')!r} then, {page.error!r} now")
    return _step(event, original, replayed, problems)


def _redo_http(sandbox: Sandbox, event: SandboxEvent) -> ReplayStep:
    """The same request; it matches when the service answers with the same status (a body
    may carry a timestamp or an id without the state differing)."""
    d = event.data
    original = {"status": d.get("status"), "body_sha256": d.get("body_sha256")}
    try:
        request = ServiceRequest.model_validate(
            {k: v for k, v in d.items() if k not in original})
        answer = sandbox.http(request.port, request.path, request.method, body=request.body,
                              headers=request.headers, timeout=request.timeout)
    except (OrchardError, ValueError) as e:
        return _step(event, original, {"error": str(e)}, [f"the request failed now: {e}"])
    replayed = {"status": answer.status,
                "body_sha256": hashlib.sha256(answer.body.encode()).hexdigest()}
    problems = ([] if answer.status == d.get("status")
                else [f"status {d.get('status')} then, {answer.status} now"])
    return _step(event, original, replayed, problems)


_REDO = {EventKind.exec: _redo_exec, EventKind.file_write: _redo_file_write,
         EventKind.mkdir: _redo_path_op, EventKind.remove: _redo_path_op,
         EventKind.patch: _redo_patch, EventKind.process: _redo_process,
         EventKind.browser: _redo_browser, EventKind.http: _redo_http}


def _create_like(client: SandboxClient, trace: Trace, sid: str, image: str | None,
                 labels: dict[str, str], session: str | None) -> Sandbox:
    created = next((e for e in trace.sandbox_events
                    if e.sandbox_id == sid and e.kind == EventKind.created), None)
    if created is None and image is None:
        raise ValueError(f"the trace of {trace.rollout_id!r} has no 'created' event for sandbox "
                         f"{sid}, so its image is unknown: pass image=")
    d = created.data if created is not None else {}
    # A sandbox that started from a snapshot starts from it again (404 if it is gone), unless
    # another image is asked for.
    snapshot = d.get("from_snapshot") if image is None else None
    # model_proxy is left off: a replay redoes what the sandbox did, it calls no model.
    return client.create_sandbox(
        None if snapshot else image or d.get("image") or "host",
        block_network=d.get("block_network", True), cpu=d.get("cpu"), memory=d.get("memory"),
        pids=d.get("pids"), env=d.get("env") or {}, labels={**labels, REPLAY_LABEL: sid},
        session=session, from_snapshot=snapshot)


def replay(trace: Trace, client: SandboxClient, *, image: str | None = None,
           sandbox_id: str | None = None, until: int | None = None, keep: bool = False,
           labels: dict[str, str] | None = None, session: str | None = None) -> ReplayReport:
    """Redo the trace's sandbox actions in fresh sandboxes and compare the outcomes.

    image: use this image instead of the original's (e.g. to test a fix to the environment).
    sandbox_id: replay only this original sandbox's events.
    until: stop after the event with this seq.
    keep: leave the replay's sandboxes running (their ids: ``report.sandbox_ids``); else they
        are deleted before returning. They are deleted on an exception either way.
    labels, session: given to the replay's sandboxes (session: their events become a trace).
    """
    events = sorted((e for e in trace.sandbox_events
                     if (sandbox_id is None or e.sandbox_id == sandbox_id)
                     and (until is None or e.seq <= until)), key=lambda e: e.seq)
    if sandbox_id is not None and not any(e.sandbox_id == sandbox_id
                                          for e in trace.sandbox_events):
        known = sorted({e.sandbox_id for e in trace.sandbox_events})
        raise ValueError(f"sandbox {sandbox_id!r} is not in the trace of {trace.rollout_id!r}; "
                         f"it has {known or 'no sandboxes'}")
    report = ReplayReport(rollout_id=trace.rollout_id, kept=keep)
    sandboxes: dict[str, Sandbox] = {}
    tags = {"orchard-replay": uuid.uuid4().hex[:12], **(labels or {})}
    try:
        # Every sandbox first, in the order they were created, so ids map predictably.
        for event in events:
            if event.sandbox_id not in sandboxes:
                sandboxes[event.sandbox_id] = _create_like(client, trace, event.sandbox_id,
                                                           image, tags, session)
                report.sandbox_ids[event.sandbox_id] = sandboxes[event.sandbox_id].id
        for event in events:
            if event.kind in _LIFECYCLE:
                continue
            redo = _REDO.get(event.kind)
            if redo is None:  # a kind this replay predates: say so rather than guess
                report.add(_step(event, {}, None, [],
                                 f"skipped: no replay for event kind {event.kind.value!r}"))
                continue
            report.add(redo(sandboxes[event.sandbox_id], event))
    except BaseException:
        _delete(client, sandboxes)
        raise
    if not keep:
        _delete(client, sandboxes)
    return report


def _delete(client: SandboxClient, sandboxes: dict[str, Sandbox]) -> None:
    for sandbox in sandboxes.values():
        # Already gone (ttl, a crash): nothing left to clean up.
        with contextlib.suppress(OrchardError):
            client.delete_sandbox(sandbox.id)
