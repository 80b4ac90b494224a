"""Branch a recorded rollout at a step: sandboxes in the state it had before a model call.

``restore(trace, client, step)`` replays the rollout's sandbox side (replay.py) up to its
``step``-th model call in a fresh sandbox, and refuses a replay that did not reach the same
state. ``branch(trace, client, step, k)`` restores once and forks the result k times (see
docs/guides/snapshots.md; ``memory=True`` forks its processes too), so a harness can carry
on k times from the same model context: the conversation up to that call.

    for sandbox in branch(trace, client, step=3, k=8):
        ...  # continue the rollout's conversation up to step 3 in it, then delete it
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from orchard.env.client import OrchardError, Sandbox, SandboxClient
from orchard.env.schema import EventKind
from orchard.rollout.traces.replay import ReplayReport, replay
from orchard.rollout.traces.trace import Trace


def state_seq(trace: Trace, step: int, sandbox_id: str) -> int | None:
    """The seq of the last event of ``sandbox_id`` before the ``step``-th model call (None:
    no event yet); replaying up to it restores the state s_step."""
    calls = [c for c in trace.model_calls
             if c.get("error") is None and str(c.get("endpoint", "")).endswith("completions")]
    if step >= len(calls):
        raise ValueError(f"step {step} is past the {len(calls)} model calls of the trace of "
                         f"{trace.rollout_id}")
    start = float(calls[step]["started_at"])
    before = [e.seq for e in trace.sandbox_events
              if e.sandbox_id == sandbox_id and e.time < start]
    return max(before) if before else None


def rollout_sandbox(trace: Trace) -> str:
    """The rollout's own sandbox: the first one the trace created."""
    for event in sorted(trace.sandbox_events, key=lambda e: e.seq):
        if event.kind == EventKind.created:
            return event.sandbox_id
    raise ValueError(f"the trace of {trace.rollout_id} created no sandbox; nothing to replay")


def restore(trace: Trace, client: SandboxClient, step: int, *,
            labels: dict[str, str] | None = None) -> Sandbox:
    """A fresh sandbox in the rollout's state before its ``step``-th model call; the caller's
    to delete. RuntimeError if the replay did not get there (nothing is left running)."""
    sid = rollout_sandbox(trace)
    report = replay(trace, client, sandbox_id=sid, until=state_seq(trace, step, sid),
                    keep=True, labels=labels)
    if broken := replay_broken(report):
        delete_all(client, report.sandbox_ids.values())
        raise RuntimeError(f"replaying {trace.rollout_id} to step {step} did not restore its "
                           f"state: {broken}")
    return client.get_sandbox(report.sandbox_ids[sid])


def branch(trace: Trace, client: SandboxClient, step: int, k: int, *,
           labels: dict[str, str] | None = None, memory: bool = False) -> list[Sandbox]:
    """k ready sandboxes in the state before the ``step``-th model call: one replay, forked;
    the caller's to delete. ``memory``: live forks, which keep the replay's running processes
    (served sites, the browser and its page) as well as its files."""
    source = restore(trace, client, step, labels=labels)
    try:
        return source.fork(k, labels=labels, memory=memory)
    finally:
        delete_all(client, [source.id])


def replay_broken(report: ReplayReport) -> str:
    """Why a replay did not restore the state, or "". Output may differ (the host name is the
    sandbox's id, timestamps move); a skipped action or another exit code is a different
    state."""
    for step in report.steps:
        if step.status == "skipped":
            return f"event {step.seq} ({step.kind.value}) was skipped: {step.detail}"
        if step.kind == EventKind.exec and (step.original.get("exit_code")
                                            != (step.replayed or {}).get("exit_code")):
            return (f"event {step.seq} exited {(step.replayed or {}).get('exit_code')}, "
                    f"not {step.original.get('exit_code')}")
    return ""


def delete_all(client: SandboxClient, ids: Iterable[str]) -> None:
    """Best effort: a sandbox already gone is what we wanted."""
    for sid in ids:
        with contextlib.suppress(OrchardError):
            client.delete_sandbox(sid)
