"""Task sets and runs on them: ``orchard tasks ...``, ``eval`` and ``report``."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar
from urllib.parse import urlsplit

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchard.cli._common import OrchestratorOption, friendly_errors, open_orchestrator, stderr
from orchard.env.client import SandboxClient

if TYPE_CHECKING:
    from orchard.tasks import Task, TaskCheck
    from orchard.tasks.assistant import AssistantTask, AssistantTaskCheck
    from orchard.tasks.web import WebTask, WebTaskCheck

T = TypeVar("T")
C = TypeVar("C")

tasks_app = typer.Typer(no_args_is_help=True, help="Task sets: list and validate them.")
# eval and report are top-level commands.
app = typer.Typer()

_Tasks = Annotated[str, typer.Argument(
    help="'bundled', 'humaneval', 'web' (the web tasks), 'web-live', 'assistant' (hand-written "
         "and generated assistant tasks), or a .json/.jsonl/.parquet file, a saved dataset or "
         "a task directory.")]
_Split = Annotated[str | None, typer.Option(help="Keep only this split (train, test).",
                                            show_default=False)]
_TaskIds = Annotated[list[str] | None, typer.Option(
    "--task", help="Keep only this instance id (repeatable).", show_default=False)]


def _load(tasks: str, split: str | None, ids: list[str] | None) -> list[Task]:
    from orchard.tasks import TaskLoadError, load_tasks

    try:
        return load_tasks(tasks, split=split, ids=ids or None)
    except TaskLoadError as exc:
        stderr.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from None


def _load_web(tasks: str, split: str | None, ids: list[str] | None) -> list[WebTask]:
    from orchard.tasks.web import load_web_tasks

    return _loaded(load_web_tasks, tasks, split, ids)


def _load_assistant(tasks: str, split: str | None, ids: list[str] | None
                    ) -> list[AssistantTask]:
    from orchard.tasks.assistant import load_assistant_tasks

    return _loaded(load_assistant_tasks, tasks, split, ids)


def _loaded(loader: Callable[..., list[T]], tasks: str, split: str | None,
            ids: list[str] | None) -> list[T]:
    from orchard.tasks import TaskLoadError

    try:
        loaded = loader(tasks, split=split)
    except TaskLoadError as exc:
        stderr.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from None
    return [t for t in loaded if not ids or t.instance_id in ids]


def _domain(tasks: str) -> str:
    """swe, web or assistant: by the set's name, or a YAML file's first task."""
    from orchard.tasks.assistant import ASSISTANT_SETS
    from orchard.tasks.web import WEB_SETS

    if tasks in WEB_SETS:
        return "web"
    if tasks in ASSISTANT_SETS:
        return "assistant"
    if tasks.endswith((".yaml", ".yml")):  # both domains' task files are YAML
        path = Path(tasks)
        text = path.read_text(errors="replace") if path.is_file() else ""
        return "assistant" if re.search(r"^\s*-?\s*world:", text, re.MULTILINE) else "web"
    return "swe"


def _is_web(tasks: str) -> bool:
    return _domain(tasks) == "web"


@tasks_app.command("list")
def tasks_list(tasks: _Tasks = "bundled", split: _Split = None,
               json_: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List a task set's tasks."""
    if _domain(tasks) == "assistant":
        helped = _load_assistant(tasks, split, None)
        if json_:
            typer.echo(json.dumps([t.model_dump(exclude={"gold", "world"}) for t in helped],
                                  indent=2))
            return
        table = Table(title=f"{tasks}: {len(helped)} tasks")
        for col in ("instance_id", "split", "checks", "rubric", "goal"):
            table.add_column(col)
        for a in helped:
            table.add_row(a.instance_id, a.split or "", ",".join(c.name for c in a.checks),
                          str(len(a.rubric)), a.goal)
        Console().print(table)
        return
    if _is_web(tasks):
        web = _load_web(tasks, split, None)
        if json_:
            typer.echo(json.dumps([t.model_dump(exclude={"gold"}) for t in web], indent=2))
            return
        table = Table(title=f"{tasks}: {len(web)} tasks")
        for col in ("instance_id", "split", "sites", "checker", "goal"):
            table.add_column(col)
        for w in web:
            sites = ",".join(w.sites) or ""
            if w.live:  # plainly marked: it needs the internet
                sites = f"LIVE {urlsplit(w.start_url).hostname}" + (f", {sites}" if sites else "")
            table.add_row(w.instance_id, w.split or "", sites, w.checker.name, w.goal)
        Console().print(table)
        return
    loaded = _load(tasks, split, None)
    if json_:
        typer.echo(json.dumps([t.model_dump(exclude={"patch", "test_patch", "source"})
                               for t in loaded], indent=2))
        return
    table = Table(title=f"{tasks}: {len(loaded)} tasks")
    for col in ("instance_id", "split", "kind", "F2P", "P2P", "image"):
        table.add_column(col)
    for t in loaded:
        table.add_row(t.instance_id, t.split or "", str(t.metadata.get("bug_kind", "")),
                      str(len(t.FAIL_TO_PASS)), str(len(t.PASS_TO_PASS)), t.image)
    Console().print(table)


@tasks_app.command("validate")
@friendly_errors
def tasks_validate(
    ctx: typer.Context,
    tasks: _Tasks = "bundled",
    split: _Split = None,
    task: _TaskIds = None,
    json_: Annotated[bool, typer.Option("--json", help="Print every check as JSON.")] = False,
    concurrency: Annotated[int, typer.Option(min=1, help="Tasks validated at once.")] = 2,
    orchestrator: OrchestratorOption = None,
) -> None:
    """Check every task: the gold patch resolves it, and on the untouched repository its
    FAIL_TO_PASS tests fail and PASS_TO_PASS tests pass (web tasks: the gold run resolves it,
    doing nothing does not). Exit 1 if any task is broken."""
    from orchard.tasks import validate_tasks

    def report(check: TaskCheck | WebTaskCheck | AssistantTaskCheck) -> None:
        if not json_:
            mark = "[green]ok[/]" if check.ok else "[red]BROKEN[/]"
            stderr.print(f"{mark} {check.instance_id} ({check.seconds:.1f}s)"
                         + "".join(f"\n    {escape(p)}" for p in check.problems))

    with contextlib.ExitStack() as stack:
        url, api_key = open_orchestrator(stack, ctx, orchestrator)
        client = stack.enter_context(SandboxClient(url, api_key=api_key))
        checks: list[TaskCheck] | list[WebTaskCheck] | list[AssistantTaskCheck]
        if _domain(tasks) == "assistant":
            from orchard.tasks.assistant import validate_assistant

            checks = _validate_each(client, _load_assistant(tasks, split, task),
                                    validate_assistant, concurrency, report)
        elif _is_web(tasks):
            from orchard.tasks.web import validate_web

            checks = _validate_each(client, _load_web(tasks, split, task), validate_web,
                                    concurrency, report)
        else:
            checks = validate_tasks(client, _load(tasks, split, task), concurrency=concurrency,
                                    on_done=report)
    broken = [c for c in checks if not c.ok]
    if json_:
        typer.echo(json.dumps([c.model_dump(mode="json") for c in checks], indent=2))
    else:
        stderr.print(f"{len(checks) - len(broken)}/{len(checks)} tasks valid"
                     + (f"; broken: {', '.join(c.instance_id for c in broken)}" if broken else ""))
    if broken:
        raise typer.Exit(1)


def _validate_each(client: SandboxClient, tasks: list[T],
                   validate: Callable[[SandboxClient, T], C], concurrency: int,
                   report: Callable[[C], None]) -> list[C]:
    from concurrent.futures import ThreadPoolExecutor

    def one(task: T) -> C:
        check = validate(client, task)
        report(check)
        return check

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, tasks))


@app.command("eval")
@friendly_errors
def eval_(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(help="Run directory: results, traces; rerun to resume.")],
    tasks: Annotated[str, typer.Option(help="'bundled', 'humaneval', 'web', 'assistant' or a "
                                            "path (see "
                                            "`orchard tasks list --help`).")] = "bundled",
    split: _Split = None,
    task: _TaskIds = None,
    harness: Annotated[str, typer.Option(
        help="oracle (gold patch), teacher (mini-swe-agent + scripted teacher model) or "
             "mini-swe-agent (needs --model-url and --model); for web tasks, web-teacher "
             "(the browser agent + scripted web teacher) or browser-agent (needs --model-url "
             "and --model); for assistant tasks, assistant-teacher or assistant (needs "
             "--model-url and --model).")] = "oracle",
    n: Annotated[int, typer.Option(min=1, help="Samples per task (pass@k needs k <= n).")] = 1,
    concurrency: Annotated[int, typer.Option(min=1, help="Rollouts at once.")] = 2,
    model_url: Annotated[str | None, typer.Option(
        help="OpenAI-compatible server the harness calls (through a recording proxy started "
             "here), e.g. http://127.0.0.1:8000.", show_default=False)] = None,
    model: Annotated[str | None, typer.Option(help="Model name the server serves.",
                                              show_default=False)] = None,
    proxy: Annotated[str | None, typer.Option(
        help="Use this running recording proxy (forwarding to the model) instead of starting "
             "one.", show_default=False)] = None,
    proxy_key: Annotated[str | None, typer.Option(
        envvar="ORCHARD_PROXY_KEY", help="That proxy's admin key (its --admin-key), which "
        "reading the rollouts' model calls takes.", show_default=False)] = None,
    teacher_solve: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="teacher: the share of tasks its script solves.")] = 1.0,
    config: Annotated[list[str] | None, typer.Option(
        "--config", "-c", help="mini-swe-agent config override (YAML file or KEY=VALUE).")
    ] = None,
    token_ids: Annotated[bool, typer.Option(
        help="Ask the model server for token ids and log-probs.")] = True,
    render_with: Annotated[str | None, typer.Option(
        help="Tokenizer directory: the proxy renders chat with its template and calls the "
             "model's /v1/completions with token ids (for servers whose chat endpoint gives "
             "no token ids, e.g. `orchard policy serve`, vLLM).", show_default=False)] = None,
    judge_url: Annotated[str | None, typer.Option(
        help="Assistant tasks: an OpenAI-compatible URL (ending in /v1) whose model scores each "
             "rollout's rubric; the reward becomes base + 0.5 J.", show_default=False)] = None,
    judge_model: Annotated[str, typer.Option(help="The model the judge URL serves.")
                           ] = "judge",
    max_attempts: Annotated[int, typer.Option(
        min=1, max=10, help="Attempts per rollout on environment failures.")] = 3,
    cpu: Annotated[str, typer.Option(help="Sandbox CPU (doubled on each retry).")] = "1",
    memory: Annotated[str, typer.Option(help="Sandbox memory (doubled on each retry).")] = "2Gi",
    heartbeat_interval: Annotated[float, typer.Option(
        min=0.1, help="Seconds between heartbeats of live sandboxes: well under the "
                      "orchestrator's heartbeat_timeout (180 s by default), after which "
                      "a dead runner's sandboxes are reaped.")] = 30.0,
    orchestrator: OrchestratorOption = None,
    per_task: Annotated[bool, typer.Option(help="Print the per-task table too.")] = True,
) -> None:
    """Run a harness on tasks (n samples each), grade every patch in a fresh sandbox, and
    write DIR/results.json, results.parquet, rollouts.jsonl and one trace per rollout."""
    from orchard.eval import (
        RunConfig,
        RunMismatch,
        evaluate,
        load_summary,
        make_harness,
        run_table,
    )
    from orchard.eval.progress import RunProgress
    from orchard.rollout.agents.minisweagent import config_from_specs

    domain = _domain(tasks)
    loaded: list[Task] | list[WebTask] | list[AssistantTask] = (
        _load_web(tasks, split, task) if domain == "web"
        else _load_assistant(tasks, split, task) if domain == "assistant"
        else _load(tasks, split, task))
    try:
        overrides = config_from_specs(config or [])
        h = make_harness(harness, loaded, model_url=model_url, model=model,
                         teacher_solve=teacher_solve, config=overrides, token_ids=token_ids,
                         render_with=render_with, judge_url=judge_url, judge_model=judge_model)
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from None
    settings = {"tasks": tasks, "split": split, "harness": harness, "model": model,
                "teacher_solve": teacher_solve if "teacher" in harness else None}
    run_config = RunConfig(out=out, n=n, concurrency=concurrency, max_attempts=max_attempts,
                           cpu=cpu, memory=memory, heartbeat_interval=heartbeat_interval,
                           settings=settings)
    progress = RunProgress(concurrency)
    with contextlib.ExitStack() as stack:
        url, api_key = open_orchestrator(stack, ctx, orchestrator)
        client = stack.enter_context(SandboxClient(url, api_key=api_key))
        stack.enter_context(progress)
        try:
            evaluate(loaded, h, out, client, config=run_config, proxy_url=proxy,
                     proxy_key=proxy_key,
                     on_start=progress.start, on_result=progress.update)
        except RunMismatch as exc:
            stderr.print(f"[red]error:[/] {escape(str(exc))}")
            raise typer.Exit(2) from None
        except PermissionError as exc:  # --proxy would not show its sessions: the key
            stderr.print(f"[red]error:[/] {escape(str(exc))}")
            raise typer.Exit(1) from None
    for table in run_table(load_summary(out), per_task=per_task):
        Console().print(table)
    stderr.print(f"results in {out}/results.json")


@app.command("report")
def report(
    dirs: Annotated[list[Path], typer.Argument(help="Run directories (--out of orchard eval).")],
    chart: Annotated[Path | None, typer.Option(
        help="Write a PNG chart here (default: report.png in the first run directory).",
        show_default=False)] = None,
    per_task: Annotated[bool, typer.Option(help="Print the per-task table too.")] = True,
) -> None:
    """Compare runs side by side (e.g. two harnesses on the same tasks) and draw a chart."""
    from orchard.eval import compare_tables, draw_chart, load_summary, run_table

    try:
        summaries = [load_summary(d) for d in dirs]
    except (OSError, ValueError) as exc:
        stderr.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from None
    console = Console()
    tables = (run_table(summaries[0], per_task=per_task) if len(dirs) == 1
              else compare_tables(summaries, dirs))
    for table in tables[: None if per_task else 1]:
        console.print(table)
    path = draw_chart(summaries, dirs, chart or dirs[0] / "report.png")
    stderr.print(f"chart: {path}")
