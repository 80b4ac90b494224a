"""Sample building from recorded calls, and the session log's durability rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard.rollout.proxy.recorder import BadSession, SessionStore
from orchard.rollout.traces.samples import build_samples


def call(index: int, prompt: list[int], completion: list[int],
         logprobs: list[float] | None = None) -> dict:
    return {"index": index, "tokens": {"prompt_ids": prompt, "completion_ids": completion,
                                       "completion_logprobs": logprobs}}


def test_continuous_turns_make_one_sample_with_only_completions_trained() -> None:
    calls = [call(0, [1, 2], [3, 4], [-0.1, -0.2]),
             call(1, [1, 2, 3, 4, 5, 6], [7], [-0.3])]  # 5, 6: the tool result
    samples, drifts = build_samples("s", calls)
    assert drifts == [] and len(samples) == 1
    s = samples[0]
    assert s.input_ids == [1, 2, 3, 4, 5, 6, 7]
    assert s.loss_mask == [0, 0, 1, 1, 0, 0, 1]
    assert s.logprobs == [None, None, -0.1, -0.2, None, None, -0.3]
    assert s.calls == [0, 1]


def test_drift_splits_the_sample_and_says_where() -> None:
    # Turn 1 re-rendered turn 0's completion (4 became 9): joining would train on a token
    # the model never produced.
    calls = [call(0, [1, 2], [3, 4]), call(1, [1, 2, 3, 9, 5], [6]), call(2, [1, 2, 3, 9, 5, 6, 7],
                                                                          [8])]
    samples, drifts = build_samples("s", calls)
    assert [s.calls for s in samples] == [[0], [1, 2]]
    assert len(drifts) == 1 and (drifts[0].call, drifts[0].previous, drifts[0].position) == (
        1, 0, 3)
    assert samples[1].input_ids == [1, 2, 3, 9, 5, 6, 7, 8]
    assert samples[1].loss_mask == [0, 0, 0, 0, 0, 1, 0, 1]


def test_calls_without_tokens_or_with_errors_are_skipped() -> None:
    calls = [{"index": 0, "tokens": None}, {**call(1, [1], [2]), "error": "boom"},
             call(2, [1], [3])]
    samples, drifts = build_samples("s", calls)
    assert [s.calls for s in samples] == [[2]] and drifts == []


def test_session_log_survives_a_torn_last_line(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    store.append("run-1.a", {"x": 1})
    with open(tmp_path / "run-1.a.jsonl", "a") as f:
        f.write('{"x": 2, "trunc')  # a crash mid-write
    assert [c["x"] for c in store.read("run-1.a") or []] == [1]
    reopened = SessionStore(tmp_path)
    assert reopened.append("run-1.a", {"x": 3})["index"] == 1
    assert [c["x"] for c in reopened.read("run-1.a") or []] == [1, 3]  # not glued to the tear
    assert reopened.sessions() == ["run-1.a"]
    assert reopened.read("nobody") is None


@pytest.mark.parametrize("bad", ["", "../etc", "a/b", ".hidden", "x" * 200])
def test_session_ids_that_cannot_name_a_file_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(BadSession, match="must be 1-128 characters"):
        SessionStore(tmp_path).append(bad, {})
