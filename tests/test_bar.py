"""BAR group scheduling: assemble checked exhaustively against a brute-force reference, the
bar_group schedule (early stop, relaxed, best effort), the group filter, batch refill and the
GRPO advantages."""

from __future__ import annotations

import functools
import itertools
import math
import random
from collections.abc import Sequence
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchard.recipes.bar import (
    STATUSES,
    BARConfig,
    Rollout,
    assemble,
    bar_group,
    fill_batch,
    filter_group,
    grpo_advantages,
)

KINDS = [(reward, status) for reward in (1.0, -1.0, None) for status in STATUSES]

# (N, rho_min, rho_max) as exact decimals; both published settings first.
SETTINGS = [
    (4, "0.25", "0.75"),
    (8, "0.375", "0.625"),
    (4, "0", "1"),
    (8, "0", "1"),
    (5, "0", "1"),  # n* = 2.5 rounds half up to 3
    (5, "0.2", "0.6"),
    (6, "0.5", "0.5"),
    (7, "0.375", "0.625"),
    (10, "0.7", "0.7"),
    (10, "0.15", "0.95"),  # n* = 5.5 is 5.499999999999999 in floats
    (10, "0.3", "0.7"),
    (3, "0.1", "0.9"),
    (1, "0", "1"),
]


@functools.cache
def allowed_splits(n: int, rho_min: str, rho_max: str) -> tuple[list[int], int]:
    """Every n+ the bounds allow (exact decimal arithmetic) and the n* to be nearest to."""
    lo, hi = Fraction(rho_min), Fraction(rho_max)
    target = math.floor((lo + hi) / 2 * n + Fraction(1, 2))
    return [k for k in range(n + 1) if lo * n <= k <= hi * n], target


def reference_assemble(pool: Sequence[Rollout], n: int, rho_min: str, rho_max: str,
                       ) -> list[int] | None:
    """Pool indices of the group the spec asks for, by brute force over every split."""
    allowed, target = allowed_splits(n, rho_min, rho_max)
    usable = [i for i, r in enumerate(pool) if r.reward is not None
              and r.status in ("completed", "truncated")]
    # best status first, pool order within a status: one pass per status
    pos = [i for s in STATUSES for i in usable if pool[i].status == s and pool[i].reward > 0]
    neg = [i for s in STATUSES for i in usable if pool[i].status == s and pool[i].reward <= 0]
    feasible = [k for k in allowed if k <= len(pos) and n - k <= len(neg)]
    if not feasible:
        return None
    best = min(feasible, key=lambda k: (abs(k - target), k))
    return pos[:best] + neg[:n - best]


def make_pool(kinds: Sequence[tuple[float | None, str]]) -> list[Rollout]:
    return [Rollout(reward, status, payload=i) for i, (reward, status) in enumerate(kinds)]


def check_pool(kinds: Sequence[tuple[float | None, str]],
               settings: Sequence[tuple[int, str, str]] = SETTINGS) -> None:
    pool = make_pool(kinds)
    for n, rho_min, rho_max in settings:
        group = assemble(pool, n, float(rho_min), float(rho_max))
        expected = reference_assemble(pool, n, rho_min, rho_max)
        got = None if group is None else [r.payload for r in group]
        assert got == expected, (kinds, n, rho_min, rho_max)


def test_assemble_matches_reference_on_every_short_sequence() -> None:
    # every order of every composition up to 4 rollouts: pool order and status ties
    for size in range(5):
        for kinds in itertools.product(KINDS, repeat=size):
            check_pool(kinds)


def test_assemble_matches_reference_on_every_multiset() -> None:
    # every composition up to 8 rollouts, each in a seeded random order; all settings up to 6
    # rollouts, the published ones beyond (to keep the run short)
    rng = random.Random(0)
    count = 0
    for size in range(9):
        for kinds in itertools.combinations_with_replacement(KINDS, size):
            kinds = list(kinds)
            rng.shuffle(kinds)
            check_pool(kinds, SETTINGS if size <= 6 else SETTINGS[:2])
            count += 1
    assert count == math.comb(12 + 8, 8)


def test_assemble_matches_reference_on_large_pools() -> None:
    # up to 16 rollouts (a paper-sized pool) over the five classes assemble tells apart; the
    # unusable one cycles through every way of being unusable
    unusable = [k for k in KINDS if k[0] is None or k[1] in ("time_exceeded", "aborted")]
    classes = [(1.0, "completed"), (1.0, "truncated"), (-1.0, "completed"),
               (-1.0, "truncated"), None]
    rng = random.Random(1)
    for size in range(17):
        for combo in itertools.combinations_with_replacement(range(5), size):
            kinds = [classes[c] or unusable[i % len(unusable)] for i, c in enumerate(combo)]
            rng.shuffle(kinds)
            check_pool(kinds)


def test_assemble_prefers_the_split_nearest_the_middle() -> None:
    pos = [Rollout(1.0, payload=f"p{i}") for i in range(4)]
    neg = [Rollout(-1.0, payload=f"n{i}") for i in range(4)]
    # N=4, rho [0.25, 0.75]: n+ tried in order 2, 1, 3
    assert [r.payload for r in assemble(pos + neg, 4, 0.25, 0.75)] == ["p0", "p1", "n0", "n1"]
    assert [r.payload for r in assemble(pos[:1] + neg, 4, 0.25, 0.75)] == ["p0", "n0", "n1", "n2"]
    assert [r.payload for r in assemble(pos + neg[:1], 4, 0.25, 0.75)] == ["p0", "p1", "p2", "n0"]
    assert assemble(pos, 4, 0.25, 0.75) is None
    assert [r.payload for r in assemble(pos[:3] + neg[:1], 4, 0, 1)] == ["p0", "p1", "p2", "n0"]


def test_assemble_rounds_half_up_and_survives_float_arithmetic() -> None:
    def positives(group: list[Rollout] | None) -> int:
        assert group is not None
        return sum(r.reward > 0 for r in group)

    pos = [Rollout(1.0) for _ in range(100)]
    neg = [Rollout(-1.0) for _ in range(100)]
    assert positives(assemble(pos[:5] + neg[:5], 5, 0.0, 1.0)) == 3  # round(2.5) would give 2
    assert positives(assemble(pos[:10] + neg[:10], 10, 0.15, 0.95)) == 6  # n* = 5.5 -> 6
    # 0.07 * 100 and 0.57 * 100 are 7.000000000000001 and 56.99999999999999 in floats
    assert positives(assemble(pos[:7] + neg, 100, 0.07, 0.57)) == 7
    assert positives(assemble(pos[:57] + neg[:43], 100, 0.07, 0.57)) == 57
    assert assemble(pos[:6] + neg, 100, 0.07, 0.57) is None


def test_assemble_statuses_and_zero_reward() -> None:
    pool = [Rollout(1.0, "truncated", "pt"), Rollout(1.0, "completed", "pc"),
            Rollout(0.0, "completed", "zero"), Rollout(-1.0, "time_exceeded", "te"),
            Rollout(1.0, "aborted", "ab"), Rollout(None, "completed", "ungraded")]
    # zero reward is a negative; time-exceeded, aborted and ungraded rollouts are never used
    assert [r.payload for r in assemble(pool, 2, 0.5, 0.5)] == ["pc", "zero"]
    assert [r.payload for r in assemble(pool, 3, 0, 1)] == ["pc", "pt", "zero"]
    assert assemble(pool, 4, 0, 1) is None


def test_assemble_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="no whole number of positives"):
        assemble([], 4, 0.3, 0.3)
    with pytest.raises(ValueError, match="rho_min <= rho_max"):
        assemble([], 4, 0.8, 0.2)
    with pytest.raises(ValueError, match="group size"):
        assemble([], 0, 0, 1)


def test_rollout_validates_status() -> None:
    with pytest.raises(ValueError, match="unknown rollout status 'done'"):
        Rollout(1.0, "done")
    assert Rollout(1.0).usable and not Rollout(None).usable
    assert not Rollout(1.0, "time_exceeded").usable and Rollout(-1.0, "truncated").usable


def test_config_defaults_paper_and_validation() -> None:
    assert BARConfig() == BARConfig(n=4, n_max=8, stride=8, rho_min=0.25, rho_max=0.75)
    assert BARConfig.paper() == BARConfig(n=8, n_max=16, stride=16, rho_min=0.375,
                                          rho_max=0.625)
    with pytest.raises(ValueError, match="must divide"):
        BARConfig(n=4, n_max=8, stride=3)
    with pytest.raises(ValueError, match="exceeds the budget"):
        BARConfig(n=8, n_max=4, stride=4)
    with pytest.raises(ValueError, match="rho_min <= rho_max"):
        BARConfig(rho_min=0.9, rho_max=0.1)
    with pytest.raises(ValueError, match="rho_min <= rho_max"):
        BARConfig(rho_max=1.5)
    with pytest.raises(ValueError, match="no whole number"):
        BARConfig(n=4, rho_min=0.3, rho_max=0.45)
    with pytest.raises(ValueError, match="stride >= 1"):
        BARConfig(stride=0)


class Script:
    """A deterministic sampler: hands out the scripted rollouts in order, k at a time."""

    def __init__(self, rewards: Sequence[float | None | tuple[float | None, str]]) -> None:
        self.rollouts = [Rollout(*r) if isinstance(r, tuple) else Rollout(r) for r in rewards]
        for i, r in enumerate(self.rollouts):
            r.payload = i
        self.calls: list[int] = []

    def __call__(self, k: int) -> list[Rollout]:
        start = sum(self.calls)
        self.calls.append(k)
        return self.rollouts[start:start + k]


SMALL_STRIDE = BARConfig(n=4, n_max=12, stride=4, rho_min=0.25, rho_max=0.75)


def test_bar_group_stops_after_the_first_round_that_assembles() -> None:
    script = Script([-1] * 4 + [1, -1, -1, -1] + [1] * 4)
    result = bar_group(script, SMALL_STRIDE)
    assert result.mode == "balanced" and result.rounds == 2 and script.calls == [4, 4]
    assert [r.payload for r in result.pool] == list(range(8))
    assert [r.payload for r in result.group] == [4, 0, 1, 2]  # n*=2 infeasible, then n+=1


def test_bar_group_first_round_enough() -> None:
    script = Script([1, -1] * 6)
    result = bar_group(script, SMALL_STRIDE)
    assert (result.mode, result.rounds, script.calls) == ("balanced", 1, [4])
    assert [r.payload for r in result.group] == [0, 2, 1, 3]


def test_bar_group_relaxed_when_never_balanced() -> None:
    script = Script([1.0] * 12)
    result = bar_group(script, SMALL_STRIDE)
    assert (result.mode, result.rounds, script.calls) == ("relaxed", 3, [4, 4, 4])
    assert [r.payload for r in result.group] == [0, 1, 2, 3]


def test_bar_group_relaxed_prefers_completed() -> None:
    script = Script([(-1.0, "truncated")] * 6 + [(-1.0, "completed")] * 2)
    result = bar_group(script, BARConfig())  # the published script: one round of 8
    assert (result.mode, result.rounds) == ("relaxed", 1)
    assert [r.payload for r in result.group] == [6, 7, 0, 1]


def test_bar_group_best_effort_orders_by_status_then_reward() -> None:
    script = Script([(1.0, "aborted"), (-1.0, "time_exceeded"), (None, "truncated"),
                     (-1.0, "completed"), (1.0, "time_exceeded"), (None, "completed"),
                     (1.0, "truncated"), (-1.0, "aborted")])
    result = bar_group(script, BARConfig())
    assert (result.mode, result.rounds) == ("best_effort", 1)
    # completed, then truncated; within a status graded (higher reward first) before ungraded
    assert [r.payload for r in result.group] == [3, 5, 6, 2]
    assert filter_group(result.group) == "missing_reward"


def test_bar_group_paper_setting() -> None:
    script = Script([1] * 5 + [-1] * 11)
    result = bar_group(script, BARConfig.paper())
    assert (result.mode, result.rounds, script.calls) == ("balanced", 1, [16])
    assert [r.payload for r in result.group] == [0, 1, 2, 3, 5, 6, 7, 8]


@given(st.lists(st.sampled_from(KINDS), min_size=12, max_size=12))
def test_bar_group_is_the_spec_loop(kinds: list[tuple[float | None, str]]) -> None:
    script = Script(kinds)
    result = bar_group(script, SMALL_STRIDE)
    pool = script.rollouts[:4 * result.rounds]
    assert result.pool == pool and script.calls == [4] * result.rounds
    earlier = [assemble(pool[:4 * r], 4, 0.25, 0.75) for r in range(1, result.rounds)]
    assert earlier == [None] * (result.rounds - 1)  # no earlier round could stop
    balanced = assemble(pool, 4, 0.25, 0.75)
    if result.mode == "balanced":
        assert result.group == balanced
    else:
        assert balanced is None and result.rounds == 3
        relaxed = assemble(pool, 4, 0, 1)
        if relaxed is not None:
            assert result.mode == "relaxed" and result.group == relaxed
        else:
            assert result.mode == "best_effort"
            ranks = sorted(STATUSES.index(r.status) for r in pool)[:4]
            assert [STATUSES.index(r.status) for r in result.group] == ranks
    assert len(result.group) == 4 and all(r in pool for r in result.group)


def test_bar_group_rejects_wrong_sample_counts() -> None:
    with pytest.raises(ValueError, match=r"sample\(4\) returned 3 rollouts"):
        bar_group(lambda k: [Rollout(1.0)] * (k - 1), SMALL_STRIDE)
    with pytest.raises(TypeError, match="Rollout objects"):
        bar_group(lambda k: [1.0] * k, SMALL_STRIDE)


def group(*rewards: float | None, status: str = "completed") -> list[Rollout]:
    return [Rollout(r, status) for r in rewards]


def test_filter_group_reasons() -> None:
    assert filter_group(group(1, -1, -1, -1)) is None
    assert filter_group(group(1, -1) + [Rollout(-1.0, "aborted")]) == "aborted"
    assert filter_group(group(1, -1, None)) == "missing_reward"
    assert filter_group(group(-1, -1, -1)) == "zero_spread"
    assert filter_group(group(1, 1)) == "zero_spread"
    assert filter_group(group(0, -1)) == "no_positive"
    assert filter_group(group(1, -1, status="truncated")) is None
    with pytest.raises(ValueError, match="empty group"):
        filter_group([])


def test_fill_batch_refills_from_over_sampled_prompts() -> None:
    outcome = {0: group(1, -1), 1: group(-1, -1), 2: group(1, 0), 3: group(0, -1),
               4: group(1, -1) + [Rollout(1.0, "aborted")], 5: group(1, 1, -1), 6: group(1, -1)}
    built: list[int] = []

    def make_group(prompt: int) -> list[Rollout]:
        built.append(prompt)
        return outcome[prompt]

    kept, dropped = fill_batch(range(7), make_group, 3)
    assert [(p, g) for p, g in kept] == [(0, outcome[0]), (2, outcome[2]), (5, outcome[5])]
    assert dropped == [(1, "zero_spread"), (3, "no_positive"), (4, "aborted")]
    assert built == [0, 1, 2, 3, 4, 5]  # prompt 6 was never rolled out

    kept, dropped = fill_batch(iter(range(7)), make_group, 10)
    assert [p for p, _ in kept] == [0, 2, 5, 6] and len(dropped) == 3  # prompts ran out

    kept, dropped = fill_batch(range(7), make_group, 2, filter=lambda g: None)
    assert [p for p, _ in kept] == [0, 1] and dropped == []
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        fill_batch(range(7), make_group, 0)


# rewards on a grid of quarters (+-1 rewards are on it): sums and means are exact, so whether
# a reward is above the mean is well defined, and no tiny difference underflows
rewards_lists = st.lists(st.integers(-40, 40).map(lambda i: i / 4), min_size=1, max_size=16)


def population_std(xs: Sequence[float]) -> float:
    mean = sum(xs) / len(xs)
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))


@given(rewards_lists)
def test_advantages_are_standardised(rewards: list[float]) -> None:
    adv = grpo_advantages(rewards)
    assert len(adv) == len(rewards)
    assert abs(sum(adv) / len(adv)) < 1e-6
    std = population_std(rewards)
    if max(rewards) == min(rewards):
        assert adv == [0.0] * len(rewards)
    else:
        assert population_std(adv) == pytest.approx(std / (std + 1e-6), rel=1e-6, abs=1e-9)
        if max(rewards) - min(rewards) > 1e-2:
            assert population_std(adv) == pytest.approx(1.0, abs=1e-3)


@given(rewards_lists, st.randoms(use_true_random=False))
def test_advantages_are_order_equivariant(rewards: list[float], rnd: random.Random) -> None:
    order = list(range(len(rewards)))
    rnd.shuffle(order)
    adv = grpo_advantages(rewards)
    assert grpo_advantages([rewards[i] for i in order]) == [adv[i] for i in order]


@given(rewards_lists)
def test_advantage_signs_follow_the_mean(rewards: list[float]) -> None:
    mean = math.fsum(rewards) / len(rewards)
    for r, a in zip(rewards, grpo_advantages(rewards), strict=True):
        assert (a > 0) == (r > mean) and (a < 0) == (r < mean)


def test_advantages_known_values() -> None:
    assert grpo_advantages([1, -1]) == pytest.approx([1 / (1 + 1e-6), -1 / (1 + 1e-6)])
    assert grpo_advantages([1, -1, -1, -1]) == pytest.approx(
        [1.5 / (math.sqrt(0.75) + 1e-6)] + [-0.5 / (math.sqrt(0.75) + 1e-6)] * 3)
    assert grpo_advantages([0.1] * 3) == [0.0] * 3
    with pytest.raises(ValueError, match="empty group"):
        grpo_advantages([])



def test_rubric_rewards_balance_on_success_not_on_the_sign_of_the_reward() -> None:
    # R = base + 0.5 J: an unsolved rollout the judge liked has a positive reward.
    solved = [Rollout(reward=1.0 + 0.5 * j, success=True) for j in (1.0, 0.5)]
    liked = [Rollout(reward=0.5 * j, success=False) for j in (0.8, 0.6, 0.4)]
    group = assemble(liked + solved, 4, 0.25, 0.75)
    assert group is not None and sum(r.success for r in group) == 2  # balanced on success
    assert filter_group(liked) == "no_positive"  # every reward > 0, yet nothing solved
    assert filter_group(liked[:1] + solved[:1]) is None
    assert Rollout(reward=0.3).positive and not Rollout(reward=0.3, success=False).positive


@pytest.mark.parametrize(("exit_status", "failed", "status"), [
    ("Submitted", False, "completed"), ("LimitsExceeded", False, "truncated"),
    ("TimeExceeded", False, "time_exceeded"), ("RepeatedFormatError", False, "completed"),
    ("Submitted", True, "aborted"),
    # An exit nobody defined is not taken to mean the rollout ran to its end.
    ("exited 3", False, "aborted"), ("unknown", False, "aborted"), ("", False, "aborted")])
def test_harness_exits_map_to_bar_statuses(exit_status: str, failed: bool, status: str) -> None:
    from orchard.eval.results import Failure, RolloutResult
    from orchard.recipes.rl import rollout_status

    failure = Failure(cls="harness", type="HarnessError", message="boom") if failed else None
    result = RolloutResult(run_id="r", rollout_id="x", instance_id="t", sample=0, harness="h",
                           exit_status=exit_status, failure=failure)
    assert rollout_status(result) == status


def test_a_format_failure_reward_ranks_a_derailment_below_a_wrong_fix() -> None:
    from orchard.eval.results import RolloutResult
    from orchard.recipes.rl import rollout_reward
    from orchard.tasks.protocol import Grade

    def result(exit_status: str, resolved: bool, graded: bool = True) -> RolloutResult:
        return RolloutResult(run_id="r", rollout_id=exit_status, instance_id="t", sample=0,
                             harness="h", exit_status=exit_status, resolved=resolved,
                             reward=1.0 if resolved else -1.0,
                             grade=Grade(instance_id="t", resolved=resolved,
                                         reward=1.0 if resolved else -1.0, outcome="graded")
                             if graded else None)

    solved, wrong = result("Submitted", True), result("Submitted", False)
    derailed = result("RepeatedFormatError", False)
    # By default both failures earn the grade's -1, so GRPO cannot tell them apart.
    assert [rollout_reward(r) for r in (solved, wrong, derailed)] == [1.0, -1.0, -1.0]
    shaped = [rollout_reward(r, -2.0) for r in (solved, wrong, derailed)]
    assert shaped == [1.0, -1.0, -2.0]
    advantages = grpo_advantages(shaped)
    assert advantages[0] > 0 > advantages[1] > advantages[2]
    # Only the format failure changes: a solved rollout keeps its reward whatever it ended
    # with, and an ungraded one still has none.
    assert rollout_reward(result("RepeatedFormatError", True), -2.0) == 1.0
    assert rollout_reward(result("RepeatedFormatError", False, graded=False), -2.0) is None


def test_time_exceeded_rollouts_stay_in_the_baseline_but_are_not_trained_on() -> None:
    from orchard.recipes.rl import training_pairs

    # A best-effort group: one solved, one cut off by the clock, one that failed.
    group = [Rollout(1.0, "completed", payload=(None, ["won"])),
             Rollout(-1.0, "time_exceeded", payload=(None, ["cut-1", "cut-2"])),
             Rollout(-1.0, "completed", payload=(None, ["lost"]))]
    pairs = training_pairs([group])
    assert [s for s, _ in pairs] == ["won", "lost"]
    # The baseline counts the cut-off rollout: its reward drags the mean down.
    advantages = dict(pairs)
    assert advantages["won"] == pytest.approx(grpo_advantages([1.0, -1.0, -1.0])[0])
    assert advantages["lost"] == pytest.approx(grpo_advantages([1.0, -1.0, -1.0])[2])
