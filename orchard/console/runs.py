"""Run pages: a run directory's report and rollouts, a rollout's trace as a paged timeline,
two rollouts side by side, and a recording proxy's store with its sessions.

These pages read files on the server, not the REST API, so each checks the login first.
The handlers are plain functions: FastAPI runs them in its thread pool, so parsing a large
trace never stalls the event loop.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import Response

from orchard.console import run_files as files
from orchard.console import run_steps
from orchard.console.pages import ConsoleError, render
from orchard.rollout.proxy.recorder import SESSION_PATTERN
from orchard.rollout.traces.trace import build_trace

STEPS_PAGE = 50
ROLLOUTS_PAGE = 200
SESSIONS_PAGE = 100
COMPARE_STEPS = 30
# The per-task chart grows a bar per task; past this many the table says the rest.
CHART_TASKS = 60


def _offset(raw: str) -> int:
    if not raw:
        return 0
    if not raw.isdigit():
        raise ConsoleError(400, f"offset {raw!r} is not a whole number from 0 up")
    return int(raw)


def _checked_id(raw: str, what: str, example: str) -> str:
    if not raw:
        raise ConsoleError(400, f"no {what} given: add {example} to the address, or pick "
                           "one from the run page")
    if not SESSION_PATTERN.match(raw):
        raise ConsoleError(400, f"{what} {raw[:200]!r} is not an id: ids are letters, digits, "
                           "'.', '_' and '-'")
    return raw


def router() -> APIRouter:
    ui = APIRouter(prefix="/ui/runs")

    @ui.get("")
    def runs(request: Request, path: str = "", offset: str = "") -> Response:
        request.app.state.console.check(request)
        if not path:
            roots = request.app.state.console.runs_roots
            return render(request, "runs.html", found=files.found_runs(roots), roots=roots)
        d, note = files.resolve(path, request.app.state.console.runs_roots)
        if files.kind_of(d) == "proxy":
            return _store(request, d, note, _offset(offset))
        run = files.read_run(d)
        start = _offset(offset)
        by_task = defaultdict(list)
        for r in run.rollouts:
            by_task[r.instance_id].append(r)
        tasks = sorted((run.summary.get("tasks") or {}).items())
        overall = run.summary.get("overall") or {}
        passk = [("resolved rate", overall.get("resolved_rate"))] + [
            (f"pass@{k}", v) for k, v in (overall.get("pass_at_k") or {}).items()]
        return render(request, "run.html", run=run, note=note, path=str(d), overall=overall,
                      tasks=tasks, by_task=by_task, passk_chart=passk,
                      task_chart=[(tid, t.get("resolved_rate")) for tid, t in
                                  tasks[:CHART_TASKS]],
                      rollouts=run.rollouts[start:start + ROLLOUTS_PAGE], offset=start,
                      page=ROLLOUTS_PAGE, store=(d / "calls").is_dir())

    @ui.get("/trace")
    def trace(request: Request, path: str = "", rollout: str = "", offset: str = ""
              ) -> Response:
        request.app.state.console.check(request)
        run = files.read_run(files.resolve(path, request.app.state.console.runs_roots)[0])
        rid = _checked_id(rollout, "rollout", "&rollout=ID")
        result = run.rollout(rid)
        got, warnings = files.read_trace(run, rid)
        start = _offset(offset)
        return render(request, "trace.html", path=str(run.dir), r=result, trace=got,
                      warnings=run.warnings + warnings, offset=start, page=STEPS_PAGE,
                      steps=run_steps.steps(got, start, STEPS_PAGE), total=len(got.timeline))

    @ui.get("/compare")
    def compare(request: Request, path: str = "", a: str = "", b: str = "") -> Response:
        request.app.state.console.check(request)
        run = files.read_run(files.resolve(path, request.app.state.console.runs_roots)[0])
        columns, warnings = [], list(run.warnings)
        for raw, name in ((a, "a"), (b, "b")):
            rid = _checked_id(raw, f"rollout {name}", f"&{name}=ID")
            got, more = files.read_trace(run, rid)
            warnings += more
            columns.append({"r": run.rollout(rid), "trace": got,
                            "steps": run_steps.steps(got, 0, COMPARE_STEPS)})
        return render(request, "compare.html", path=str(run.dir), columns=columns,
                      warnings=warnings, shown=COMPARE_STEPS,
                      same_task=columns[0]["r"].instance_id == columns[1]["r"].instance_id)

    @ui.get("/session")
    def session(request: Request, path: str = "", session: str = "", offset: str = ""
                ) -> Response:
        request.app.state.console.check(request)
        store, _ = files.resolve(path, request.app.state.console.runs_roots)
        if files.kind_of(store) == "run":  # a run's calls are in its store, calls/
            store = store / "calls"
        sid = _checked_id(session, "session", "&session=ID")
        if not (store / f"{sid}.jsonl").is_file():
            some = ", ".join(files.sessions(store)[:5]) or "none"
            raise ConsoleError(404, f"no session {sid!r} in {store}; its sessions include "
                               f"{some}")
        calls, warnings = files.read_calls(store, sid)
        got = build_trace(sid, calls, [])
        start = _offset(offset)
        return render(request, "proxy_session.html", path=str(store), session=sid,
                      warnings=warnings, offset=start, page=STEPS_PAGE, total=len(got.timeline),
                      steps=run_steps.steps(got, start, STEPS_PAGE),
                      facts=run_steps.session_summary(calls))

    return ui


def _store(request: Request, store: Path, note: str | None, offset: int) -> Response:
    """A proxy store's sessions, a page at a time: each session's file is read to count it."""
    names = files.sessions(store)
    rows, warnings = [], []
    for name in names[offset:offset + SESSIONS_PAGE]:
        try:
            calls, bad = files.read_calls(store, name)
        except ConsoleError as e:  # one unreadable session does not hide the others
            warnings.append(e.detail)
            continue
        warnings += bad
        rows.append((name, run_steps.session_summary(calls)))
    return render(request, "proxy.html", path=str(store), note=note, rows=rows,
                  warnings=warnings, total=len(names), offset=offset, page=SESSIONS_PAGE)
