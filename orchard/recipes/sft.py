"""Credit-assignment SFT: the dataset (which assistant turns to learn from, as token masks) and
a small trainer.

Resolved trajectories train on every assistant turn. Unresolved ones train only on the turns
inside their rise segments (the steps where the retrospective value V(s_t) climbed), with the
earlier history kept as context. Observations (system, user, tool turns) are never trained.

A conversation is tokenized under the model's own chat template, once, in one go; the loss mask
is 1 on exactly the tokens of the chosen assistant turns: the turn's text and its end-of-turn
token (what the model must emit to stop), not the `<|im_start|>assistant\\n` header the prompt
already holds, nor the newline the template puts after the end-of-turn token.

    examples, dropped = build_sft_dataset(trajectories, segments, tokenizer)
    model = tiny_llama(tokenizer)          # orchard.recipes.models
    history = sft_train(model, examples, SFTConfig(epochs=3))
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from orchard.recipes.loop import adamw, optimizer_step, trainable
from orchard.recipes.loss import masked_nll, pad_id_of, pad_right, shift, token_logprobs
from orchard.recipes.reporting import Reporter, section
from orchard.recipes.trajectories import Trajectory
from orchard.rollout.tokenizer import apply_template

if TYPE_CHECKING:
    from accelerate import Accelerator
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

Segments = Sequence[tuple[int, int]]


class ChatTemplateError(ValueError):
    """The chat template cannot give a faithful mask for this conversation: a turn's rendering
    is not a prefix of the next one, or a token straddles a turn boundary."""


# --- which turns to train on ---------------------------------------------------------------


def select_turns(traj: Trajectory, segments: Segments | None) -> list[int]:
    """The step indices to train on: every step of a resolved trajectory; for an unresolved
    one the steps inside the rise segments (half-open ``(start, end)`` step ranges), none
    without segments."""
    n = len(traj.steps)
    if traj.resolved:
        return list(range(n))
    chosen: set[int] = set()
    for start, end in segments or ():
        if not 0 <= start <= end <= n:
            raise ValueError(f"rollout {traj.rollout_id}: segment ({start}, {end}) is not a "
                             f"step range within its {n} steps; segments are half-open "
                             f"(start, end) with 0 <= start <= end <= {n}")
        chosen.update(range(start, end))
    return sorted(chosen)


# --- tokens and masks ----------------------------------------------------------------------


def tokenize_conversation(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    trained_steps: Iterable[int],
) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """(input_ids, loss_mask, spans) of ``messages`` under the tokenizer's chat template.

    ``spans`` are the half-open token ranges of the trained steps, in step order; the mask is 1
    exactly on them. Raises ChatTemplateError when the template renders a turn's history
    differently from the full conversation (it is not prefix-stable, e.g. it rewrites or drops
    earlier turns), or when a token crosses a turn boundary (then the whole-conversation tokens
    are not the ones the model read and wrote)."""
    eos = tokenizer.eos_token
    if not eos:
        raise ValueError("the tokenizer has no eos_token, so the end of an assistant turn is "
                         "unknown; set tokenizer.eos_token to the model's end-of-turn token")
    tools = tools or None

    def render(msgs: list[dict[str, Any]], generation_prompt: bool = False) -> str:
        return apply_template(tokenizer, msgs, tools, generation_prompt=generation_prompt)

    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    wanted = sorted(set(trained_steps))
    if wanted and not 0 <= wanted[0] <= wanted[-1] < len(assistant):
        raise ValueError(f"trained steps {wanted} are outside the conversation's "
                         f"{len(assistant)} assistant turns (steps 0..{len(assistant) - 1})")

    full = render(messages)
    char_spans = []
    for step, i in enumerate(assistant):
        prompt, turn = render(messages[:i], generation_prompt=True), render(messages[:i + 1])
        where = f"assistant turn {step} (message {i})"
        if not turn.startswith(prompt):
            raise ChatTemplateError(
                f"the chat template is not prefix-stable at {where}: the prompt it renders "
                f"for the turn is not a prefix of its rendering with the turn; the model's "
                f"input cannot be reproduced, so this template cannot be used for SFT")
        if not full.startswith(turn):
            raise ChatTemplateError(
                f"the chat template is not prefix-stable at {where}: later turns change how "
                f"it renders the history (it rewrites or drops earlier turns)")
        if step in wanted:
            end = turn.rfind(eos, len(prompt))
            if end < 0:
                raise ChatTemplateError(f"{where} does not end with the end-of-turn token "
                                        f"{eos!r} (tokenizer.eos_token) in its rendering")
            char_spans.append((len(prompt), end + len(eos)))

    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(encoded["input_ids"])
    templated = apply_template(tokenizer, messages, tools, generation_prompt=False,
                               tokenize=True)
    if ids != list(templated):
        raise ChatTemplateError("tokenizing the rendered conversation does not give the ids "
                                "the chat template's own tokenization gives")
    starts = [a for a, _ in encoded["offset_mapping"]]
    ends = [b for _, b in encoded["offset_mapping"]]
    mask = [0] * len(ids)
    spans = []
    for step, (a, b) in zip(wanted, char_spans, strict=True):
        first, last = bisect.bisect_left(starts, a), bisect.bisect_left(starts, b)
        aligned = (first < last and starts[first] == a and ends[last - 1] == b
                   and (first == 0 or ends[first - 1] <= a))
        if not aligned:
            raise ChatTemplateError(
                f"assistant turn {step}: a token crosses the turn's boundary (e.g. its text "
                f"starts with whitespace that merges with the header's newline), so the "
                f"conversation's tokens are not the ones the model produced")
        spans.append((first, last))
        mask[first:last] = [1] * (last - first)
    return ids, mask, spans


# --- the dataset ---------------------------------------------------------------------------


@dataclass
class SFTExample:
    rollout_id: str
    instance_id: str
    input_ids: list[int]
    loss_mask: list[int]
    trained_steps: list[int]
    resolved: bool

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.loss_mask):
            raise ValueError(f"example {self.rollout_id}: {len(self.input_ids)} input_ids but "
                             f"{len(self.loss_mask)} loss_mask entries; they must pair up")


def action_problem(traj: Trajectory) -> str | None:
    """Why the trajectory's actions cannot be trusted (a tool call that is not valid JSON
    object arguments, or names a tool the trajectory does not offer), or None."""
    offered = {t.get("function", t).get("name") for t in traj.tools}
    for step, i in enumerate(traj.steps):
        for call in traj.messages[i].get("tool_calls") or []:
            function = call.get("function") or {}
            name, arguments = function.get("name"), function.get("arguments")
            if name not in offered:
                return f"unknown tool: step {step} calls {name!r}, not one of {sorted(offered)}"
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError as e:
                    return f"unparsable action: step {step} arguments are not JSON ({e})"
            if not isinstance(arguments, dict):
                return f"unparsable action: step {step} arguments are not a JSON object"
    return None


def build_sft_dataset(
    trajectories: Iterable[Trajectory],
    segments_by_rollout: Mapping[str, Segments],
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_tokens: int = 8192,
) -> tuple[list[SFTExample], dict[str, str]]:
    """Examples from trajectories, and the dropped ones as rollout id -> reason.

    Filters: unknown tool calls and unparsable actions, nothing to train (unresolved with no
    rise segment), conversations the template cannot mask faithfully, over ``max_tokens``."""
    examples: list[SFTExample] = []
    dropped: dict[str, str] = {}
    for traj in trajectories:
        problem = action_problem(traj)
        if problem:
            dropped[traj.rollout_id] = problem
            continue
        steps = select_turns(traj, segments_by_rollout.get(traj.rollout_id))
        if not steps:
            dropped[traj.rollout_id] = "nothing to train: unresolved and no rise segment"
            continue
        try:
            ids, mask, _ = tokenize_conversation(tokenizer, traj.messages, traj.tools, steps)
        except ChatTemplateError as e:
            dropped[traj.rollout_id] = f"template: {e}"
            continue
        if len(ids) > max_tokens:
            dropped[traj.rollout_id] = f"over-long: {len(ids)} tokens > max_tokens={max_tokens}"
            continue
        examples.append(SFTExample(traj.rollout_id, traj.instance_id, ids, mask, steps,
                                   traj.resolved))
    return examples, dropped


def save_examples(examples: Iterable[SFTExample], path: str | Path) -> None:
    """One JSON object per line, masks with the ids."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for example in examples:
            f.write(json.dumps(asdict(example)) + "\n")


def load_examples(path: str | Path) -> list[SFTExample]:
    examples = []
    with Path(path).open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            try:
                examples.append(SFTExample(**json.loads(line)))
            except (json.JSONDecodeError, TypeError) as e:
                raise ValueError(f"{path}:{number} is not an SFT example ({e}); write the "
                                 f"file with save_examples") from None
    return examples


def to_dataset(examples: Iterable[SFTExample]) -> Dataset:
    """The examples as a Hugging Face dataset, one row each, same columns as the JSONL."""
    from datasets import Dataset, Features, List, Value

    features = Features({
        "rollout_id": Value("string"), "instance_id": Value("string"),
        "input_ids": List(Value("int32")), "loss_mask": List(Value("int8")),
        "trained_steps": List(Value("int32")), "resolved": Value("bool"),
    })
    rows = [asdict(e) for e in examples]
    # Column-wise: from_list cannot build a dataset with no rows.
    return Dataset.from_dict({k: [row[k] for row in rows] for k in features}, features=features)


# --- training ------------------------------------------------------------------------------


@dataclass
class SFTConfig:
    """Defaults suit a tiny random-init model on CPU; a pretrained model wants lr ~1e-5."""
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    """The cosine decays to lr * min_lr_ratio at the last step."""
    epochs: int = 1
    batch_size: int = 4
    max_steps: int | None = None
    """Stop after this many optimizer steps even if epochs remain."""
    warmup: int = 10
    """Steps of linear warmup from lr / warmup to lr."""
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 10


def lr_at(step: int, total: int, config: SFTConfig) -> float:
    """Linear warmup, then cosine decay to lr * min_lr_ratio at step total - 1."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, total - 1 - config.warmup)
    low = config.lr * config.min_lr_ratio
    return low + 0.5 * (1 + math.cos(math.pi * min(1.0, progress))) * (config.lr - low)


def collate(examples: Sequence[SFTExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded input_ids, attention_mask and loss_mask, [batch, longest]."""
    return {"input_ids": pad_right([e.input_ids for e in examples], pad_id, torch.long),
            "attention_mask": pad_right([[1] * len(e.input_ids) for e in examples], 0,
                                        torch.long),
            "loss_mask": pad_right([e.loss_mask for e in examples], 0, torch.long)}


def sft_loss(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
             loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token negative log-likelihood over the trained tokens of the batch. Token i + 1
    is predicted from position i, and the mask of that target token decides whether it counts."""
    mask = shift(loss_mask)
    logprobs, _ = token_logprobs(model, input_ids, attention_mask, mask=mask, entropy=False)
    return masked_nll(logprobs, mask)


def sft_steps(config: SFTConfig, examples: int) -> int:
    """How many optimizer steps ``sft_train`` takes on ``examples`` examples."""
    total = config.epochs * math.ceil(examples / config.batch_size)
    return total if config.max_steps is None else min(total, config.max_steps)


def sft_train(model: torch.nn.Module, examples: Sequence[SFTExample], config: SFTConfig, *,
              on_step: Callable[[dict[str, Any]], None] | None = None,
              accelerator: Accelerator | None = None, report: Reporter | None = None
              ) -> list[dict[str, Any]]:
    """Train ``model`` in place on ``examples``; returns one metrics dict per optimizer step:
    step, epoch, loss, tokens (non-pad tokens in the batch), trained_tokens, tokens_per_s, lr,
    grad_norm. ``on_step`` gets each dict as it is made, ``report`` its numbers under ``sft/``.

    With an ``accelerator`` (run under ``accelerate launch``), each process takes its share of
    every batch (rows rank, rank + world, ...), and the gradients are averaged across processes
    before each step, so all of them hold the same weights; the metrics are this process's."""
    if not examples:
        raise ValueError("no examples to train on")
    torch.manual_seed(config.seed)
    order_rng = random.Random(config.seed)
    rank, world = ((accelerator.process_index, accelerator.num_processes)
                   if accelerator is not None else (0, 1))
    if config.batch_size < world:
        raise ValueError(f"batch_size {config.batch_size} gives some of the {world} processes "
                         "no rows: make it at least the number of processes")
    device = accelerator.device if accelerator is not None else next(model.parameters()).device
    pad_id = pad_id_of(model)
    total = sft_steps(config, len(examples))

    params = trainable(model)
    optimizer = adamw(model, config.lr, config.weight_decay)
    if accelerator is not None:
        model, optimizer = accelerator.prepare(model, optimizer)

    model.train()
    report = section(report, "sft")
    history: list[dict[str, Any]] = []
    for epoch in range(config.epochs):
        order = list(range(len(examples)))
        order_rng.shuffle(order)
        for first in range(0, len(order), config.batch_size):
            step = len(history)
            if step >= total:
                return history
            lr = lr_at(step, total, config)
            rows = order[first:first + config.batch_size][rank::world]
            batch = collate([examples[k] for k in rows], pad_id)
            batch = {k: v.to(device) for k, v in batch.items()}
            started = time.perf_counter()

            loss = sft_loss(model, **batch)
            grad_norm = optimizer_step(optimizer, params, [loss], grad_clip=config.grad_clip,
                                       lr=lr, accelerator=accelerator)

            seconds = time.perf_counter() - started
            tokens = int(batch["attention_mask"].sum())
            metrics = {"step": step, "epoch": epoch, "loss": loss.item(), "tokens": tokens,
                       "trained_tokens": int(batch["loss_mask"][:, 1:].sum()),
                       "tokens_per_s": tokens / seconds, "lr": lr,
                       "grad_norm": grad_norm}
            history.append(metrics)
            if report is not None:
                report.log(metrics, step)
            if on_step is not None:
                on_step(metrics)
            if step % config.log_every == 0 or step == total - 1:
                log.info("step %d/%d loss %.4f lr %.2e %.0f tok/s", step + 1, total,
                         metrics["loss"], lr, metrics["tokens_per_s"])
    return history
