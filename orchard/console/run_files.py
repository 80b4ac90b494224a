"""Reading what `orchard eval` and the recording proxy leave on disk, for the run pages: the
run directory (run.json, rollouts.jsonl, results.json, traces/) and the proxy's store.

Every problem with a path or a file becomes a ConsoleError that says which file and what to
do; a malformed line of a JSONL file is skipped and named in the page's warnings.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from orchard.console.pages import ConsoleError
from orchard.console.pages import size as human
from orchard.eval.results import ROLLOUTS_FILE, RolloutResult, load_summary, summarize
from orchard.rollout.proxy.recorder import SESSION_PATTERN, ModelCall
from orchard.rollout.traces.trace import Trace, build_trace

# A file this big is not parsed: a page would take minutes and the server's memory.
MAX_FILE_BYTES = 200 * 1024 * 1024
WHAT_TO_GIVE = "give the directory `orchard eval --out` wrote, or a recording proxy's --store"


def resolve(raw: str, roots: list[Path]) -> tuple[Path, str | None]:
    """The directory a visitor named, and a note when it was relative. It must lie under one
    of ``roots``: an API key lets its holder drive sandboxes, not read the host's files."""
    if not raw.strip():
        raise ConsoleError(400, f"no path: {WHAT_TO_GIVE}")
    path = Path(raw.strip())
    relative = not path.is_absolute()
    try:
        path = (Path.cwd() / path).resolve()
        is_dir = path.is_dir()
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        raise ConsoleError(400, f"{raw[:300]!r} cannot be read ({e}): {WHAT_TO_GIVE}") from e
    note = (f"{raw!r} is a relative path: it was read under the server's working directory, "
            f"as {path}") if relative else None
    if not any(path.is_relative_to(root) for root in roots):
        raise ConsoleError(403, f"{path} is outside the directories this console may read "
                           f"({', '.join(map(str, roots))}): start `orchard serve` with "
                           f"--runs-dir {path.parent} (or a folder above it)")
    if not path.exists():
        raise ConsoleError(404, f"{path} does not exist on the server: {WHAT_TO_GIVE}")
    if not is_dir:
        raise ConsoleError(400, f"{path} is a file, not a directory: give the run directory "
                           f"that holds it ({path.parent}?)")
    if not os.access(path, os.R_OK | os.X_OK):
        raise ConsoleError(403, f"{path} cannot be read by the server (permissions): "
                           f"{WHAT_TO_GIVE}, readable by the user the server runs as")
    return path, note


def kind_of(d: Path) -> Literal["run", "proxy"]:
    if (d / ROLLOUTS_FILE).is_file() or (d / "run.json").is_file():
        return "run"
    if any(SESSION_PATTERN.match(p.stem) for p in d.glob("*.jsonl")):
        return "proxy"
    raise ConsoleError(400, f"{d} is neither a run directory (no run.json or rollouts.jsonl) "
                       f"nor a recording proxy's store (no <session>.jsonl files): "
                       f"{WHAT_TO_GIVE}")


def sessions(store: Path) -> list[str]:
    """The store's session ids, as SessionStore.sessions() lists them; read here because
    SessionStore makes its directory, and a page must not make what it was asked to read."""
    try:
        return sorted(p.stem for p in store.glob("*.jsonl") if SESSION_PATTERN.match(p.stem))
    except OSError:
        return []


def found_runs(roots: list[Path], limit: int = 50) -> list[Path]:
    """Run directories and stores in the allowed folders and their runs/ subfolders, newest
    first: what `orchard eval --out runs/NAME` makes."""
    dirs = []
    for parent in {p for root in roots for p in (root, root / "runs")}:
        try:
            dirs += [(p.stat().st_mtime, p) for p in parent.iterdir() if p.is_dir()]
        except OSError:
            continue  # no runs/ there, or one that vanished while listed
    found = []
    for _, d in sorted(dirs, reverse=True):
        try:
            kind_of(d)
        except (ConsoleError, OSError):
            continue
        found.append(d)
        if len(found) == limit:
            break
    return found


def read_text(path: Path) -> str:
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ConsoleError(413, f"{path} is {human(size)}, over the console's limit of "
                               f"{human(MAX_FILE_BYTES)}: read it with `orchard trace show` "
                               "or `orchard report` instead")
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise ConsoleError(403 if isinstance(e, PermissionError) else 400,
                           f"{path} cannot be read: {e.strerror or e}") from e


def _why(e: ValueError) -> str:
    if isinstance(e, ValidationError) and e.errors():
        first = e.errors()[0]
        where = ".".join(map(str, first.get("loc", ())))
        return f"{where}: {first['msg']}" if where else first["msg"]
    return str(e).splitlines()[0][:200]


def _lines(path: Path) -> list[tuple[int, str]]:
    """A JSONL file's non-blank lines with their numbers; a missing file has none."""
    if not path.is_file():
        return []
    return [(n, line) for n, line in enumerate(read_text(path).splitlines(), 1)
            if line.strip()]


def read_rollouts(d: Path) -> tuple[list[RolloutResult], list[str]]:
    """The run's rollouts in task and sample order; a later line for the same rollout wins,
    as on resume. Malformed lines are skipped and named."""
    warnings: list[str] = []
    found: dict[tuple[str, int], RolloutResult] = {}
    for n, line in _lines(d / ROLLOUTS_FILE):
        try:
            r = RolloutResult.model_validate_json(line)
        except ValueError as e:
            warnings.append(f"{ROLLOUTS_FILE} line {n} is not a rollout result ({_why(e)}): "
                            "skipped")
            continue
        found[r.key] = r
    return sorted(found.values(), key=lambda r: r.key), warnings


def read_calls(store: Path, session: str) -> tuple[list[ModelCall], list[str]]:
    warnings: list[str] = []
    calls: list[ModelCall] = []
    for n, line in _lines(store / f"{session}.jsonl"):
        try:
            call = json.loads(line)
            if not isinstance(call, dict):
                raise ValueError(f"a JSON {type(call).__name__}, not a call record")
        except ValueError as e:
            warnings.append(f"{session}.jsonl line {n} is not a call record ({_why(e)}): "
                            "skipped (a torn last line is what a proxy crash leaves)")
            continue
        calls.append(call)  # type: ignore[arg-type]
    return calls, warnings


@dataclass
class Run:
    dir: Path
    config: dict[str, Any]
    summary: dict[str, Any]
    rollouts: list[RolloutResult]
    warnings: list[str] = field(default_factory=list)

    def rollout(self, rollout_id: str) -> RolloutResult:
        for r in self.rollouts:
            if r.rollout_id == rollout_id:
                return r
        some = ", ".join(r.rollout_id for r in self.rollouts[:5]) or "none: it is empty"
        raise ConsoleError(404, f"no rollout {rollout_id!r} in {self.dir}; its rollouts "
                           f"include {some}")


def read_run(d: Path) -> Run:
    rollouts, warnings = read_rollouts(d)
    config: dict[str, Any] = {}
    if (d / "run.json").is_file():
        try:
            config = json.loads(read_text(d / "run.json"))
        except ValueError as e:
            warnings.append(f"run.json is not JSON ({_why(e)}): settings not shown")
    try:
        summary = load_summary(d)
    except FileNotFoundError:
        summary = None
        warnings.append("results.json is not written yet (the run is going on, or stopped): "
                        "figures computed from rollouts.jsonl")
    except ValueError as e:
        summary = None
        warnings.append(f"results.json is not JSON ({_why(e)}): figures computed from "
                        "rollouts.jsonl")
    if summary is not None and not isinstance(summary, dict):
        warnings.append("results.json holds no figures: computed from rollouts.jsonl")
        summary = None
    if summary is None:
        # n is the most samples any task has so far: pass@k is only defined up to it.
        most = max(Counter(r.instance_id for r in rollouts).values(), default=0)
        summary = summarize(rollouts, n=most) if rollouts else {"overall": {}, "tasks": {}}
    return Run(d, config if isinstance(config, dict) else {}, summary, rollouts, warnings)


def read_trace(run: Run, rollout_id: str) -> tuple[Trace, list[str]]:
    """The rollout's trace file; without one, the proxy's record of its model calls."""
    r = run.rollout(rollout_id)
    path = (run.dir / (r.trace or f"traces/{rollout_id}.json")).resolve()
    if not path.is_relative_to(run.dir):
        raise ConsoleError(400, f"rollout {rollout_id!r} names a trace outside its run "
                           f"directory ({r.trace}): not read")
    if path.is_file():
        try:
            return Trace.model_validate_json(read_text(path)), []
        except ValueError as e:
            raise ConsoleError(400, f"{path} is not a trace ({_why(e)}): rewrite it with "
                               "`orchard trace export`, or read the proxy's calls/") from e
    store = run.dir / "calls"
    if not (store / f"{rollout_id}.jsonl").is_file():
        raise ConsoleError(404, f"rollout {rollout_id!r} has no trace ({path} is missing) "
                           f"and no recorded calls in {store}")
    calls, warnings = read_calls(store, rollout_id)
    metadata = {"reward": r.reward, "resolved": r.resolved, "instance_id": r.instance_id}
    return build_trace(rollout_id, calls, [], metadata), [
        f"{path} is missing: showing the proxy's record of the model calls only", *warnings]
