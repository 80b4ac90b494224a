"""Common random numbers: a (task, sample) sends the same request seeds at every stage, so two
stages' rollouts pair up; the seed ignores the attempt, the run id and the rollout order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchard.domains.swe.family import settings_family
from orchard.domains.swe.harness import MiniSweAgentHarness
from orchard.domains.swe.minisweagent import config_from_specs
from orchard.domains.swe.model import SweTask
from orchard.env.client import SandboxClient, TransportError
from orchard.eval import RunConfig, evaluate
from orchard.eval.harness import HarnessResult, RolloutContext
from orchard.eval.runner import Runner
from orchard.recipes.demo import COMPACT_CONFIG
from orchard.recipes.models import tiny_llama
from orchard.recipes.policy_server.server import PolicyServer
from orchard.recipes.trajectories import load_trajectories
from orchard.rollout.agents.tool_loop import run_tool_loop
from orchard.rollout.seeds import SEED_BITS, call_seed, rollout_seed, stable_seed
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
from tests.conftest import needs_root


def test_a_rollout_seed_depends_on_the_seed_task_and_sample_only() -> None:
    seed = rollout_seed(7, "task-a", 0)
    assert seed == rollout_seed(7, "task-a", 0)
    others = {rollout_seed(7, "task-a", 1), rollout_seed(7, "task-b", 0),
              rollout_seed(8, "task-a", 0)}
    assert seed not in others and len(others) == 3
    assert all(0 <= s < 2 ** SEED_BITS for s in (seed, *others))
    # Parts keep their types and boundaries: ("a1", 2) is not ("a", 12), 1 is not "1".
    assert stable_seed("a1", 2) != stable_seed("a", 12)
    assert stable_seed(1) != stable_seed("1")


def test_a_rollout_seed_is_the_same_in_another_process() -> None:
    # hash() is salted per process; the seed must not be.
    code = ("from orchard.rollout.seeds import rollout_seed; "
            "print(rollout_seed(7, 'task-a', 3))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONHASHSEED": "123"})
    assert int(out.stdout) == rollout_seed(7, "task-a", 3)


def test_each_call_of_a_rollout_gets_its_own_seed() -> None:
    seed = rollout_seed(7, "task-a", 0)
    seeds = [call_seed(seed, i) for i in range(20)]
    assert len(set(seeds)) == 20
    assert seeds == [call_seed(seed, i) for i in range(20)]
    assert call_seed(rollout_seed(7, "task-a", 1), 0) != seeds[0]


def test_the_tool_loop_sends_each_call_its_seed() -> None:
    bodies: list[dict] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        name = "look" if len(bodies) < 3 else "finish"
        call = {"id": f"c{len(bodies)}", "type": "function",
                "function": {"name": name, "arguments": "{}"}}
        return httpx.Response(200, json={"choices": [{"message": {
            "role": "assistant", "content": None, "tool_calls": [call]}}]})

    tools = [{"type": "function", "function": {"name": "look", "parameters": {}}}]
    seed = rollout_seed(3, "web-1", 0)
    with httpx.Client(transport=httpx.MockTransport(answer)) as http:
        result = run_tool_loop("http://model/v1", "m", [{"role": "user", "content": "go"}],
                               tools, lambda call, name, args: [], http=http, seed=seed)
        assert result.exit_status == "Submitted"
        assert [b["seed"] for b in bodies] == [call_seed(seed, i) for i in range(3)]
        bodies.clear()
        run_tool_loop("http://model/v1", "m", [{"role": "user", "content": "go"}], tools,
                      lambda call, name, args: [], http=http)
    assert bodies and all("seed" not in b for b in bodies)


class _SeedRecorder:
    """A harness that records each attempt's seed; a rollout's first attempt fails as an
    environment failure, so the runner retries it."""

    name = "seed-recorder"
    model_upstream = None

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, int | None]] = []

    def run(self, ctx: RolloutContext) -> HarnessResult:
        instance, sample, attempt = ctx.rollout_id.split(".")[1:]
        self.seen.append((f"{instance}.{sample}", int(attempt), ctx.seed))
        if attempt == "1":
            raise TransportError("the orchestrator went away (a test's environment failure)")
        return HarnessResult(exit_status="Submitted")


@pytest.fixture(scope="module")
def client(orchestrator: str) -> Iterator[SandboxClient]:
    with SandboxClient(orchestrator) as c:
        yield c


@pytest.fixture(scope="module")
def tasks() -> list[SweTask]:
    return settings_family(n_train=2, n_test=0, seed=3)


@needs_root
def test_the_runner_seeds_a_rollout_the_same_in_every_run_and_attempt(
        client: SandboxClient, tasks: list[SweTask], tmp_path: Path) -> None:
    def seeds(out: Path, sampling_seed: int | None) -> dict[str, set[int | None]]:
        harness = _SeedRecorder()
        Runner(RunConfig(out=out, n=2, grade=False, sampling_seed=sampling_seed), tasks,
               harness, client).run()
        assert {attempt for _, attempt, _ in harness.seen} == {1, 2}
        by_rollout: dict[str, set[int | None]] = {}
        for key, _, seed in harness.seen:
            by_rollout.setdefault(key, set()).add(seed)
        return by_rollout

    first, second = seeds(tmp_path / "a", 5), seeds(tmp_path / "b", 5)
    assert first == second  # two runs (two run ids), each rollout tried twice
    assert all(len(s) == 1 for s in first.values())  # the retry kept the seed
    assert {next(iter(s)) for s in first.values()} == {
        rollout_seed(5, t.instance_id, k) for t in tasks for k in range(2)}
    assert all(s == {None} for s in seeds(tmp_path / "c", None).values())


def _completions(out: Path) -> dict[tuple[str, int], list[list[int]]]:
    """Each rollout's completion token ids, call by call, keyed by (task, sample)."""
    found = {}
    for traj in load_trajectories(out):
        calls = traj.trace().model_calls
        assert calls and all(c["tokens"] for c in calls)
        found[traj.instance_id, traj.metadata["sample"]] = [
            c["tokens"]["completion_ids"] for c in calls]
    return found


@needs_root
def test_same_seed_same_tokens_at_two_stages(client: SandboxClient, tasks: list[SweTask],
                                             tmp_path: Path) -> None:
    """Two evaluations through the real harness, proxy and policy server, whose own seed
    differs, with two rollouts at a time (so calls arrive in another order and batch with
    others): with the same sampling seed each (task, sample) draws the same tokens."""
    tokenizer = load_tokenizer(TEST_TOKENIZER)
    config = config_from_specs([COMPACT_CONFIG])

    def stage(name: str, server_seed: int, sampling_seed: int) -> dict:
        model = tiny_llama(tokenizer, hidden_size=64, layers=2, max_positions=4096, seed=0)
        with PolicyServer(model, tokenizer, seed=server_seed) as server:
            harness = MiniSweAgentHarness(server.url, "policy", config=config,
                                          render_with=TEST_TOKENIZER)
            out = tmp_path / name
            evaluate(tasks, harness, out, client,
                     config=RunConfig(out=out, n=2, concurrency=2, grade=False,
                                      sampling_seed=sampling_seed))
        return _completions(out)

    base, later = stage("base", 0, 11), stage("later", 1, 11)
    assert len(base) == 4 and base == later
    # The samples of a task differ from each other, and another sampling seed draws others.
    assert base[tasks[0].instance_id, 0] != base[tasks[0].instance_id, 1]
    other = stage("other", 0, 12)
    assert other.keys() == base.keys()
    assert all(other[k][0] != base[k][0] for k in base)
