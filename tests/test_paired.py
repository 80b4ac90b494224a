"""Paired differences between evaluations of the same tasks (orchard/eval/paired.py)."""

from __future__ import annotations

import math

import pytest

from orchard.eval.paired import paired_difference, pooled_difference, task_shares


def test_units_are_tasks_and_runs_pool() -> None:
    reference = {"a/0": False, "a/1": False, "b/0": True, "b/1": False, "c/0": True,
                 "c/1": True}
    run = {"a/0": True, "a/1": True, "b/0": True, "b/1": True, "c/0": True, "c/1": False}
    assert task_shares(run) == {"a": 1.0, "b": 1.0, "c": 0.5}
    diff = paired_difference([run], reference)
    # Per task: +1, +0.5, -0.5.
    assert diff.units == 3 and diff.mean == pytest.approx(1 / 3)
    assert diff.se == pytest.approx(math.sqrt(((2 / 3) ** 2 + (1 / 6) ** 2 + (5 / 6) ** 2) / 2)
                                    / math.sqrt(3))
    assert not diff.significant
    # A second run (another RL seed) against the same reference adds three more units.
    pooled = paired_difference([run, run], reference)
    assert pooled.units == 6 and pooled.mean == pytest.approx(diff.mean)
    assert pooled.se < diff.se


def test_a_consistent_gain_is_significant_and_missing_tasks_are_left_out() -> None:
    reference = {f"t{i}/{k}": k == 0 for i in range(10) for k in range(2)}
    run = {f"t{i}/{k}": True for i in range(12) for k in range(2)}  # t10, t11: not in the ref
    diff = paired_difference([run], reference)
    assert diff.units == 10 and diff.mean == pytest.approx(0.5) and diff.se == 0.0
    assert diff.significant and diff.as_dict()["significant"] is True
    noisy = {k: v if k[:2] in ("t0", "t1", "t2") else not v for k, v in run.items()}
    diff = paired_difference([noisy], reference)  # +0.5 on three tasks, -0.5 on seven
    assert diff.mean == pytest.approx(-0.2) and not diff.significant
    assert not paired_difference([{"t0/0": True}], reference).significant  # one unit
    with pytest.raises(ValueError, match="share no task"):
        paired_difference([{"x/0": True}], reference)


def test_pairs_with_their_own_references_pool() -> None:
    # Two seeds of two arms: each seed of arm B is paired with the same seed of arm A.
    a0, b0 = {"t0/0": False, "t1/0": True}, {"t0/0": True, "t1/0": True}
    a1, b1 = {"t0/0": True, "t1/0": True}, {"t0/0": True, "t1/0": False}
    pooled = pooled_difference([(b0, a0), (b1, a1)])
    assert pooled.units == 4 and pooled.mean == pytest.approx(0.0)  # +1, 0, 0, -1
    assert paired_difference([b0], a0) == pooled_difference([(b0, a0)])
    with pytest.raises(ValueError, match="share no task"):
        pooled_difference([])
