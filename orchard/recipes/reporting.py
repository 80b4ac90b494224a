"""Where training metrics go: one small interface (``Reporter``), a JSON-lines file by default,
and TensorBoard, Weights & Biases and trackio when asked for by name, as transformers'
``report_to`` does.

``open_reporters(["tensorboard"], out, name, config)`` gives one reporter that fans out to
each backend named; the recipes take it as ``report=`` and log each step's record under their
own section (``sft/loss``, ``rl/approx_kl``, ``eval/resolved_rate``), numbers only. The
recipes' own logs (``rl.jsonl``, ``distill.jsonl``) are written whatever is chosen: resuming a
run reads them. Each backend's package is an extra (``pip install 'orchard[tensorboard]'``),
imported only when that backend is opened.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from orchard.extras import require_module

BACKENDS = ("jsonl", "tensorboard", "wandb", "trackio")
"""The backends, in the order they are opened."""
CHOICES = (*BACKENDS, "all", "none")
"""What ``--report-to`` takes: a backend, ``all`` (the JSON lines and every backend whose
package is installed) or ``none`` (only the recipes' own logs)."""
# The module each backend imports; the extra that installs it has the backend's name.
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}


class Reporter(Protocol):
    """Takes one record per step; keeps what it can chart (``scalars``)."""

    def log(self, metrics: Mapping[str, Any], step: int) -> None: ...

    def close(self) -> None: ...


def scalars(record: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of ``record``, each key under ``prefix/``, nested dicts flattened with
    ``/``; text, lists, None and booleans are left out, since no chart can show them."""
    out: dict[str, float] = {}
    for key, value in record.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(scalars(value, name))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = float(value)
    return out


class JsonlReporter:
    """Appends each record whole, as one JSON line, to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        # "step" first: the recipes' records already start with it, so their files read as
        # they did before there were reporters.
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")

    def close(self) -> None:
        pass  # every line is written and closed as it comes


class Section:
    """``reporter`` seen by one recipe: the numbers of each record, under ``name/``; a
    record's own ``step`` is the x axis, not a chart of its own."""

    def __init__(self, reporter: Reporter, name: str) -> None:
        self.reporter, self.name = reporter, name

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        numbers = scalars({k: v for k, v in metrics.items() if k != "step"}, self.name)
        self.reporter.log(numbers, step)

    def close(self) -> None:
        pass  # whoever opened the reporter closes it


def section(reporter: Reporter | None, name: str) -> Reporter | None:
    """``reporter`` with each record's numbers under ``name/``; None stays None."""
    return None if reporter is None else Section(reporter, name)


class TensorBoardReporter:
    """Event files under ``log_dir``, one chart a key (``tensorboard --logdir``)."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for key, value in scalars(metrics).items():
            self.writer.add_scalar(key, value, step)
        # A run is watched while it trains: each step is on disk before the next starts.
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbReporter:
    """A Weights & Biases run under ``run_dir/wandb``; ``WANDB_MODE=offline`` keeps it on disk
    (``wandb sync`` uploads it later), ``WANDB_PROJECT`` names the project."""

    def __init__(self, run_dir: Path, run_name: str, config: Mapping[str, Any]) -> None:
        import wandb

        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "orchard"),
                              name=run_name, dir=str(run_dir), config=dict(config))
        self.axes: set[str] = set()

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        values = scalars(metrics)
        # W&B drops a step lower than one it has seen, and the recipes of one run each count
        # from 0: every section gets its own step axis ("rl/step" for "rl/*").
        axes = {key.split("/", 1)[0] for key in values if "/" in key}
        for axis in axes - self.axes:
            self.run.define_metric(f"{axis}/step")
            self.run.define_metric(f"{axis}/*", step_metric=f"{axis}/step")
        self.axes |= axes
        self.run.log({**values, **{f"{axis}/step": step for axis in axes}})

    def close(self) -> None:
        self.run.finish()


class TrackioReporter:
    """A trackio run in its local database (``TRACKIO_DIR``, by default under the Hugging Face
    cache; ``trackio show`` opens it), project ``TRACKIO_PROJECT`` or orchard."""

    def __init__(self, run_name: str, config: Mapping[str, Any]) -> None:
        import trackio

        self.project = os.environ.get("TRACKIO_PROJECT", "orchard")
        self.run = trackio.init(project=self.project, name=run_name, config=dict(config))

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self.run.log(scalars(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class Reporters:
    """Several reporters as one; ``where`` says where each backend writes."""

    def __init__(self, reporters: Iterable[Reporter] = (),
                 where: Mapping[str, str] | None = None) -> None:
        self.reporters, self.where = list(reporters), dict(where or {})

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for reporter in self.reporters:
            reporter.log(metrics, step)

    def close(self) -> None:
        # Each backend is finished even if another fails to close: an unfinished W&B or
        # trackio run can lose the steps it had not flushed.
        errors = []
        for reporter in self.reporters:
            try:
                reporter.close()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> Reporters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse_report_to(values: Iterable[str] | None) -> list[str]:
    """The backends that ``--report-to`` values name (repeated or comma-separated; None: the
    default, jsonl). Raises ValueError for an unknown name and ``MissingExtra`` (naming the
    extra to install) for a backend whose package is missing, before anything is opened."""
    values = ["jsonl"] if values is None else values
    names = [n.strip().lower() for v in values for n in v.split(",") if n.strip()]
    unknown = [n for n in names if n not in CHOICES]
    if unknown:
        raise ValueError(f"--report-to takes {', '.join(CHOICES)}; not {', '.join(unknown)}")
    if "none" in names:
        if len(names) > 1:
            raise ValueError("--report-to none reports nowhere else: give it alone")
        return []
    if "all" in names:
        from importlib.util import find_spec

        return [b for b in BACKENDS if b not in PACKAGES or find_spec(PACKAGES[b])]
    for name in names:
        if name in PACKAGES:
            require_module(PACKAGES[name], name)
    return [b for b in BACKENDS if b in names]


def open_reporters(report_to: Iterable[str] | None, run_dir: Path, run_name: str,
                   config: Mapping[str, Any]) -> Reporters:
    """One reporter over the backends ``report_to`` names (``parse_report_to``), writing for
    the run in ``run_dir``: jsonl to ``run_dir/metrics.jsonl``, tensorboard to
    ``run_dir/tensorboard``, wandb to ``run_dir/wandb``, trackio to its own database.
    ``config`` is the run's settings (JSON-able), for the backends that keep them (wandb,
    trackio)."""
    names = parse_report_to(report_to)
    run_dir = run_dir.resolve()  # the paths in ``where`` are printed for other shells
    run_dir.mkdir(parents=True, exist_ok=True)
    opened = Reporters()
    try:
        for name in names:
            if name == "jsonl":
                opened.reporters.append(JsonlReporter(run_dir / "metrics.jsonl"))
                opened.where[name] = str(run_dir / "metrics.jsonl")
            elif name == "tensorboard":
                opened.reporters.append(TensorBoardReporter(run_dir / "tensorboard"))
                opened.where[name] = str(run_dir / "tensorboard")
            elif name == "wandb":
                wandb_run = WandbReporter(run_dir, run_name, config)
                opened.reporters.append(wandb_run)
                opened.where[name] = str(Path(wandb_run.run.dir).parent)
            else:
                from trackio.sqlite_storage import SQLiteStorage

                trackio_run = TrackioReporter(run_name, config)
                opened.reporters.append(trackio_run)
                opened.where[name] = str(SQLiteStorage.get_project_db_path(trackio_run.project))
    except BaseException:
        opened.close()
        raise
    return opened


__all__ = ["BACKENDS", "CHOICES", "JsonlReporter", "Reporter", "Reporters", "parse_report_to",
           "open_reporters", "scalars", "section"]
