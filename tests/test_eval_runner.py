"""The rollout runner end to end: the scripted teacher through mini-swe-agent on the bundled
tasks, kill -9 and resume, heartbeat reaping, retries, failure classes, reports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from orchard.domains.swe import RepoSource, SweTask, file_diff, load_tasks
from orchard.domains.swe.harness import (
    MiniSweAgentHarness,
    OracleHarness,
    TeacherHarness,
)
from orchard.env.client import ConnectError, SandboxClient
from orchard.eval import HarnessResult, RolloutContext, RunConfig, evaluate, read_results
from orchard.eval.runner import RUN_LABEL
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
from orchard.testing.teacher import ScriptedPolicy, TeacherServer
from tests.conftest import dedicated_orchestrator, needs_root, wait_until

pytestmark = needs_root

ORCHARD = Path(sys.executable).with_name("orchard")


def cli_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k not in ("ORCHARD_URL", "ORCHARD_API_KEY", "COLUMNS", "LINES")}


@pytest.fixture(scope="module")
def client(orchestrator: str) -> Iterator[SandboxClient]:
    with SandboxClient(orchestrator) as c:
        yield c


@pytest.fixture(scope="module")
def bundled() -> list[SweTask]:
    return load_tasks("bundled")


@pytest.fixture(scope="module")
def teacher_run(client: SandboxClient, bundled: list[SweTask],
                tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TeacherHarness, dict]:
    out = tmp_path_factory.mktemp("teacher-run")
    harness = TeacherHarness(bundled, solve=0.5)
    summary = evaluate(bundled, harness, out, client,
                       config=RunConfig(out=out, concurrency=2,
                                        settings={"harness": "teacher"}))
    return out, harness, summary


def test_the_resolved_rate_is_what_the_teachers_script_intends(
        teacher_run: tuple[Path, TeacherHarness, dict], bundled: list[SweTask],
        client: SandboxClient) -> None:
    out, harness, summary = teacher_run
    assert len(harness.solved) == round(len(bundled) / 2)
    results = read_results(out)
    assert len(results) == len(bundled)
    assert {r.instance_id for r in results if r.resolved} == harness.solved
    assert summary["overall"]["resolved_rate"] == len(harness.solved) / len(bundled)
    assert summary["overall"]["pass_at_k"] == {"1": len(harness.solved) / len(bundled)}
    for r in results:
        # mini-swe-agent submitted every time; the unsolved ones with an empty diff.
        assert (r.exit_status, r.failure, r.attempts) == ("Submitted", None, 1)
        assert r.grade is not None
        assert r.grade.outcome == ("resolved" if r.resolved else "empty_patch")
        assert r.reward == (1.0 if r.resolved else -1.0)
        assert r.n_steps == 2 and r.n_tokens > 0
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    assert client.list_sandboxes(labels={RUN_LABEL: run_id}) == []


def test_each_rollout_leaves_a_trace_joining_model_calls_and_sandbox_events(
        teacher_run: tuple[Path, TeacherHarness, dict]) -> None:
    out, harness, _ = teacher_run
    for r in read_results(out):
        assert r.trace is not None and r.model_calls == 2
        trace = json.loads((out / r.trace).read_text())
        assert trace["rollout_id"] == r.rollout_id
        assert trace["metadata"]["reward"] == r.reward
        kinds = [e["kind"] for e in trace["sandbox_events"]]
        assert kinds[0] == "created" and "exec" in kinds and kinds[-1] == "deleted"
        commands = " ".join(str(e["data"].get("argv") or e["data"].get("command"))
                            for e in trace["sandbox_events"] if e["kind"] == "exec")
        assert ("git apply" in commands) == (r.instance_id in harness.solved)
        sources = [s["source"] for s in trace["timeline"]]
        assert sources.count("model") == 2
        # Tokens come from the proxy's record of every call.
        assert r.n_tokens == sum(c["response"]["usage"]["total_tokens"]
                                 for c in trace["model_calls"]) > 0
    # The recording proxy kept the calls token-exact, per rollout session.
    assert len(list((out / "calls").glob("*.jsonl"))) == len(harness.tasks)


def test_results_files(teacher_run: tuple[Path, TeacherHarness, dict],
                       bundled: list[SweTask]) -> None:
    out, harness, _ = teacher_run
    saved = json.loads((out / "results.json").read_text())
    assert saved["run"]["harness"] == "teacher"
    assert set(saved["tasks"]) == {t.instance_id for t in bundled}
    for tid, t in saved["tasks"].items():
        assert t["resolved"] == (1 if tid in harness.solved else 0)
    rows = pq.read_table(out / "results.parquet").to_pylist()
    assert len(rows) == len(bundled)
    assert sum(r["resolved"] for r in rows) == len(harness.solved)
    assert {r["outcome"] for r in rows} == {"resolved", "empty_patch"}


def _eval_cli(url: str, out: Path, *extra: str) -> list[str]:
    return [str(ORCHARD), "eval", "--orchestrator", url, "--out", str(out), "--harness",
            "teacher", "--teacher-solve", "0.5", "--split", "train", "--concurrency", "2",
            *extra]


def test_kill_9_mid_run_then_resume_gives_the_same_table(
        orchestrator: str, client: SandboxClient, bundled: list[SweTask], tmp_path: Path) -> None:
    out = tmp_path / "run"
    train = [t for t in bundled if t.split == "train"]
    runner = subprocess.Popen(_eval_cli(orchestrator, out), env=cli_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_until(lambda: (out / "rollouts.jsonl").exists() and len(
            (out / "rollouts.jsonl").read_text().splitlines()) >= 3, timeout=120)
        runner.kill()
    finally:
        runner.kill()
        runner.wait(30)
    first = read_results(out)
    assert 3 <= len(first) < len(train), "the kill should land mid-run"

    done = subprocess.run(_eval_cli(orchestrator, out), env=cli_env(), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    # Plain progress lines (not a terminal), counting the rollouts done before the kill.
    assert f"{len(train) - len(first)} rollouts to run ({len(first)} of {len(train)}" \
        in done.stderr
    assert f"[{len(train)}/{len(train)}]" in done.stderr

    results = read_results(out)
    assert sorted(r.instance_id for r in results) == sorted(t.instance_id for t in train)
    # The rollouts finished before the kill were kept, not redone.
    kept = {r.rollout_id: r.ended_at for r in first}
    assert all(r.ended_at == kept[r.rollout_id] for r in results if r.rollout_id in kept)
    expected = TeacherHarness(train, solve=0.5).solved
    assert {r.instance_id for r in results if r.resolved} == expected
    saved = json.loads((out / "results.json").read_text())
    assert saved["overall"]["resolved_rate"] == len(expected) / len(train)
    assert "resolved" in done.stdout and str(len(expected)) in done.stdout
    run_id = saved["run"]["run_id"]
    assert client.list_sandboxes(labels={RUN_LABEL: run_id}) == []

    # A different run in the same directory is refused, naming it.
    other = subprocess.run([*_eval_cli(orchestrator, out), "--n", "2"], env=cli_env(),
                           capture_output=True, text=True, timeout=120)
    assert other.returncode == 2 and run_id in other.stderr and "--out" in other.stderr


def _slow_task(tmp_path: Path) -> Path:
    """A task whose set-up takes a while, so its rollout sandbox is alive when we kill."""
    task = SweTask(instance_id="slow-1", problem_statement="slow set-up",
                patch=file_diff("a.py", "x = 1\n", "x = 2\n"),
                test_patch=file_diff("test_a.py", None, "from a import x\n\n\n"
                                     "def test_x():\n    assert x == 2\n"),
                FAIL_TO_PASS=["test_a.py::test_x"],
                source=RepoSource(kind="files", files={"a.py": "x = 1\n"}),
                pre_commands=["sleep 120"])
    path = tmp_path / "tasks.jsonl"
    path.write_text(task.model_dump_json() + "\n")
    return path


def test_a_dead_runners_sandboxes_are_reaped_by_their_heartbeats(
        data_dir: Path, tmp_path: Path) -> None:
    with dedicated_orchestrator(data_dir, heartbeat_timeout=3) as url, \
            SandboxClient(url) as client:
        out = tmp_path / "run"
        runner = subprocess.Popen(
            [str(ORCHARD), "eval", "--orchestrator", url, "--out", str(out), "--tasks",
             str(_slow_task(tmp_path)), "--harness", "oracle", "--heartbeat-interval", "0.5"],
            env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            assert wait_until(lambda: (out / "run.json").exists(), timeout=60)
            run_id = json.loads((out / "run.json").read_text())["run_id"]
            owned = {RUN_LABEL: run_id}
            assert wait_until(lambda: client.list_sandboxes(labels=owned), timeout=60)
            # Alive and beating: not reaped while the runner lives, past the timeout.
            time.sleep(5)
            (info,) = client.list_sandboxes(labels=owned)
            assert info.status == "running" and info.last_heartbeat is not None
            assert info.session is not None and info.session.startswith(run_id)
            # The lifetime is the task's wall-time budget plus the grace period.
            ttl = (info.expires_at - info.created_at).total_seconds()
            assert 900 + 600 - 5 <= ttl <= 900 + 600 + 5
            os.kill(runner.pid, signal.SIGKILL)
        finally:
            runner.kill()
            runner.wait(30)
        assert wait_until(lambda: client.list_sandboxes(labels=owned) == [], timeout=30)


class FlakyEnvironment:
    """An oracle whose first attempts meet an environment failure, as when the orchestrator
    is unreachable; it records the resources each attempt was given."""

    name = "flaky"
    model_upstream = None

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.seen: list[tuple[str | None, str | None, str]] = []

    def run(self, ctx: RolloutContext) -> HarnessResult:
        self.seen.append((ctx.cpu, ctx.memory, ctx.rollout_id))
        if len(self.seen) <= self.failures:
            raise ConnectError("cannot reach the orchestrator (connection refused)")
        return OracleHarness().run(ctx)


def test_environment_failures_are_retried_with_more_resources(
        client: SandboxClient, bundled: list[SweTask], tmp_path: Path) -> None:
    task = bundled[0]
    harness = FlakyEnvironment(failures=1)
    summary = evaluate([task], harness, tmp_path / "a", client,
                       config=RunConfig(out=tmp_path / "a", max_attempts=3))
    (r,) = read_results(tmp_path / "a")
    assert (r.resolved, r.attempts, r.failure) == (True, 2, None)
    assert [(cpu, mem) for cpu, mem, _ in harness.seen] == [("1", str(2 << 30)),
                                                           ("2", str(4 << 30))]
    # Each attempt is its own session (trace), the last one kept.
    assert r.rollout_id == harness.seen[-1][2] and r.rollout_id.endswith(".2")
    assert summary["overall"]["failures"] == {}

    always = FlakyEnvironment(failures=99)
    summary = evaluate([task], always, tmp_path / "b", client,
                       config=RunConfig(out=tmp_path / "b", max_attempts=3))
    (r,) = read_results(tmp_path / "b")
    assert (r.resolved, r.reward, r.attempts, r.grade) == (False, -1.0, 3, None)
    assert r.failure is not None and r.failure.cls == "environment"
    assert "connection refused" in r.failure.message
    assert summary["overall"]["failures"] == {"environment": 1}


def test_model_failures_are_classified_and_never_retried(
        client: SandboxClient, bundled: list[SweTask], tmp_path: Path) -> None:
    policy = ScriptedPolicy([{"content": "ls", "tool_calls": [
        {"name": "bash", "arguments": {"command": "ls"}}]}] * 5)
    with TeacherServer(policy, load_tokenizer(TEST_TOKENIZER)) as teacher:
        teacher.fail_next(401, "invalid API key", times=10)
        harness = MiniSweAgentHarness(teacher.url, "teacher")
        summary = evaluate(bundled[:1], harness, tmp_path, client,
                           config=RunConfig(out=tmp_path, max_attempts=3))
    (r,) = read_results(tmp_path)
    assert r.failure is not None and r.failure.cls == "model" and r.attempts == 1
    assert "invalid API key" in r.failure.message
    assert (r.resolved, r.reward) == (False, -1.0)
    assert summary["overall"]["failures"] == {"model": 1}


def test_a_sandbox_that_cannot_start_is_retried_and_the_failure_says_why(
        client: SandboxClient, bundled: list[SweTask], tmp_path: Path) -> None:
    task = bundled[0].model_copy(update={"image": str(tmp_path / "no-such-image.tar")})
    evaluate([task], OracleHarness(), tmp_path, client,
             config=RunConfig(out=tmp_path, max_attempts=2))
    (r,) = read_results(tmp_path)
    assert r.failure is not None and (r.failure.cls, r.attempts) == ("environment", 2)
    assert "no-such-image.tar does not exist" in r.failure.message
    assert client.list_sandboxes(labels={RUN_LABEL: r.run_id}) == []


def test_report_compares_two_harnesses_and_draws_a_chart(
        orchestrator: str, teacher_run: tuple[Path, TeacherHarness, dict],
        bundled: list[SweTask], tmp_path: Path) -> None:
    teacher_dir, harness, _ = teacher_run
    oracle_dir = tmp_path / "oracle"
    done = subprocess.run([str(ORCHARD), "eval", "--orchestrator", orchestrator, "--out",
                           str(oracle_dir), "--harness", "oracle", "--no-per-task"],
                          env=cli_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert f"{len(bundled)} (100.0%)" in done.stdout
    chart = tmp_path / "cmp.png"
    r = subprocess.run([str(ORCHARD), "report", str(oracle_dir), str(teacher_dir), "--chart",
                        str(chart)], env={**cli_env(), "COLUMNS": "250"}, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "oracle [oracle]" in r.stdout and f"teacher [{teacher_dir.name}]" in r.stdout
    rate = 100 * len(harness.solved) / len(bundled)
    assert f"{rate:.1f}%" in r.stdout and "100.0%" in r.stdout
    for t in bundled:
        assert t.instance_id in r.stdout
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    missing = subprocess.run([str(ORCHARD), "report", str(tmp_path / "nope")], env=cli_env(),
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "results.json" in missing.stderr


def test_validate_cli_catches_a_broken_task(orchestrator: str, bundled: list[SweTask],
                                            tmp_path: Path) -> None:
    good = bundled[0]
    broken = good.model_copy(update={"instance_id": "broken-1", "patch": file_diff(
        "README.md", None, "a patch that fixes nothing\n")})
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(t.model_dump_json() + "\n" for t in (good, broken)))
    r = subprocess.run([str(ORCHARD), "tasks", "validate", str(path), "--orchestrator",
                        orchestrator], env=cli_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1
    assert f"ok {good.instance_id}" in r.stderr
    assert "BROKEN broken-1" in r.stderr and "gold patch does not resolve" in r.stderr
    assert "1/2 tasks valid; broken: broken-1" in r.stderr
    r = subprocess.run([str(ORCHARD), "tasks", "validate", str(path), "--orchestrator",
                        orchestrator, "--json", "--task", good.instance_id], env=cli_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0
    (check,) = json.loads(r.stdout)
    assert check["ok"] and check["gold"]["resolved"] and not check["empty"]["resolved"]
