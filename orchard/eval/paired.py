"""Paired differences between two evaluations of the same tasks.

Run with the same ``RunConfig.sampling_seed``, sample k of a task draws the same request seeds
in both evaluations (common random numbers), so where two policies agree they sample alike,
and the difference between the runs is the policies' difference, not two draws of sampling
noise. The unit of pairing is a task: its resolved share over its samples in one run minus
the same in the other. Units from several runs (e.g. RL seeds, each against the same
reference) pool; the standard error is over those units.

    diff = paired_difference([rollout_outcomes(run_b)], rollout_outcomes(run_a))
    print(f"{diff.mean:+.1%} ± {diff.se:.1%}", "significant" if diff.significant else "")
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orchard.eval.results import read_results

Outcomes = Mapping[str, bool]
"""Whether each rollout resolved its task, by ``"<instance_id>/<sample>"``."""


def rollout_outcomes(run_dir: str | Path) -> dict[str, bool]:
    """The outcome of each finished rollout of a run (a failed one counts as unresolved)."""
    return {f"{r.instance_id}/{r.sample}": r.resolved for r in read_results(run_dir)}


def task_shares(outcomes: Outcomes) -> dict[str, float]:
    """Each task's resolved share over its samples."""
    by_task: dict[str, list[bool]] = {}
    for key, resolved in outcomes.items():
        by_task.setdefault(key.rsplit("/", 1)[0], []).append(resolved)
    return {task: sum(v) / len(v) for task, v in by_task.items()}


@dataclass(frozen=True)
class PairedDifference:
    mean: float
    """Mean over units of (share in the run - share in the reference)."""
    se: float
    """Its standard error over the units (nan with fewer than two)."""
    units: int

    @property
    def significant(self) -> bool:
        """|mean| above two standard errors (about 95%, two-sided); never with one unit."""
        return not math.isnan(self.se) and abs(self.mean) > 2 * self.se

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "significant": self.significant}


def paired_difference(runs: Sequence[Outcomes], reference: Outcomes) -> PairedDifference:
    """The paired difference of ``runs`` (one or more, each against ``reference``) on the
    tasks both have. A task missing from the reference is left out, not guessed."""
    return pooled_difference([(run, reference) for run in runs])


def pooled_difference(pairs: Sequence[tuple[Outcomes, Outcomes]]) -> PairedDifference:
    """The paired difference over (run, its reference) pairs, units pooled: e.g. two arms of
    an RL curve, seed by seed, each seed's arm B against its arm A."""
    diffs: list[float] = []
    for run, reference in pairs:
        ref = task_shares(reference)
        diffs += [share - ref[task] for task, share in task_shares(run).items() if task in ref]
    if not diffs:
        raise ValueError("the runs and the reference share no task: were they evaluated on "
                         "the same tasks?")
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan
    return PairedDifference(statistics.fmean(diffs), se, len(diffs))


__all__ = ["Outcomes", "PairedDifference", "paired_difference", "pooled_difference",
           "rollout_outcomes", "task_shares"]
