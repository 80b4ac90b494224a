"""Value-model reranking on real candidates: per bundled task, the gold patch (resolved) among
wrong ones (the gold patch reversed, an empty patch, a patch of an unrelated file)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from orchard.domains.swe import SweTask, file_diff, load_tasks
from orchard.eval.results import Failure, RolloutResult, append_result
from orchard.recipes.models import save_policy, tiny_llama
from orchard.recipes.rerank import (
    OBSERVATION_CHARS,
    PATCH_HEADER,
    ValueModel,
    ValueModelConfig,
    action_likelihood,
    action_summary,
    best_of_n,
    candidate_text,
    known_fixes,
    likelihood_rerank,
    report_table,
    rerank_run,
    training_examples,
)
from orchard.recipes.sft import tokenize_conversation
from orchard.recipes.trajectories import Trajectory, from_result
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
from orchard.rollout.traces.trace import Trace

CONFIG = ValueModelConfig(max_tokens=256, lr=3e-3, epochs=12, batch_size=8, hidden_size=64,
                          layers=2)


def reversed_patch(patch: str) -> str:
    """The patch undone: + and - body lines swapped, hunk ranges too (headers stay)."""
    out = []
    for line in patch.splitlines(keepends=True):
        if line.startswith("@@"):
            line = re.sub(r"^@@ -(\S+) \+(\S+) @@", r"@@ -\2 +\1 @@", line)
        elif line.startswith("+") and not line.startswith("+++"):
            line = "-" + line[1:]
        elif line.startswith("-") and not line.startswith("---"):
            line = "+" + line[1:]
        out.append(line)
    return "".join(out)


def candidates(task: SweTask, position: int) -> list[RolloutResult]:
    """Four samples; the gold patch is sample 1 + position % 3, so never sample 0 (the pick
    of a model that scores all alike)."""
    wrong = [reversed_patch(task.patch), "",
             file_diff("CHANGELOG.md", None, "# Changelog\n\n- Fixed a bug.\n")]
    gold_at = 1 + position % 3
    patches = wrong[:gold_at - 1] + [task.patch] + wrong[gold_at - 1:]
    return [RolloutResult(run_id="r", rollout_id=f"r-{task.instance_id}-{i}",
                          instance_id=task.instance_id, sample=i, harness="test", patch=p,
                          resolved=i == gold_at, reward=1.0 if i == gold_at else -1.0)
            for i, p in enumerate(patches)]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: on a small shared machine more threads contend and spin (the
    results are the same, the time is not)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tasks() -> list[SweTask]:
    return load_tasks("bundled")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TEST_TOKENIZER)


@pytest.fixture(scope="module")
def split(tasks):
    train = {t.instance_id: candidates(t, i) for i, t in enumerate(tasks) if t.split == "train"}
    test = {t.instance_id: candidates(t, i) for i, t in enumerate(tasks) if t.split == "test"}
    assert train and test
    return train, test


def texts_of(tasks, by_task):
    by_id = {t.instance_id: t for t in tasks}
    return {tid: [candidate_text(by_id[tid], r) for r in rs] for tid, rs in by_task.items()}


@pytest.fixture(scope="module")
def trained(tasks, tokenizer, split):
    torch.manual_seed(0)
    model = ValueModel.tiny(tokenizer, CONFIG)
    train, _ = split
    texts = texts_of(tasks, train)
    examples = [(t, r.resolved) for tid, rs in train.items()
                for t, r in zip(texts[tid], rs, strict=True)]
    metrics = model.train(examples)
    return model, metrics


def rerank(model, tasks, by_task):
    texts = texts_of(tasks, by_task)
    return best_of_n(by_task, {tid: model.score(ts) for tid, ts in texts.items()})


def check_invariants(report, by_task):
    o = report["overall"]
    assert o["tasks"] == len(by_task) and o["n"] == 4
    for tid, t in report["tasks"].items():
        rs = by_task[tid]
        assert t["random"] == sum(r.resolved for r in rs) / len(rs)
        assert t["value"] == float(rs[t["pick"]].resolved)
        assert t["random"] <= t["oracle"] and t["value"] <= t["oracle"]
    for k in ("value", "random", "oracle"):
        assert 0.0 <= o[k] <= 1.0
    assert o["random"] <= o["oracle"] and o["value"] <= o["oracle"]


def test_training_loss_decreases(trained, split):
    _, metrics = trained
    losses = metrics["epoch_loss"]
    assert metrics["examples"] == 4 * len(split[0]) and metrics["resolved"] == len(split[0])
    assert len(losses) == CONFIG.epochs
    assert losses[-1] < 0.5 * losses[0]


def test_value_pick_beats_random_on_training_tasks(trained, tasks, split):
    model, _ = trained
    train, _ = split
    report = rerank(model, tasks, train)
    check_invariants(report, train)
    assert report["overall"]["random"] == 0.25 and report["overall"]["oracle"] == 1.0
    assert report["overall"]["value"] > 0.5


def test_held_out_report(trained, tasks, split):
    model, _ = trained
    _, test = split
    report = rerank(model, tasks, test)
    check_invariants(report, test)
    assert set(report["tasks"]) == set(test)
    table = report_table(report)
    assert table.row_count == len(test) + 1
    assert [c.header for c in table.columns][:3] == ["task", "resolved", "value pick"]


def test_save_load_round_trip(trained, tasks, split, tmp_path):
    model, _ = trained
    texts = [t for ts in texts_of(tasks, split[1]).values() for t in ts]
    loaded = ValueModel.load(model.save(tmp_path / "vm"))
    assert loaded.config == model.config
    assert loaded.score(texts) == model.score(texts)
    with pytest.raises(FileNotFoundError, match="from_pretrained"):
        ValueModel.load(tmp_path)


def test_from_pretrained_keeps_the_backbone(tokenizer, tmp_path):
    lm = tiny_llama(tokenizer, hidden_size=32, layers=1, seed=3)
    path = save_policy(lm, tokenizer, tmp_path / "lm")
    vm = ValueModel.from_pretrained(path, ValueModelConfig(max_tokens=64))
    backbone = vm.model.model.state_dict()
    for name, weight in lm.model.state_dict().items():
        assert torch.equal(backbone[name], weight), name
    scores = vm.score(["a short text", "another, longer text to score"])
    assert len(scores) == 2 and all(0.0 < s < 1.0 for s in scores)


def test_token_ids_keep_the_patch(tokenizer, tasks):
    task = tasks[0]
    result = candidates(task, 0)[1]
    patch_ids = tokenizer(PATCH_HEADER + result.patch.strip(), add_special_tokens=False)
    patch_ids = patch_ids["input_ids"]
    budget = 2 * len(patch_ids)  # the whole patch fits in 3/4 of it
    model = ValueModel.tiny(tokenizer, ValueModelConfig(max_tokens=budget))
    long_task = task.model_copy(update={"problem_statement": task.problem_statement * 20})
    ids = model.token_ids(candidate_text(long_task, result))
    assert len(ids) == budget
    assert ids[-len(patch_ids):] == patch_ids
    assert tokenizer.decode(ids).startswith("## Problem\n" + task.problem_statement[:20])
    # A patch alone longer than the budget keeps its head; a short text is left whole.
    huge = model.token_ids("ctx" + PATCH_HEADER + task.patch * 10)
    assert len(huge) == budget and tokenizer.decode(huge).startswith("ctx" + PATCH_HEADER)
    assert tokenizer.decode(model.token_ids("short text")) == "short text"
    # A special token spelled in a patch stays text, so it cannot end the pooled sequence.
    assert tokenizer.pad_token_id not in model.token_ids("x" + PATCH_HEADER + "+<|endoftext|>")


def result(tid: str, sample: int, resolved: bool) -> RolloutResult:
    return RolloutResult(run_id="r", rollout_id=f"{tid}-{sample}", instance_id=tid,
                         sample=sample, harness="test", resolved=resolved,
                         reward=1.0 if resolved else -1.0)


def test_best_of_n_math():
    by_task = {
        # Listed out of sample order: the tie between samples 2 and 0 goes to sample 0.
        "tie": [result("tie", 2, True), result("tie", 0, False), result("tie", 1, True)],
        "wrong": [result("wrong", 0, False), result("wrong", 1, False)],
        "right": [result("right", 0, True), result("right", 1, True), result("right", 2, True)],
        "mixed": [result("mixed", 0, False), result("mixed", 1, True), result("mixed", 2, False),
                  result("mixed", 3, False)],
    }
    scores = {"tie": [0.9, 0.9, 0.1], "wrong": [0.2, 0.7], "right": [0.1, 0.3, 0.2],
              "mixed": [0.1, 0.8, 0.3, 0.8]}
    report = best_of_n(by_task, scores)
    t = report["tasks"]
    assert (t["tie"]["pick"], t["tie"]["value"], t["tie"]["random"]) == (0, 0.0, 2 / 3)
    assert (t["wrong"]["value"], t["wrong"]["random"], t["wrong"]["oracle"]) == (0, 0, 0)
    assert (t["right"]["pick"], t["right"]["value"], t["right"]["random"]) == (1, 1, 1)
    assert (t["mixed"]["pick"], t["mixed"]["value"], t["mixed"]["random"]) == (1, 1.0, 0.25)
    o = report["overall"]
    assert o == {"value": 0.5, "random": (2 / 3 + 0 + 1 + 0.25) / 4, "oracle": 0.75, "n": 4,
                 "tasks": 4}


def patched(tid: str, sample: int, resolved: bool, line: str) -> RolloutResult:
    diff = f"--- a/config.py\n+++ b/config.py\n@@ -1 +1 @@\n-X = 1\n+{line}\n"
    return result(tid, sample, resolved).model_copy(update={"patch": diff})


def test_lookup_pick_remembers_training_fixes(tmp_path):
    # A resolved training patch added "X = 7"; a failed one added "X = 3".
    for row in (patched("t", 0, True, "X = 7"), patched("t", 1, False, "X = 3")):
        append_result(tmp_path, row)
    fixes = known_fixes([tmp_path])
    assert fixes == {"X = 7"}
    by_task = {
        # A held-out fix repeats the training one: the lookup finds it without reading.
        "repeat": [patched("repeat", 0, False, "X = 3"), patched("repeat", 1, True, "X = 7")],
        # A new fix: nothing matches, so the lookup is a random pick.
        "new": [patched("new", 0, False, "Y = 4"), patched("new", 1, True, "Y = 9"),
                patched("new", 2, False, "Y = 2")],
    }
    scores = {"repeat": [0.9, 0.1], "new": [0.1, 0.9, 0.5]}
    report = best_of_n(by_task, scores, fixes=fixes)
    assert report["tasks"]["repeat"]["lookup"] == 1.0
    assert report["tasks"]["new"]["lookup"] == pytest.approx(1 / 3)
    assert report["overall"]["lookup"] == pytest.approx((1 + 1 / 3) / 2)
    assert "lookup" not in best_of_n(by_task, scores)["overall"]
    assert "lookup" in [c.header for c in report_table(report).columns]


def test_best_of_n_rejects_bad_input():
    by_task = {"a": [result("a", 0, True), result("a", 1, False)]}
    with pytest.raises(ValueError, match="one score per candidate"):
        best_of_n(by_task, {"a": [0.5]})
    with pytest.raises(ValueError, match="no scores for task a"):
        best_of_n(by_task, {})
    with pytest.raises(ValueError, match="NaN"):
        best_of_n(by_task, {"a": [0.5, float("nan")]})
    with pytest.raises(ValueError, match="no tasks"):
        best_of_n({}, {})
    with pytest.raises(ValueError, match="text_of"):
        candidate_text(SweTask(instance_id="a", problem_statement="p", FAIL_TO_PASS=["t"]),
                       by_task["a"][0], text_of="diff")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="multiple of 16"):
        ValueModelConfig(hidden_size=40)


def bash_turn(command: str) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [{
        "id": "c", "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})}}]}


def test_observed_summary_keeps_the_tail_of_what_each_action_got_back():
    long = "\n".join(f"line {i}" for i in range(200)) + "\nFAILED test_a - should be 6"
    trajectory = Trajectory(
        rollout_id="r", instance_id="a", tools=[], resolved=False, reward=0.0,
        messages=[{"role": "user", "content": "fix it"}, bash_turn("pytest"),
                  {"role": "tool", "tool_call_id": "c", "content": long},
                  bash_turn("cat SPEC.md"), {"role": "tool", "tool_call_id": "c",
                                             "content": "- PORT: 8080"},
                  {"role": "assistant", "content": "Done."}])
    plain = action_summary(trajectory)
    assert plain.splitlines() == ['1. bash({"command": "pytest"})',
                                  '2. bash({"command": "cat SPEC.md"})', "3. Done."]
    lines = action_summary(trajectory, observations=OBSERVATION_CHARS).splitlines()
    assert lines[0] == '1. bash({"command": "pytest"})'
    first = lines[1:lines.index('2. bash({"command": "cat SPEC.md"})')]
    assert first[-1] == "   > FAILED test_a - should be 6" and "   > line 0" not in first
    assert sum(len(x) - len("   > ") for x in first) <= OBSERVATION_CHARS
    assert lines[-2:] == ["   > - PORT: 8080", "3. Done."]


def test_action_likelihood_is_the_mean_log_prob_of_the_assistant_turns(tokenizer):
    lm = tiny_llama(tokenizer, hidden_size=32, layers=1, seed=4)
    messages = [{"role": "user", "content": "fix PORT"}, bash_turn("cat SPEC.md"),
                {"role": "tool", "tool_call_id": "c", "content": "- PORT: 8080"},
                bash_turn("sed -i s/PORT.*/PORT=8080/ config.py"),
                {"role": "tool", "tool_call_id": "c", "content": "ok"}]

    def likelihood(msgs):
        return action_likelihood(lm, tokenizer, Trajectory(
            rollout_id="r", instance_id="a", messages=msgs, tools=[], resolved=False,
            reward=0.0))

    score = likelihood(messages)
    ids, mask, _ = tokenize_conversation(tokenizer, messages, None, [0, 1])
    with torch.no_grad():
        logits = lm(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    picked = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    wanted = torch.tensor(mask[1:], dtype=torch.bool)
    assert score == pytest.approx(picked[wanted].mean().item(), abs=1e-5)
    # The model reads forwards: what came back after the last action cannot change it, what
    # came back before an action does.
    assert likelihood(messages[:-1] + [{**messages[-1], "content": "failed"}]) == \
        pytest.approx(score, abs=1e-6)
    assert likelihood(messages[:2] + [{**messages[2], "content": "- PORT: 9090"}]
                      + messages[3:]) != pytest.approx(score, abs=1e-6)


def write_trace(run_dir, rollout_id: str, command: str) -> str:
    """A trace with one chat call whose reply runs ``command`` through a bash tool."""
    call = {"index": 0, "endpoint": "/v1/chat/completions", "status": 200,
            "request": {"model": "m", "tools": [],
                        "messages": [{"role": "user", "content": "fix it"}]},
            "response": {"choices": [{"message": {
                "role": "assistant", "content": "Looking.",
                "tool_calls": [{"id": "c1", "type": "function", "function": {
                    "name": "bash", "arguments": json.dumps({"command": command})}}]}}]}}
    name = f"traces/{rollout_id}.json"
    (run_dir / "traces").mkdir(exist_ok=True)
    (run_dir / name).write_text(Trace(rollout_id=rollout_id, model_calls=[call])
                                .model_dump_json())
    return name


def test_rerank_run_and_training_examples(trained, tasks, split, tmp_path):
    model, _ = trained
    _, test = split
    chosen = dict(list(test.items())[:3])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for rs in chosen.values():
        for r in rs:
            trace = write_trace(run_dir, r.rollout_id, f"sed -n 1,40p file{r.sample}.py")
            append_result(run_dir, r.model_copy(update={"trace": trace}))
    lost = result(next(iter(chosen)), 4, False).model_copy(
        update={"failure": Failure(cls="grading", type="E", message="grader sandbox died")})
    append_result(run_dir, lost)  # its outcome is unknown: neither candidate nor example

    by_id = {t.instance_id: t for t in tasks}
    first = chosen[next(iter(chosen))][0]
    text = candidate_text(by_id[first.instance_id], first.model_copy(
        update={"trace": f"traces/{first.rollout_id}.json"}), run_dir, text_of="both")
    assert '\n\n## Actions\n1. bash({"command": "sed -n 1,40p file0.py"})' + PATCH_HEADER in text
    # Nothing came back after its one action: the observed text says no more.
    assert candidate_text(by_id[first.instance_id], first.model_copy(
        update={"trace": f"traces/{first.rollout_id}.json"}), run_dir,
        text_of="observed") == text
    trajectory_only = candidate_text(by_id[first.instance_id], first, run_dir,
                                     text_of="trajectory")
    assert PATCH_HEADER not in trajectory_only and "## Actions" not in trajectory_only

    report = rerank_run(run_dir, tasks, model, text_of="both")
    check_invariants(report, chosen)
    assert report["run"] == {"run_dir": str(run_dir), "text_of": "both"}
    examples = training_examples([run_dir], tasks, text_of="both")
    assert len(examples) == 12 and sum(r for _, r in examples) == 3
    assert all("## Actions\n1. bash(" in t for t, _ in examples)
    expected = best_of_n(chosen, {tid: model.score([t for t, _ in examples[4 * i:4 * i + 4]])
                                  for i, tid in enumerate(chosen)})
    assert report["overall"] == expected["overall"]
    with pytest.raises(ValueError, match="not among the tasks given"):
        rerank_run(run_dir, tasks[:1], model)
    with pytest.raises(FileNotFoundError, match="no rollouts"):
        training_examples([tmp_path], tasks)

    lm, tokenizer = tiny_llama(model.tokenizer, hidden_size=32, layers=1, seed=5), model.tokenizer
    by_likelihood = likelihood_rerank(run_dir, tasks, lm, tokenizer)
    check_invariants(by_likelihood, chosen)
    for tid, rs in chosen.items():
        scores = [action_likelihood(lm, tokenizer, from_result(
            r.model_copy(update={"trace": f"traces/{r.rollout_id}.json"}), run_dir))
            for r in rs]
        assert len(set(scores)) == len(scores)  # each sample ran another command
        assert by_likelihood["tasks"][tid]["pick"] == scores.index(max(scores))
