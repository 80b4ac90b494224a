"""`orchard demo`'s options as the DemoConfig the pipeline runs with."""

from __future__ import annotations

import pytest
import typer

from orchard.cli.demo import demo_config
from orchard.recipes.demo import PRETRAINED_RL_LR, DemoConfig


def test_defaults_are_the_demo_config() -> None:
    config = demo_config("bugfix", seed=3)
    default = DemoConfig()
    assert config.domain == "bugfix"
    assert (config.rl.lr, config.rl.ppo_epochs, config.rl.minibatches) == (
        default.rl.lr, default.rl.ppo_epochs, default.rl.minibatches)
    assert (config.rl.bar.n, config.rl.bar.n_max, config.rl.bar.stride) == (4, 8, 4)
    assert config.rl.seed == config.sft.seed == 3


def test_rl_options_reach_the_config_and_override_a_pretrained_rate() -> None:
    config = demo_config("swe", model="some/model", rl_steps=5, rl_lr=3e-5, ppo_epochs=4,
                         minibatches=2, paper_groups=True)
    assert (config.rl.steps, config.rl.lr, config.rl.ppo_epochs, config.rl.minibatches) == (
        5, 3e-5, 4, 2)
    assert (config.rl.bar.n, config.rl.bar.n_max, config.rl.bar.stride) == (8, 16, 16)
    # A pretrained model keeps its own SFT rate; without --rl-lr, RL's too.
    assert config.sft.lr == 2e-4
    assert demo_config("swe", model="some/model").rl.lr == PRETRAINED_RL_LR


def test_a_pretrained_model_gets_the_cpu_sizes_unless_options_say_otherwise() -> None:
    default, sized = DemoConfig(), demo_config("bugfix", model="some/model")
    assert (sized.n_test, sized.eval_n, sized.rl.steps, sized.sft.max_steps) == (12, 2, 0, 16)
    assert sized.sft.max_steps < default.sft.max_steps
    chosen = demo_config("bugfix", model="some/model", n_train=8, n_test=3, eval_n=5,
                         sft_steps=7, rl_steps=1)
    assert (chosen.n_train, chosen.n_test, chosen.eval_n, chosen.sft.max_steps,
            chosen.rl.steps) == (8, 3, 5, 7, 1)
    plain = demo_config("swe", n_test=4)
    assert (plain.n_test, plain.eval_n, plain.rl.steps, plain.sft.max_steps) == (
        4, default.eval_n, default.rl.steps, default.sft.max_steps)


def test_bad_combinations_say_what_to_change() -> None:
    with pytest.raises(typer.BadParameter, match="swe, bugfix, bugfix-read, web or assistant"):
        demo_config("chess")
    with pytest.raises(typer.BadParameter, match="add --domain assistant"):
        demo_config("bugfix", judge="scripted")
