"""bench/learning.py's --rl settings: each key lands on its field, and a bad one fails at once
with what to use instead (before an hour of training, not after)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from learning import rl_setting  # noqa: E402

from orchard.recipes.bar import BARConfig  # noqa: E402
from orchard.recipes.rl import RLConfig  # noqa: E402

BASE = RLConfig(bar=BARConfig(n=4, n_max=8, stride=4), concurrency=4)


def test_each_key_lands_on_its_field() -> None:
    config = rl_setting("lr=5e-6,epochs=2,minibatches=1,batch=3,concurrency=8,kl=0.04,stride=8,"
                        "format=-2", BASE)
    assert (config.lr, config.ppo_epochs, config.minibatches, config.batch_prompts,
            config.concurrency, config.kl_coef, config.format_failure_reward
            ) == (5e-6, 2, 1, 3, 8, 0.04, -2.0)
    assert config.bar == BARConfig(n=4, n_max=8, stride=8)
    assert rl_setting("", BASE) == BASE and rl_setting("paper=1", BASE).bar == BARConfig.paper()


@pytest.mark.parametrize(("spec", "says"), [
    ("stride=3", "stride=3 must divide n_max=8"),
    ("temperature=1", "unknown key 'temperature'; use lr, steps"),
])
def test_a_bad_setting_says_what_is_wrong(spec: str, says: str) -> None:
    with pytest.raises(SystemExit, match=says):
        rl_setting(spec, BASE)
