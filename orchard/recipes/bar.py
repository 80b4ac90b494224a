"""Balanced Adaptive Rollout (BAR): how many rollouts to spend on a prompt, and which N of them
form its GRPO group.

Rollouts come in rounds of ``stride``; after each round the pool is tried for a group of N with
a positive share in [rho_min, rho_max] and, as soon as one assembles, sampling stops (early
stop). When the budget ``n_max`` is spent the share constraint is dropped (relaxed), and when
even that fails the N best rollouts by status make the group (best effort). A group filter then
drops groups that carry no learning signal, and further prompts refill the batch.

    result = bar_group(lambda k: [run(prompt) for _ in range(k)], BARConfig.paper())
    advantages = grpo_advantages([r.reward for r in result.group])

Pure Python, so the schedule can be tested exhaustively and used by any trainer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

STATUSES = ("completed", "truncated", "time_exceeded", "aborted")
"""How a rollout ended, best first: the order groups are assembled in."""
_RANK = {status: rank for rank, status in enumerate(STATUSES)}

# rho * N is float arithmetic (0.07 * 100 == 7.000000000000001, (0.15 + 0.95) / 2 * 10 ==
# 5.499999999999999): values this close to an integer (or half) count as it, so the bounds and
# n* are the ones the decimal settings mean.
_EPS = 1e-9

P = TypeVar("P")


@dataclass
class Rollout:
    reward: float | None
    """None when the rollout was never graded."""
    status: str = "completed"
    payload: Any = None
    """Whatever the trainer needs back (samples, trajectory); BAR never looks at it."""
    success: bool | None = None
    """Whether the task was solved, where that is not ``reward > 0``: a rubric reward
    (base + 0.5 J) is positive for an unsolved rollout the judge liked. None: reward > 0."""

    @property
    def positive(self) -> bool:
        return self.success if self.success is not None else (self.reward or 0.0) > 0

    def __post_init__(self) -> None:
        if self.status not in _RANK:
            raise ValueError(f"unknown rollout status {self.status!r}: use one of {STATUSES}")

    @property
    def usable(self) -> bool:
        """Graded, and ended in a way whose reward means something."""
        return self.reward is not None and self.status not in ("aborted", "time_exceeded")


@dataclass(frozen=True)
class BARConfig:
    """Defaults are the published script's (N=4, Nmax=8, stride 8, rho in [0.25, 0.75]);
    ``BARConfig.paper()`` gives the paper's."""

    n: int = 4
    """Group size N."""
    n_max: int = 8
    """Rollout budget per prompt."""
    stride: int = 8
    """Rollouts added per round; divides n_max."""
    rho_min: float = 0.25
    rho_max: float = 0.75
    """Bounds of the positive share of a balanced group."""

    def __post_init__(self) -> None:
        if self.n < 1 or self.stride < 1:
            raise ValueError(f"BARConfig needs n >= 1 and stride >= 1, got n={self.n}, "
                             f"stride={self.stride}")
        if self.n > self.n_max:
            raise ValueError(f"BARConfig n={self.n} exceeds the budget n_max={self.n_max}: "
                             "a group cannot be larger than the pool")
        if self.n_max % self.stride:
            raise ValueError(f"BARConfig stride={self.stride} must divide n_max={self.n_max}")
        _split_candidates(self.n, self.rho_min, self.rho_max)  # raises on an empty range

    @classmethod
    def paper(cls) -> BARConfig:
        """The paper's setting: N=8, Nmax=16, stride 16, rho in [0.375, 0.625]."""
        return cls(n=8, n_max=16, stride=16, rho_min=0.375, rho_max=0.625)


@dataclass
class GroupResult:
    group: list[Rollout]
    pool: list[Rollout]
    """Every rollout sampled for the prompt, in sampling order."""
    mode: Literal["balanced", "relaxed", "best_effort"]
    rounds: int
    """How many times ``sample`` was called."""


def _split_candidates(n: int, rho_min: float, rho_max: float) -> list[int]:
    """Positive counts n+ allowed by the share bounds, in the order assemble tries them: nearest
    to n* = round((rho_min + rho_max) / 2 * N) first, the smaller of two equally near.

    n* rounds half up (floor(x + 0.5)), not half to even as Python's round() does, so that
    e.g. N=5, rho in [0, 1] aims at 3 positives, not 2. n* always lies in the range, and the
    splits a pool can fill form an interval, so the tie rule fixes the order of the attempts
    but never changes which split wins."""
    if not 0 <= rho_min <= rho_max <= 1:
        raise ValueError(f"need 0 <= rho_min <= rho_max <= 1, got rho_min={rho_min}, "
                         f"rho_max={rho_max}")
    low = math.ceil(rho_min * n - _EPS)
    high = math.floor(rho_max * n + _EPS)
    if low > high:
        raise ValueError(f"no whole number of positives lies in [{rho_min} * {n}, {rho_max} * {n}]"
                         ": widen [rho_min, rho_max] or change N")
    target = math.floor((rho_min + rho_max) / 2 * n + 0.5 + _EPS)
    return sorted(range(low, high + 1), key=lambda k: (abs(k - target), k))


def _by_status(rollouts: Iterable[Rollout]) -> list[Rollout]:
    return sorted(rollouts, key=lambda r: _RANK[r.status])  # stable: pool order within a status


def assemble(pool: Sequence[Rollout], n: int, rho_min: float, rho_max: float,
             ) -> list[Rollout] | None:
    """A group of ``n`` usable rollouts from ``pool`` with n+ positives (solved ones), n+ in
    [ceil(rho_min n), floor(rho_max n)], or None when the pool has no such group.

    The n+ nearest the middle of the range that the pool can fill wins; within positives and
    negatives the best statuses come first, pool order breaking ties. The group lists its
    positives, then its negatives."""
    if n < 1:
        raise ValueError(f"group size must be >= 1, got {n}")
    usable = [r for r in pool if r.usable]
    positives = _by_status(r for r in usable if r.positive)
    negatives = _by_status(r for r in usable if not r.positive)
    for n_pos in _split_candidates(n, rho_min, rho_max):
        if len(positives) >= n_pos and len(negatives) >= n - n_pos:
            return positives[:n_pos] + negatives[:n - n_pos]
    return None


def _best_effort_key(rollout: Rollout) -> tuple[int, bool, float]:
    # Status first (the spec's order); within a status graded before ungraded and higher
    # rewards first, so that the group keeps whatever reward spread the pool has.
    reward = rollout.reward
    return _RANK[rollout.status], reward is None, -reward if reward is not None else 0.0


def bar_group(sample: Callable[[int], Sequence[Rollout]], config: BARConfig) -> GroupResult:
    """Sample rollouts for one prompt until a balanced group assembles or the budget is spent.

    ``sample(k)`` must return k new rollouts (with rewards) of the prompt; it is called with
    ``config.stride`` up to n_max / stride times."""
    pool: list[Rollout] = []
    rounds = 0
    for _ in range(config.n_max // config.stride):
        new = list(sample(config.stride))
        rounds += 1
        if len(new) != config.stride:
            raise ValueError(f"sample({config.stride}) returned {len(new)} rollouts: it must "
                             f"return exactly {config.stride}")
        if not all(isinstance(r, Rollout) for r in new):
            raise TypeError("sample(k) must return Rollout objects")
        pool += new
        group = assemble(pool, config.n, config.rho_min, config.rho_max)
        if group is not None:
            return GroupResult(group, pool, "balanced", rounds)
    group = assemble(pool, config.n, 0.0, 1.0)
    if group is not None:
        return GroupResult(group, pool, "relaxed", rounds)
    return GroupResult(sorted(pool, key=_best_effort_key)[:config.n], pool, "best_effort", rounds)


def filter_group(group: Sequence[Rollout]) -> str | None:
    """Why the group should be dropped, or None to keep it.

    Reasons, checked in this order: "aborted" (a sample was aborted), "missing_reward" (a
    sample has no reward, so no advantage can be computed: only best-effort groups have one),
    "zero_spread" (all rewards equal: every advantage is zero), "no_positive" (nothing
    solved)."""
    if not group:
        raise ValueError("cannot filter an empty group")
    if any(r.status == "aborted" for r in group):
        return "aborted"
    rewards = [r.reward for r in group]
    if any(reward is None for reward in rewards):
        return "missing_reward"
    if max(rewards) == min(rewards):
        return "zero_spread"
    if not any(r.positive for r in group):
        return "no_positive"
    return None


def fill_batch(
    prompts: Iterable[P],
    make_group: Callable[[P], Sequence[Rollout]],
    batch_size: int,
    filter: Callable[[Sequence[Rollout]], str | None] = filter_group,
) -> tuple[list[tuple[P, list[Rollout]]], list[tuple[P, str]]]:
    """Build groups for ``prompts`` in order until ``batch_size`` of them pass ``filter``.

    ``prompts`` should hold more prompts than the batch needs (over-sampling): each dropped
    group is replaced by the next prompt's. Prompts are consumed lazily, none after the batch
    is full. Returns (kept (prompt, group) pairs, dropped (prompt, reason) pairs); the kept
    list is shorter than batch_size only when the prompts ran out."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    kept: list[tuple[P, list[Rollout]]] = []
    dropped: list[tuple[P, str]] = []
    for prompt in prompts:
        group = list(make_group(prompt))
        reason = filter(group)
        if reason is None:
            kept.append((prompt, group))
            if len(kept) == batch_size:
                break
        else:
            dropped.append((prompt, reason))
    return kept, dropped


def grpo_advantages(rewards: Sequence[float]) -> list[float]:
    """A_i = (r_i - mean) / (std + 1e-6), the same for every response token of rollout i.

    std is the population std (divide by N, not N - 1). GRPO implementations differ here; the
    group is the whole set being normalised, not a sample of a larger one, and the population
    std makes the advantages of any group with spread have std ~1 whatever N is (with N - 1,
    a +1/-1 pair would get +-0.71). Sums are exact (math.fsum), so the result does not depend
    on the order of the rewards; equal rewards give exactly zero."""
    if not rewards:
        raise ValueError("cannot compute advantages of an empty group")
    if max(rewards) == min(rewards):
        return [0.0] * len(rewards)
    mean = math.fsum(rewards) / len(rewards)
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / len(rewards))
    return [(r - mean) / (std + 1e-6) for r in rewards]
