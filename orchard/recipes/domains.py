"""What the demo pipeline needs to know of a task domain: the ``DemoDomain`` protocol.

The pipeline (``demo.py``) is the same everywhere: teacher rollouts, Monte-Carlo values of the
failed ones, SFT, BAR RL, held-out evaluation, reranking. A domain says where its tasks come
from, which harnesses play the teacher and the policy, how a Monte-Carlo continuation carries
on a recorded rollout, and what a value model reads of a rollout. Each domain's adapter lives
with it (``orchard.domains.<name>.demo``); ``orchard.domains.demo_domain`` finds one by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from orchard.env.client import SandboxClient
from orchard.eval.harness import Harness
from orchard.recipes.montecarlo import Continuation
from orchard.testing.policies import Policy

if TYPE_CHECKING:
    from orchard.recipes.demo import DemoConfig

NO_RUBRICS = ("a rubric judge scores assistant tasks; the {domain} domain has no rubrics: drop "
              "the judge or use the assistant domain")


class DemoDomain(Protocol):
    name: str
    text_of: Literal["patch", "trajectory"]
    """What a value model reads of a rollout."""
    replays: bool
    """Monte-Carlo states are replayed for each continuation instead of forked once (forks
    of a served domain are live: they keep its processes)."""

    def configure(self, config: DemoConfig) -> DemoConfig:
        """``config`` with the settings this domain's demo was measured with."""
        ...

    def tasks(self, n_train: int, n_test: int, seed: int) -> list[Any]: ...

    def teacher(self, train: Sequence[Any], solve: float) -> Harness: ...

    def policy(self, url: str, model: str, tokenizer_dir: str | Path) -> Harness: ...

    def continuation_policy(self, train: Sequence[Any], solve: float, seed: int
                            ) -> Policy: ...

    def continuation(self, client: SandboxClient, url: str, model: str) -> Continuation: ...

    def values_judge(self, train: Sequence[Any]) -> Policy:
        """A scripted retrospective judge of the training tasks' rollouts, served like a
        model (``values_judge_url="scripted"``); a ValueError where the domain has none."""
        ...

    def scripted_judge(self) -> Policy:
        """A scripted rubric judge (``judge="scripted"``); a ValueError without rubrics."""
        ...

    def judged(self, url: str, model: str) -> DemoDomain:
        """This domain with its policy's rollouts scored by the rubric judge ``model`` at
        ``url``; a ValueError without rubrics."""
        ...
