"""What the demo shows while it runs and when it ends: a progress bar per stage (done / total,
elapsed, ETA), the results table (each stage's held-out rate and its paired difference to the
stage before), the PNG of the stages, and where its artifacts are."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

PAIRS = (("sft", "base"), ("sft_rl", "sft"), ("sft_rl", "base"))
"""The paired differences the demo reports: (stage, reference)."""
CONSOLE = "http://127.0.0.1:8000"
"""Where ``orchard serve`` (its defaults) serves the web console."""


class StageProgress:
    """One rich bar per stage; ``with progress.stage(name, total) as advance:`` shows it,
    ``advance()`` after each unit (a rollout, an optimizer step, an RL step). Off a terminal
    rich draws nothing live, and the demo's log lines say the same."""

    def __init__(self, console: Console | None = None) -> None:
        self.progress = Progress(
            TextColumn("{task.description:<12}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[unit]}"), TimeElapsedColumn(), TextColumn("ETA"),
            TimeRemainingColumn(), console=console or Console(stderr=True))

    @contextlib.contextmanager
    def stage(self, name: str, total: int | None = None, unit: str = ""
              ) -> Iterator[Callable[[int], None]]:
        task = self.progress.add_task(name, total=total, unit=unit)
        yield lambda n=1: self.progress.advance(task, n)
        # A stage can end short of its estimate (an early stop, fewer steps): full it is. A
        # stage that raised stays where it stopped.
        end = total if total is not None else max(self.progress.tasks[task].completed, 1)
        self.progress.update(task, total=end, completed=end)

    def __enter__(self) -> StageProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


def pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}%"


def results_table(results: dict[str, Any], title: str) -> Table:
    """Per stage: held-out resolved rate with its binomial SE, pass@k, rollouts, seconds; then
    the paired differences, with their SE over tasks and whether they are significant."""
    table = Table(title=title)
    for column in ("stage", "resolved", "pass@k", "rollouts", "seconds"):
        table.add_column(column)
    for name, stage in results["stages"].items():
        p, n = stage["resolved_rate"], stage["rollouts"]
        se = math.sqrt(p * (1 - p) / n) if n else math.nan
        table.add_row(name, f"{pct(p)} ± {pct(se)}",
                      ", ".join(f"@{k} {v:.1%}" for k, v in stage["pass_at_k"].items()),
                      str(n), f"{stage['seconds']:.0f}")
    for key, d in results.get("paired", {}).items():
        table.add_row(key.replace("_minus_", " - "),
                      f"{d['mean']:+.1%} ± {pct(d['se'])}",
                      "significant" if d["significant"] else "not significant",
                      f"{d['units']} tasks", "", style="bold" if d["significant"] else None)
    return table


def draw_stages(sft_log: list[dict[str, Any]], rl_log: list[dict[str, Any]],
                results: dict[str, Any], path: Path) -> None:
    """SFT loss per step, each RL step's final-epoch KL and its rollouts' resolved rate, and
    the held-out resolved rate per stage (binomial SE bars, paired differences above)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(14, 3.8))
    a.plot([m["step"] for m in sft_log], [m["loss"] for m in sft_log])
    a.set(title="SFT: masked loss", xlabel="step", ylabel="loss")
    steps = [r["step"] for r in rl_log]
    b.plot(steps, [r["resolved_rate"] for r in rl_log], marker="o", label="sampled resolved")
    b.set(title="RL steps", xlabel="step", ylim=(0, 1))
    kl = [(r["step"], r["approx_kl"]) for r in rl_log if "approx_kl" in r]
    if kl:
        twin = b.twinx()
        twin.plot([s for s, _ in kl], [max(v, 1e-8) for _, v in kl], color="#dd8452",
                  marker="x", label="final-epoch KL")
        twin.set(yscale="log", ylabel="approx KL")
    if rl_log:
        b.legend(fontsize=8, loc="upper left")
    else:
        b.text(0.5, 0.5, "no RL steps in this run", ha="center", transform=b.transAxes)
    stages = results["stages"]
    names = list(stages)
    rates = [stages[n]["resolved_rate"] for n in names]
    errors = [math.sqrt(p * (1 - p) / max(stages[n]["rollouts"], 1))
              for n, p in zip(names, rates, strict=True)]
    c.bar(names, rates, yerr=errors, capsize=4, color="#4c72b0")
    c.set(title="held-out resolved rate (± 1 SE)", ylim=(0, 1))
    for key, d in results.get("paired", {}).items():
        stage, reference = key.split("_minus_")
        if stage in names and reference in names and key != "sft_rl_minus_base":
            x = names.index(stage)
            c.annotate(f"{d['mean']:+.0%} ± {d['se']:.0%}\nvs {reference}",
                       (x, min(0.95, rates[x] + errors[x] + 0.03)), ha="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def artifacts(out: Path, results: dict[str, Any]) -> list[str]:
    """The lines that end the demo: where its results, charts and metrics are, and the console
    page of each run of rollouts (the teacher's, each held-out evaluation's)."""
    out = out.resolve()
    lines = [f"results table: {out / 'results.json'}",
             *(f"chart: {png}" for png in sorted(out.glob("*.png")))]
    for backend, where in results.get("reporting", {}).items():
        line = f"{backend}: {where}"
        if backend == "tensorboard":
            line += f" (tensorboard --logdir {where})"
        lines.append(line)
    runs = [out / "teacher", *(out / f"eval-{name}" for name in results["stages"])]
    runs = [run for run in runs if (run / "rollouts.jsonl").exists()]
    if runs:
        lines.append("rollouts in the console (after `orchard serve`):")
        lines += [f"  {run.name}: {CONSOLE}/ui/runs?path={quote(str(run), safe='/')}"
                  for run in runs]
    return lines
