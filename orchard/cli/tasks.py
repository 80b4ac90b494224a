"""Task sets and runs on them: ``orchard tasks ...``, ``eval`` and ``report``."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchard.cli._common import OrchestratorOption, friendly_errors, open_orchestrator, stderr
from orchard.env.client import SandboxClient

if TYPE_CHECKING:
    from orchard.domains import Domain

tasks_app = typer.Typer(no_args_is_help=True, help="Task sets: list and validate them.")
# eval and report are top-level commands.
app = typer.Typer()

_Tasks = Annotated[str, typer.Argument(
    help="'bundled', 'humaneval', 'settings' and 'bugfix' (the generated SWE families), 'web' "
         "(the web tasks), 'web-live', 'miniwob' and 'miniwob-untimed' (MiniWoB++ pages x "
         "seeds), 'assistant' (hand-written and generated assistant "
         "tasks), a .json/.jsonl/.parquet file, a saved dataset, a task directory, a Harbor "
         "task or dataset directory (task.toml), or a Hugging Face dataset id of SWE-bench "
         "instances (princeton-nlp/SWE-bench_Verified; images named under "
         "ORCHARD_SWEBENCH_NAMESPACE).")]
_Split = Annotated[str | None, typer.Option(help="Keep only this split (train, test).",
                                            show_default=False)]
_TaskIds = Annotated[list[str] | None, typer.Option(
    "--task", help="Keep only this instance id (repeatable).", show_default=False)]


def _load(tasks: str, split: str | None, ids: list[str] | None) -> tuple[Domain, list[Any]]:
    """The set's domain (the registry resolves its name or path) and its tasks."""
    from orchard.domains import load_tasks
    from orchard.tasks import TaskLoadError

    try:
        return load_tasks(tasks, split=split, ids=ids or None)
    except TaskLoadError as exc:
        stderr.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from None


@tasks_app.command("list")
def tasks_list(tasks: _Tasks = "bundled", split: _Split = None,
               json_: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List a task set's tasks."""
    domain, loaded = _load(tasks, split, None)
    listing = domain.listing
    if json_:
        typer.echo(json.dumps([t.model_dump(exclude=set(listing.json_exclude)) for t in loaded],
                              indent=2))
        return
    table = Table(title=f"{tasks}: {len(loaded)} tasks")
    for col in listing.columns:
        table.add_column(col)
    for t in loaded:
        table.add_row(*listing.row(t))
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
    doing nothing does not; MiniWoB++: each page loads, gives its instruction and ends with a
    reward, and the solver's pages reach 1; Harbor tasks: the oracle solution earns reward 1,
    doing nothing does not). Exit 1 if any task is broken."""
    def report(check: Any) -> None:
        if not json_:
            mark = "[green]ok[/]" if check.ok else "[red]BROKEN[/]"
            stderr.print(f"{mark} {check.instance_id} ({check.seconds:.1f}s)"
                         + "".join(f"\n    {escape(p)}" for p in check.problems))

    domain, loaded = _load(tasks, split, task)
    with contextlib.ExitStack() as stack:
        url, api_key = open_orchestrator(stack, ctx, orchestrator)
        client = stack.enter_context(SandboxClient(url, api_key=api_key))
        checks = domain.validate(client, loaded, concurrency, report)
    broken = [c for c in checks if not c.ok]
    if json_:
        typer.echo(json.dumps([c.model_dump(mode="json") for c in checks], indent=2))
    else:
        stderr.print(f"{len(checks) - len(broken)}/{len(checks)} tasks valid"
                     + (f"; broken: {', '.join(c.instance_id for c in broken)}" if broken else ""))
    if broken:
        raise typer.Exit(1)


@app.command("eval")
@friendly_errors
def eval_(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(help="Run directory: results, traces; rerun to resume.")],
    tasks: Annotated[str, typer.Option(help="'bundled', 'humaneval', 'web', 'assistant', a "
                                            "path or a Hugging Face dataset id (see "
                                            "`orchard tasks list --help`).")] = "bundled",
    split: _Split = None,
    task: _TaskIds = None,
    harness: Annotated[str, typer.Option(
        help="oracle (gold patch), teacher (mini-swe-agent + scripted teacher model) or "
             "mini-swe-agent (needs --model-url and --model); for web tasks, web-teacher "
             "(the browser agent + scripted web teacher), browser-agent (needs --model-url "
             "and --model), miniwob-solver (MiniWoB++'s scripted solver) or random-browser "
             "(random actions); for assistant tasks, assistant-teacher or assistant (needs "
             "--model-url and --model); for Harbor tasks, harbor-oracle (solve.sh).")
    ] = "oracle",
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
    action_set: Annotated[str, typer.Option(
        help="browser-agent: 'orchard' (our browser tool) or 'browsergym' (BrowserGym's "
             "actions, click('12'), answered in plain text; docs/guides/browser.md).")
    ] = "orchard",
    sampling_seed: Annotated[int | None, typer.Option(
        help="Common random numbers: each (task, sample) sends the same request seeds in every "
             "run given this value, so two runs (two checkpoints) compare pairwise.",
        show_default=False)] = None,
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
    from orchard.domains import make_harness
    from orchard.domains.swe.minisweagent import config_from_specs
    from orchard.eval import RunConfig, RunMismatch, evaluate, load_summary, run_table
    from orchard.eval.progress import RunProgress

    _, loaded = _load(tasks, split, task)
    try:
        overrides = config_from_specs(config or [])
        h = make_harness(harness, loaded, model_url=model_url, model=model,
                         teacher_solve=teacher_solve, config=overrides, token_ids=token_ids,
                         render_with=render_with, judge_url=judge_url, judge_model=judge_model,
                         browser_action_set=action_set)
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from None
    settings = {"tasks": tasks, "split": split, "harness": harness, "model": model,
                "teacher_solve": teacher_solve if "teacher" in harness else None,
                # Only when set, so that runs from before the option still resume.
                **({"action_set": action_set} if action_set != "orchard" else {})}
    run_config = RunConfig(out=out, n=n, concurrency=concurrency, max_attempts=max_attempts,
                           cpu=cpu, memory=memory, heartbeat_interval=heartbeat_interval,
                           sampling_seed=sampling_seed, settings=settings)
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
