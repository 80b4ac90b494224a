"""One trace per rollout: the harness's model calls (from the recording proxy) and what the
orchestrator did to the rollout's sandboxes (its event log), joined on one timeline.

The join key is the rollout id, which is both the proxy session id (``/s/<id>/v1``) and the
``session`` a sandbox was created with. Both sides stamp wall-clock Unix time when an action
started; the timeline orders by it (ties: model call first, since a harness acts on a reply).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import BaseModel, Field

from orchard.env.client import SandboxClient
from orchard.env.schema import EventKind, SandboxEvent
from orchard.rollout.proxy.recorder import ModelCall, SessionStore, check_session


class TraceStep(BaseModel):
    time: float
    source: Literal["model", "sandbox"]
    index: int = Field(description="Into model_calls or sandbox_events.")
    summary: str


class Trace(BaseModel):
    rollout_id: str
    started_at: float | None = None
    ended_at: float | None = None
    model_calls: list[ModelCall] = Field(
        default_factory=list, description="As the proxy recorded them (GET /sessions/{id}).")
    sandbox_events: list[SandboxEvent] = Field(default_factory=list)
    judge_calls: list[dict[str, Any]] = Field(
        default_factory=list, description="The rubric judge's exchanges that graded the "
        "rollout (assistant tasks with a rubric), as the judge client recorded them.")
    timeline: list[TraceStep] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="The task, its reward, the harness: the caller's.")

    def execs(self) -> list[SandboxEvent]:
        return [e for e in self.sandbox_events if e.kind == EventKind.exec]


def _call_summary(call: ModelCall) -> str:
    if call.get("error") is not None:
        return f"model call {call.get('index')}: HTTP {call.get('status')} error"
    choices = (call.get("response") or {}).get("choices") or [{}]
    message = choices[0].get("message") or {}
    tools = [tc["function"]["name"] for tc in message.get("tool_calls") or []]
    said = f"{len(tools)} tool call(s): {', '.join(tools)}" if tools else "text reply"
    return f"model call {call.get('index')}: {said}"


def _event_summary(event: SandboxEvent) -> str:
    d = event.data
    if event.kind == EventKind.exec:
        program = d.get("command") if d.get("command") is not None else json.dumps(d.get("argv"))
        return f"{event.sandbox_id}: exec {program!r} -> {d.get('exit_code')}"
    if event.kind in (EventKind.file_write, EventKind.mkdir, EventKind.remove):
        return f"{event.sandbox_id}: {event.kind.value} {d.get('path')}"
    if event.kind == EventKind.patch:
        return f"{event.sandbox_id}: patch ({'applied' if d.get('success') else 'failed'})"
    if event.kind == EventKind.browser:
        target = d.get("url") or (f"#{d['id']}" if d.get("id") else "")
        return (f"{event.sandbox_id}: browser {d.get('action')} {target}".rstrip()
                + f" -> {d.get('page_url')}" + (f" ({d['error']})" if d.get("error") else ""))
    if event.kind == EventKind.http:
        return (f"{event.sandbox_id}: http {d.get('method')} :{d.get('port')}{d.get('path')} "
                f"-> {d.get('status')}")
    return f"{event.sandbox_id}: {event.kind.value}"


def build_trace(rollout_id: str, calls: list[ModelCall], events: list[SandboxEvent],
                metadata: dict[str, Any] | None = None) -> Trace:
    steps = [TraceStep(time=c.get("started_at") or 0.0, source="model", index=i,
                       summary=_call_summary(c)) for i, c in enumerate(calls)]
    steps += [TraceStep(time=e.time, source="sandbox", index=i, summary=_event_summary(e))
              for i, e in enumerate(events)]
    steps.sort(key=lambda s: (s.time, s.source != "model", s.index))
    ends = [(c.get("started_at") or 0.0) + (c.get("latency_ms") or 0) / 1000 for c in calls]
    ends += [e.time + (e.data.get("duration_ms") or 0) / 1000 for e in events]
    return Trace(rollout_id=rollout_id, started_at=steps[0].time if steps else None,
                 ended_at=max(ends) if ends else None, model_calls=calls,
                 sandbox_events=events, timeline=steps, metadata=metadata or {})


class ProxyRefused(PermissionError):
    """The proxy would not let us read its sessions (no admin key, or the wrong one)."""


def _read_proxy(proxy: str, path: str, key: str | None) -> httpx.Response:
    r = httpx.get(f"{proxy.rstrip('/')}{path}", timeout=60,
                  headers={"X-API-Key": key} if key else None)
    if r.status_code in (401, 403):
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = r.text[:300]
        raise ProxyRefused(f"the recording proxy at {proxy} refused to show its sessions "
                           f"({r.status_code}: {message}); pass its admin key (proxy_key=, "
                           "--proxy-key or ORCHARD_PROXY_KEY) or read its --store directory")
    return r


def check_proxy_key(proxy: str, key: str | None) -> None:
    """Raise ProxyRefused now, rather than once per rollout, if ``key`` cannot read sessions."""
    _read_proxy(proxy, "/sessions", key).raise_for_status()


def model_calls(rollout_id: str, proxy: str | Path,
                key: str | None = None) -> list[ModelCall]:
    """A session's recorded calls, from a running proxy (its URL; reading takes its admin key)
    or its store directory."""
    check_session(rollout_id)
    if isinstance(proxy, Path):
        return SessionStore(proxy).read(rollout_id) or []
    r = _read_proxy(proxy, f"/sessions/{rollout_id}", key)
    if r.status_code == 404:
        return []
    r.raise_for_status()
    return list(r.json()["calls"])


def collect_trace(rollout_id: str, client: SandboxClient, proxy: str | Path | None,
                  metadata: dict[str, Any] | None = None,
                  proxy_key: str | None = None) -> Trace:
    """The rollout's trace as it stands: call it after the rollout ended (its sandboxes may be
    deleted already; their events stay for the orchestrator's event retention). ``proxy_key``
    is the proxy's admin key, when ``proxy`` is its URL."""
    calls = model_calls(rollout_id, proxy, proxy_key) if proxy is not None else []
    return build_trace(rollout_id, calls, client.events(session=rollout_id), metadata)
