"""bench/compare_curves.py: two arms of a learning curve paired seed by seed, and refused
when they did not start from one SFT checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

from compare_curves import compare, load_arm  # noqa: E402

SFT = {"resolved_rate": 0.5, "outcomes": {"t0/0": True, "t1/0": False}}


def arm(path: Path, tag: str, seeds: dict[str, dict[str, dict]], sft: dict = SFT) -> Path:
    path.write_text(json.dumps({"args": {"tag": tag}, "results": {
        "shared": {"sft": sft},
        "seeds": {s: {"evals": evals, "steps": []} for s, evals in seeds.items()}}}))
    return path


def evaluation(t0: bool, t1: bool, format_errors: int | None = None) -> dict:
    stage = {"resolved_rate": (t0 + t1) / 2, "outcomes": {"t0/0": t0, "t1/0": t1}}
    if format_errors is not None:
        stage["exit_statuses"] = {"Submitted": 2 - format_errors,
                                  "RepeatedFormatError": format_errors}
    return stage


def test_arms_pair_seed_by_seed_on_the_seeds_and_steps_both_ran(tmp_path: Path) -> None:
    a = arm(tmp_path / "a.json", "plain", {
        "0": {"5": evaluation(False, False, 1), "10": evaluation(True, False, 1)},
        "1": {"5": evaluation(True, False, 0)},
        "2": {"5": evaluation(True, True, 0)}})  # arm B has no seed 2
    b = arm(tmp_path / "b.json", "kl", {
        "0": {"5": evaluation(True, True, 0)},  # no step 10
        "1": {"5": evaluation(True, False, 2)}})
    result = compare(load_arm(a), load_arm(b))
    assert list(result["points"]) == ["5"]
    point = result["points"]["5"]
    assert point["seeds"] == [0, 1]
    assert (point["a"], point["b"]) == (0.25, 0.75)
    # Per (seed, task): +1, +1, 0, 0.
    assert point["b_minus_a"]["units"] == 4 and point["b_minus_a"]["mean"] == pytest.approx(0.5)
    assert point["format_failures"] == {"a": 1, "b": 2}


def test_runs_without_exit_statuses_say_so(tmp_path: Path) -> None:
    a = arm(tmp_path / "a.json", "a", {"0": {"5": evaluation(True, False)}})
    b = arm(tmp_path / "b.json", "b", {"0": {"5": evaluation(True, True, 0)}})
    assert compare(load_arm(a), load_arm(b))["points"]["5"]["format_failures"] == {
        "a": None, "b": 0}


def test_arms_from_different_sft_checkpoints_are_refused(tmp_path: Path) -> None:
    a = arm(tmp_path / "a.json", "a", {"0": {"5": evaluation(True, False)}})
    other = {"resolved_rate": 0.5, "outcomes": {"t0/0": False, "t1/0": True}}
    b = arm(tmp_path / "b.json", "b", {"0": {"5": evaluation(True, True)}}, sft=other)
    run = subprocess.run([sys.executable, str(BENCH / "compare_curves.py"), str(a), str(b)],
                         capture_output=True, text=True, check=False)
    assert run.returncode != 0
    assert "did not start from one SFT checkpoint" in run.stderr
    assert "copy of the first's shared/sft.pt" in run.stderr


def test_a_file_that_is_not_a_curve_says_what_to_give(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"results": {}}')
    with pytest.raises(SystemExit, match="not a learning_curve result file"):
        load_arm(bad)
