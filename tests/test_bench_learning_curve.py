"""bench/learning_curve.py's report: seeds from a run on a rebuilt SFT checkpoint join the
curve, each paired against the SFT evaluation of the checkpoint it started from."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

from learning_curve import merge, summarize  # noqa: E402


def evaluation(t0: bool, t1: bool) -> dict:
    return {"resolved_rate": (t0 + t1) / 2, "rollouts": 2,
            "outcomes": {"t0/0": t0, "t1/0": t1}}


def run(folder: Path, sft: dict | None, seeds: dict[str, dict]) -> Path:
    folder.mkdir()
    shared = {"sft": sft, "sft_run": {"sft": {"last_loss": 0.1}}} if sft else {}
    (folder / "curve.json").write_text(json.dumps({
        "shared": shared, "sweep": {},
        "seeds": {s: {"evals": evals, "steps": []} for s, evals in seeds.items()}}))
    return folder


def test_a_merged_seed_is_paired_against_its_own_sft_checkpoint(tmp_path: Path) -> None:
    first = run(tmp_path / "a", evaluation(True, False), {"0": {"5": evaluation(True, True)}})
    rebuilt = run(tmp_path / "b", evaluation(False, False),
                  {"1": {"5": evaluation(True, False)}})
    state = merge(json.loads((first / "curve.json").read_text()), [rebuilt])
    assert state["seeds"]["1"]["sft"] == evaluation(False, False)
    assert "sft" not in state["seeds"]["0"]
    summary = summarize(state)
    point = summary["points"]["5"]
    # Seed 0 against the first SFT: 0, +1. Seed 1 against its own: +1, 0. Against the first
    # SFT seed 1 would be 0, 0 and the mean 0.25.
    assert point["minus_sft"]["units"] == 4
    assert point["minus_sft"]["mean"] == pytest.approx(0.5)
    assert point["sft"] == pytest.approx(0.25)  # the two checkpoints' SFT, averaged
    assert point["rates"] == [1.0, 0.5]
    assert summary["sft_rebuilt"] == {"1": {"resolved_rate": 0.0, "rollouts": 2}}


def test_a_curve_of_one_run_pairs_every_seed_with_the_shared_sft(tmp_path: Path) -> None:
    first = run(tmp_path / "a", evaluation(True, False), {
        "0": {"5": evaluation(True, True)}, "1": {"5": evaluation(False, False)}})
    summary = summarize(merge(json.loads((first / "curve.json").read_text()), []))
    assert summary["points"]["5"]["minus_sft"]["mean"] == pytest.approx(0.0)
    assert summary["sft_rebuilt"] == {}


def test_merges_that_cannot_pair_are_refused(tmp_path: Path) -> None:
    first = json.loads((run(tmp_path / "a", evaluation(True, False),
                            {"0": {"5": evaluation(True, True)}}) / "curve.json").read_text())
    same_seed = run(tmp_path / "b", evaluation(False, False), {"0": {}})
    with pytest.raises(SystemExit, match="seed 0 is in two runs"):
        merge(first, [same_seed])
    unevaluated = run(tmp_path / "c", None, {"2": {}})
    with pytest.raises(SystemExit, match="not evaluated yet.*--resume that run"):
        merge(first, [unevaluated])
    with pytest.raises(SystemExit, match="no curve.json there"):
        merge(first, [tmp_path / "missing"])
