"""Recipes: training methods on top of rollouts (credit-assignment SFT, BAR RL, on-policy
distillation, value-model reranking), the training loop they share (``loop``: one optimizer
step, one sample -> update -> sync -> log loop), the policy server they train against
(``policy_server``), where they report each step (``reporting``) and the reference pipeline
that runs them end to end (``demo``)."""

from orchard.extras import require

# Before any third-party import: a missing one is then a one-line error naming its extra.
require("train")

from orchard.recipes.bar import (
    BARConfig,
    GroupResult,
    Rollout,
    assemble,
    bar_group,
    fill_batch,
    filter_group,
    grpo_advantages,
)
from orchard.recipes.credit import (
    AnnotationError,
    Annotator,
    JudgeError,
    RetrospectiveAnnotator,
    ValueCurve,
    annotate_all,
    interpolate,
    key_steps,
)
from orchard.recipes.demo import Demo, DemoConfig, pretrained, run_demo
from orchard.recipes.distill import distill_step, train_distill
from orchard.recipes.loop import adamw, optimizer_step, torch_threads, train_loop, trainable
from orchard.recipes.loss import masked_nll, pad_right, ppo_clip_loss, shift, token_logprobs
from orchard.recipes.models import load_policy, save_policy, smollm2_dir, tiny_llama
from orchard.recipes.montecarlo import Continuation, MonteCarloAnnotator
from orchard.recipes.policy_server import FolderSync, PolicyEngine, PolicyServer
from orchard.recipes.reporting import Reporter, open_reporters
from orchard.recipes.rerank import (
    ValueModel,
    ValueModelConfig,
    best_of_n,
    likelihood_rerank,
    rerank_run,
)
from orchard.recipes.rl import PolicySampler, RLConfig, policy_update, train_rl
from orchard.recipes.sft import (
    ChatTemplateError,
    SFTConfig,
    SFTExample,
    build_sft_dataset,
    load_examples,
    save_examples,
    select_turns,
    sft_train,
    to_dataset,
    tokenize_conversation,
)
from orchard.recipes.trajectories import Trajectory, load_trajectories

__all__ = [
    "AnnotationError", "Annotator", "BARConfig", "ChatTemplateError", "Continuation", "Demo",
    "DemoConfig", "FolderSync", "GroupResult", "JudgeError",
    "MonteCarloAnnotator",
    "PolicyEngine", "PolicySampler", "PolicyServer", "RLConfig", "Reporter",
    "RetrospectiveAnnotator",
    "Rollout", "SFTConfig", "SFTExample", "Trajectory", "ValueCurve", "ValueModel",
    "ValueModelConfig", "annotate_all", "assemble", "bar_group", "best_of_n",
    "build_sft_dataset", "fill_batch", "filter_group", "grpo_advantages", "interpolate",
    "key_steps", "likelihood_rerank", "load_examples", "load_policy", "load_trajectories",
    "masked_nll", "open_reporters",
    "pad_right", "ppo_clip_loss", "policy_update", "pretrained", "rerank_run", "run_demo",
    "save_examples", "save_policy", "select_turns", "sft_train", "shift", "smollm2_dir",
    "tiny_llama", "to_dataset", "token_logprobs", "tokenize_conversation", "train_rl",
    "adamw", "distill_step", "optimizer_step", "torch_threads", "train_distill", "train_loop",
    "trainable",
]
