"""On-policy distillation: per-token advantages from a teacher's log-probs on the student's own
tokens pull the student towards the teacher (the reverse KL on fresh samples falls), and the
recipe's loop runs on real rollouts through the policy server and the recording proxy."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from orchard.domains.swe.family import settings_family
from orchard.domains.swe.harness import MiniSweAgentHarness
from orchard.domains.swe.minisweagent import config_from_specs
from orchard.env.client import SandboxClient
from orchard.recipes.demo import COMPACT_CONFIG
from orchard.recipes.distill import (
    distill_pairs,
    distill_step,
    reverse_kl,
    teacher_logprobs,
    train_distill,
)
from orchard.recipes.models import tiny_llama
from orchard.recipes.policy_server.batching import Job, generate
from orchard.recipes.policy_server.server import PolicyServer
from orchard.recipes.rl import RLConfig
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
from orchard.rollout.traces.samples import Sample
from tests.conftest import needs_root

TOK = load_tokenizer(TEST_TOKENIZER)


@pytest.fixture(scope="module")
def client(orchestrator: str) -> Iterator[SandboxClient]:
    with SandboxClient(orchestrator) as c:
        yield c
SAMPLING = SimpleNamespace(temperature=1.0, top_p=None, top_k=None, logprobs=None)


class Sharpened(torch.nn.Module):
    """A frozen model at temperature 1/k: a teacher the student can reach."""

    def __init__(self, model: torch.nn.Module, k: float) -> None:
        super().__init__()
        self.model, self.k = model, k

    def forward(self, **kwargs: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=self.model(**kwargs).logits * self.k)


def student_samples(student: torch.nn.Module, seed: int, n: int = 16) -> list[Sample]:
    prompts = [list(range(20 + i, 40 + i)) for i in range(n)]
    jobs = [Job(p, 24, set(), None, SAMPLING, seed * 1000 + i) for i, p in enumerate(prompts)]
    return [Sample(f"s{i}", [], p + g.ids, [0] * len(p) + [1] * len(g.ids),
                   [None] * len(p) + g.logprobs)
            for i, (p, g) in enumerate(zip(prompts, generate(student.eval(), jobs, 0),
                                           strict=True))]


def held_out_kl(student: torch.nn.Module, teacher: torch.nn.Module) -> float:
    samples = student_samples(student, seed=999, n=32)
    return reverse_kl(distill_pairs(samples, teacher_logprobs(teacher, samples)))


def test_the_student_moves_towards_the_teacher() -> None:
    torch.manual_seed(0)
    student = tiny_llama(TOK, hidden_size=64, seed=0)
    with torch.no_grad():  # logits of some size, so that sharpening them matters
        student.get_input_embeddings().weight.mul_(4)
    teacher = Sharpened(copy.deepcopy(student), 2.0)
    before = held_out_kl(student, teacher)
    optimizer = torch.optim.AdamW(student.parameters(), lr=3e-3, weight_decay=0.0)
    config = RLConfig(ppo_epochs=2, minibatches=1)
    steps = [distill_step(student, teacher, optimizer, student_samples(student, step), config)
             for step in range(15)]
    after = held_out_kl(student, teacher)
    assert before > 0.5 and after < 0.75 * before, (before, after)
    assert all(s["tokens"] == 16 * 24 for s in steps)


def test_advantages_are_per_token_and_only_on_the_students_tokens() -> None:
    sample = Sample("s", [], [5, 6, 7, 8], [0, 0, 1, 1], [None, None, -1.0, -2.0])
    ((_, advantages),) = distill_pairs([sample], [[None, -9.0, -0.5, -3.0]])
    assert advantages == [0.0, 0.0, 0.5, -1.0]
    assert reverse_kl([(sample, advantages)]) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="3 teacher log-probs for 4 tokens"):
        distill_pairs([sample], [[None, -1.0, -1.0]])


@needs_root
def test_the_recipe_runs_on_real_rollouts(client: SandboxClient, tmp_path: Path) -> None:
    student = tiny_llama(TOK, hidden_size=64, seed=0)
    teacher = Sharpened(copy.deepcopy(student), 2.0)
    tasks = settings_family(n_train=2, n_test=0, seed=5)
    config = config_from_specs([COMPACT_CONFIG])
    with PolicyServer(copy.deepcopy(student), TOK) as server:
        harness = MiniSweAgentHarness(server.url or "", server.engine.model_name,
                                      config=config, render_with=TEST_TOKENIZER)
        history = train_distill(student, teacher, tasks, client, server, harness,
                                tmp_path, RLConfig(steps=2, ppo_epochs=1, minibatches=1),
                                rollouts_per_step=2)
    assert [r["step"] for r in history] == [0, 1]
    assert all(r["rollouts"] == 2 and r["samples"] >= 2 for r in history)
    assert all(r["tokens"] > 0 and r["reverse_kl"] > 0 for r in history)
    assert history[-1]["weights_version"] == 2  # the server got each step's weights
    assert (tmp_path / "distill.jsonl").read_text().count("\n") == 2
    assert client.list_sandboxes() == []
