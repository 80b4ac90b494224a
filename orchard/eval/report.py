"""Tables and charts of runs: one run's figures, and runs side by side (e.g. two harnesses on
the same tasks: the cross-harness table), with a PNG chart."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from orchard.extras import require_module


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


def run_label(summary: dict[str, Any], path: Path | None = None) -> str:
    run = summary.get("run", {})
    name = run.get("harness", "?")
    if run.get("model"):
        name += f" ({run['model']})"
    return f"{name} [{path.name}]" if path is not None else name


def overall_rows(o: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [("tasks", str(o.get("tasks", 0))), ("rollouts", str(o.get("rollouts", 0))),
            ("resolved", f"{o.get('resolved', 0)} ({_pct(o.get('resolved_rate'))})")]
    rows += [(f"pass@{k}", _pct(v)) for k, v in (o.get("pass_at_k") or {}).items()]
    rows += [("mean steps", _num(o.get("mean_steps"))),
             ("mean tokens", _num(o.get("mean_tokens"), ".0f")),
             ("mean seconds / rollout", _num(o.get("mean_seconds"), ".2f")),
             ("median grading seconds", _num(o.get("median_grading_seconds"), ".2f")),
             ("environment share of time", _pct(o.get("env_share")))]
    if "rollouts_per_minute" in o:
        rows.append(("rollouts / minute", _num(o["rollouts_per_minute"])))
    fails = o.get("failures") or {}
    rows.append(("failures", ", ".join(f"{k} {v}" for k, v in sorted(fails.items())) or "none"))
    outcomes = o.get("outcomes") or {}
    rows.append(("outcomes", ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))))
    return rows


def run_table(summary: dict[str, Any], *, per_task: bool = True) -> list[Table]:
    """The overall figures of one run and, if asked, one row per task."""
    overall = Table(title=f"run {summary.get('run', {}).get('run_id', '')}: "
                    f"{escape(run_label(summary))}")
    overall.add_column("metric")
    overall.add_column("value", justify="right")
    for name, value in overall_rows(summary.get("overall", {})):
        overall.add_row(name, value)
    if not per_task:
        return [overall]
    tasks = Table(title="per task")
    for col in ("task", "n", "resolved", "pass@1", "steps", "seconds", "failures"):
        tasks.add_column(col, justify="left" if col == "task" else "right")
    for tid, t in sorted(summary.get("tasks", {}).items()):
        tasks.add_row(tid, str(t["n"]), f"{t['resolved']}", _pct(t["pass_at_k"].get("1")),
                      _num(t["mean_steps"]), _num(t["mean_seconds"], ".2f"),
                      ", ".join(f"{k} {v}" for k, v in t["failures"].items()) or "")
    return [overall, tasks]


def compare_tables(summaries: Sequence[dict[str, Any]],
                   paths: Sequence[Path]) -> list[Table]:
    """Runs side by side: overall figures, then resolved rate per task (tasks of any run)."""
    # Escaped: "[dir]" would otherwise read as rich markup and vanish from the header.
    labels = [escape(run_label(s, p)) for s, p in zip(summaries, paths, strict=True)]
    overall = Table(title="runs side by side")
    overall.add_column("metric")
    for label in labels:
        overall.add_column(label, justify="right")
    columns = [dict(overall_rows(s.get("overall", {}))) for s in summaries]
    names = list(dict.fromkeys(n for c in columns for n in c))
    for name in names:
        overall.add_row(name, *(c.get(name, "-") for c in columns))
    tasks = Table(title="resolved rate per task")
    tasks.add_column("task")
    for label in labels:
        tasks.add_column(label, justify="right")
    ids = sorted({tid for s in summaries for tid in s.get("tasks", {})})
    for tid in ids:
        tasks.add_row(tid, *(_pct(s["tasks"][tid]["resolved_rate"]) if tid in s.get("tasks", {})
                             else "-" for s in summaries))
    return [overall, tasks]


def draw_chart(summaries: Sequence[dict[str, Any]], paths: Sequence[Path], out: Path) -> Path:
    """A PNG: resolved rate and pass@k per run (grouped bars)."""
    require_module("matplotlib", "train")
    import matplotlib

    matplotlib.use("Agg")  # no display: render to a file
    import matplotlib.pyplot as plt

    labels = [run_label(s, p) for s, p in zip(summaries, paths, strict=True)]
    metrics = ["resolved_rate"] + [f"pass@{k}" for k in sorted(
        {int(k) for s in summaries for k in s.get("overall", {}).get("pass_at_k", {})})]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(labels) * len(metrics) / 2), 4.5))
    width = 0.8 / len(labels)
    for i, (label, s) in enumerate(zip(labels, summaries, strict=True)):
        o = s.get("overall", {})
        values = [o.get("resolved_rate", 0)] + [
            o.get("pass_at_k", {}).get(m.split("@")[1], 0) for m in metrics[1:]]
        bars = ax.bar([j + i * width for j in range(len(metrics))], [100 * v for v in values],
                      width, label=label)
        ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.set_xticks([j + width * (len(labels) - 1) / 2 for j in range(len(metrics))], metrics)
    ax.set_ylabel("% of tasks")
    ax.set_ylim(0, 105)
    ax.set_title("Orchard eval: " + " vs ".join(labels))
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
