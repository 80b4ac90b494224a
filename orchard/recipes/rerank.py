"""Value-model reranking (best-of-N): a scalar head on a small backbone, trained on graded
rollouts of earlier runs to predict P(resolved) from a candidate's text, then used to pick one
of N candidates per task. The report sets the value pick against a random pick (its exact
expectation), an oracle pick (any candidate resolved) and, given the training runs' fixes, a
lookup pick (a candidate adding a line that a resolved training patch added).

A candidate's text is the problem statement, optionally the agent's actions (one line per
assistant turn, with the tail of what each got back for ``observed``), and the final patch,
last, under :data:`PATCH_HEADER`; when it is too long, the model keeps the patch and cuts the
middle of what comes before it. ``likelihood_rerank`` needs no training: it picks the
candidate whose actions a causal LM finds most likely given what came before them.

    model = ValueModel.from_pretrained(smollm2_dir())
    model.train(training_examples(["runs/a", "runs/b"], tasks, text_of="both"))
    console.print(report_table(rerank_run("runs/c", tasks, model, text_of="both")))
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import mean
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from rich.table import Table
from transformers import (
    AutoModelForSequenceClassification,
    LlamaConfig,
    LlamaForSequenceClassification,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from orchard.eval.results import RolloutResult, read_results
from orchard.recipes.loop import optimizer_step
from orchard.recipes.loss import pad_right, shift, token_logprobs
from orchard.recipes.reporting import Reporter, section
from orchard.recipes.sft import ChatTemplateError, tokenize_conversation
from orchard.recipes.trajectories import Trajectory, from_result
from orchard.rollout.tokenizer import load_tokenizer
from orchard.tasks.protocol import Task

TextOf = Literal["patch", "trajectory", "both", "observed"]
PATCH_HEADER = "\n\n## Final patch\n"
ACTION_CHARS = 200
OBSERVATION_CHARS = 300
CONFIG_FILE = "value_model.json"


# --- candidate texts ----------------------------------------------------------------------------

def action_summary(trajectory: Trajectory, *, chars: int = ACTION_CHARS,
                   observations: int = 0) -> str:
    """One line per assistant turn: its tool calls as ``name(arguments)``, else its text,
    each cut to ``chars`` characters. With ``observations`` > 0, each is followed by what
    came back before the next turn, its last ``observations`` characters indented (a test
    run's verdict and failures are at its end)."""
    lines = []
    steps = trajectory.steps
    for t, i in enumerate(steps, 1):
        message = trajectory.messages[i]
        calls = [f"{c['function']['name']}({c['function']['arguments']})"
                 for c in message.get("tool_calls") or []]
        action = " ".join(" ".join(calls or [message.get("content") or ""]).split())
        lines.append(f"{t}. {action[:chars]}")
        if observations:
            end = steps[t] if t < len(steps) else len(trajectory.messages)
            seen = "\n".join(str(m.get("content") or "")
                              for m in trajectory.messages[i + 1:end]).strip()
            lines += [f"   > {line}" for line in seen[-observations:].splitlines()]
    return "\n".join(lines)


def candidate_text(task: Task, result: RolloutResult,
                   run_dir: str | Path | None = None, *, text_of: TextOf = "patch") -> str:
    """The text the value model scores: problem statement, then (``trajectory``/``both``) the
    actions when the rollout has a readable trace in ``run_dir`` (``observed``: each with the
    tail of what it got back), then (all but ``trajectory``) the final patch under
    :data:`PATCH_HEADER`."""
    if text_of not in get_args(TextOf):
        raise ValueError(f"text_of must be one of {get_args(TextOf)}, not {text_of!r}")
    if result.instance_id != task.instance_id:
        raise ValueError(f"rollout {result.rollout_id} is of task {result.instance_id}, "
                         f"not {task.instance_id}")
    text = f"## Problem\n{task.prompt.strip()}"
    if text_of != "patch" and result.trace is not None and run_dir is not None:
        try:
            actions = action_summary(
                from_result(result, Path(run_dir)),
                observations=OBSERVATION_CHARS if text_of == "observed" else 0)
        except (ValueError, OSError):
            actions = ""  # no conversation to summarise: the rest still says something
        if actions:
            text += f"\n\n## Actions\n{actions}"
    if text_of != "trajectory":
        text += PATCH_HEADER + (result.patch.strip() or "(empty)")
    return text


def _task_map(tasks: Iterable[Task]) -> dict[str, Task]:
    return {t.instance_id: t for t in tasks}


def _graded(run_dir: Path, by_id: Mapping[str, Task]) -> list[RolloutResult]:
    """The run's rollouts whose outcome is known: a grading failure says nothing about the
    patch."""
    results = read_results(run_dir)
    if not results:
        raise FileNotFoundError(f"{run_dir} holds no rollouts: is it the --out of an "
                                "`orchard eval` run?")
    kept = [r for r in results if not (r.failure and r.failure.cls == "grading")]
    missing = sorted({r.instance_id for r in kept} - set(by_id))
    if missing:
        raise ValueError(f"{run_dir} has rollouts of {len(missing)} task(s) not among the "
                         f"tasks given ({', '.join(missing[:5])}): load the task set that "
                         "run used")
    return kept


def training_examples(run_dirs: Iterable[str | Path], tasks: Iterable[Task],
                      text_of: TextOf = "patch") -> list[tuple[str, bool]]:
    """(text, resolved) for every graded rollout of the runs in ``run_dirs``."""
    by_id = _task_map(tasks)
    examples = []
    for run_dir in map(Path, run_dirs):
        examples += [(candidate_text(by_id[r.instance_id], r, run_dir, text_of=text_of),
                      r.resolved) for r in _graded(run_dir, by_id)]
    return examples


# --- the value model ----------------------------------------------------------------------------

@dataclass
class ValueModelConfig:
    max_tokens: int = 1024
    lr: float = 1e-5
    epochs: int = 2
    batch_size: int = 8
    seed: int = 0
    hidden_size: int = 64
    """Backbone width of :meth:`ValueModel.tiny` (a multiple of 16: heads of 16)."""
    layers: int = 2
    """Backbone depth of :meth:`ValueModel.tiny`."""
    device: str | None = None
    """Where it trains and scores; None: cuda when there is one, else cpu."""

    def __post_init__(self) -> None:
        for name in ("max_tokens", "epochs", "batch_size", "hidden_size", "layers"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ValueModelConfig.{name} must be positive, "
                                 f"not {getattr(self, name)}")
        if self.hidden_size % 16:
            raise ValueError(f"ValueModelConfig.hidden_size must be a multiple of 16, "
                             f"not {self.hidden_size}")
        if not self.lr > 0:
            raise ValueError(f"ValueModelConfig.lr must be positive, not {self.lr}")


class ValueModel:
    """A sequence-classification model with one logit, read as P(resolved) through a
    sigmoid; it pools the last non-pad token, so inputs are right-padded with the pad id."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast,
                 config: ValueModelConfig) -> None:
        if model.config.num_labels != 1:
            raise ValueError(f"a value model has one output, this one has "
                             f"{model.config.num_labels}")
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token first")
        model.config.pad_token_id = tokenizer.pad_token_id
        self.device = torch.device(config.device or ("cuda" if torch.cuda.is_available()
                                                     else "cpu"))
        self.model = model.to(self.device)
        self.tokenizer = tokenizer
        self.config = config

    @classmethod
    def tiny(cls, tokenizer: PreTrainedTokenizerFast,
             config: ValueModelConfig | None = None) -> ValueModel:
        """A randomly initialised small Llama with ``tokenizer`` (CPU demos and tests); the
        same seed gives the same weights."""
        config = config or ValueModelConfig()
        llama = LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=config.hidden_size,
            num_hidden_layers=config.layers, num_attention_heads=config.hidden_size // 16,
            num_key_value_heads=config.hidden_size // 16,
            intermediate_size=4 * config.hidden_size, max_position_embeddings=config.max_tokens,
            num_labels=1, pad_token_id=tokenizer.pad_token_id)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            model = LlamaForSequenceClassification(llama).to(torch.float32)
        return cls(model, tokenizer, config)

    @classmethod
    def from_pretrained(cls, path: str | Path,
                        config: ValueModelConfig | None = None) -> ValueModel:
        """A causal-LM backbone folder (e.g. ``orchard.recipes.models.smollm2_dir()``) with a
        new scalar head, in float32 for training."""
        tokenizer = load_tokenizer(path)
        if tokenizer.pad_token_id is None:
            # Only marks the padded tail: right padding never puts it inside a text.
            tokenizer.pad_token = tokenizer.eos_token
        config = config or ValueModelConfig()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)  # the new head's initial weights
            model = AutoModelForSequenceClassification.from_pretrained(
                str(path), num_labels=1, dtype=torch.float32,
                pad_token_id=tokenizer.pad_token_id)
        return cls(model, tokenizer, config)

    @classmethod
    def load(cls, path: str | Path) -> ValueModel:
        """A value model written by :meth:`save`."""
        path = Path(path)
        if not (path / CONFIG_FILE).is_file():
            raise FileNotFoundError(f"{path} is not a saved value model (no {CONFIG_FILE}); "
                                    "for a backbone folder use ValueModel.from_pretrained")
        config = ValueModelConfig(**json.loads((path / CONFIG_FILE).read_text("utf-8")))
        model = AutoModelForSequenceClassification.from_pretrained(str(path))
        return cls(model, load_tokenizer(path), config)

    def save(self, path: str | Path) -> Path:
        """Model, tokenizer and config into the folder ``path`` (made if missing)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(path))
        self.tokenizer.save_pretrained(str(path))
        (path / CONFIG_FILE).write_text(json.dumps(asdict(self.config), indent=2), "utf-8")
        return path

    def token_ids(self, text: str) -> list[int]:
        """``text`` as at most ``max_tokens`` ids. The part after the last
        :data:`PATCH_HEADER` is kept whole when it fits in 3/4 of the budget (else its head);
        the part before it keeps its head and tail."""
        cut = text.rfind(PATCH_HEADER)
        context, patch = (text, "") if cut < 0 else (text[:cut], text[cut:])
        # Text that spells a special token (a pad token in a patch) stays plain text.
        ctx_ids, patch_ids = (self.tokenizer(part, add_special_tokens=False,
                                             split_special_tokens=True)["input_ids"]
                              for part in (context, patch))
        budget = self.config.max_tokens
        if len(ctx_ids) + len(patch_ids) <= budget:
            return ctx_ids + patch_ids
        patch_ids = patch_ids[:budget - min(len(ctx_ids), budget // 4)]
        room = budget - len(patch_ids)
        head = room // 2
        return ctx_ids[:head] + ctx_ids[len(ctx_ids) - (room - head):] + patch_ids

    def _batch(self, rows: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = pad_right(rows, self.tokenizer.pad_token_id, torch.long)
        mask = pad_right([[1] * len(r) for r in rows], 0, torch.long)
        return ids.to(self.device), mask.to(self.device)

    def _logits(self, rows: Sequence[list[int]]) -> torch.Tensor:
        ids, mask = self._batch(rows)
        return self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, 0]

    def train(self, examples: Sequence[tuple[str, bool]], *, report: Reporter | None = None
              ) -> dict[str, Any]:
        """Fit P(resolved | text) with binary cross-entropy, AdamW and gradient clipping;
        returns the mean loss of each epoch and the counts. ``report`` gets each epoch's mean
        loss under ``value/``."""
        if not examples:
            raise ValueError("no training examples: give (text, resolved) pairs from graded "
                             "rollouts (see training_examples)")
        for text, resolved in examples:
            if not isinstance(text, str) or not isinstance(resolved, bool):
                raise TypeError(f"a training example is (str, bool), got "
                                f"({type(text).__name__}, {type(resolved).__name__})")
        rows = [self.token_ids(text) for text, _ in examples]
        labels = torch.tensor([float(r) for _, r in examples])
        cfg = self.config
        generator = torch.Generator().manual_seed(cfg.seed)
        # torch's default weight decay (0.01), on every weight.
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr)
        params = list(self.model.parameters())
        self.model.train()
        report = section(report, "value")
        epoch_loss = []
        for epoch in range(cfg.epochs):
            losses = []
            for batch in torch.randperm(len(rows), generator=generator).split(cfg.batch_size):
                logits = self._logits([rows[i] for i in batch.tolist()])
                loss = F.binary_cross_entropy_with_logits(logits, labels[batch].to(self.device))
                optimizer_step(optimizer, params, [loss], grad_clip=1.0)
                losses.append(loss.item())
            epoch_loss.append(mean(losses))
            if report is not None:
                report.log({"loss": epoch_loss[-1]}, epoch)
        self.model.eval()
        return {"epoch_loss": epoch_loss, "examples": len(rows),
                "resolved": int(labels.sum().item()),
                "steps": cfg.epochs * math.ceil(len(rows) / cfg.batch_size)}

    @torch.no_grad()
    def score(self, texts: Sequence[str]) -> list[float]:
        """P(resolved) for each text."""
        self.model.eval()
        rows = [self.token_ids(t) for t in texts]
        out: list[float] = []
        for start in range(0, len(rows), self.config.batch_size):
            chunk = rows[start:start + self.config.batch_size]
            out += torch.sigmoid(self._logits(chunk).float()).tolist()
        return out


# --- best-of-N ----------------------------------------------------------------------------------

def added_lines(patch: str) -> set[str]:
    """The stripped, non-blank lines a unified diff adds."""
    return {line[1:].strip() for line in patch.splitlines()
            if line.startswith("+") and not line.startswith("+++") and line[1:].strip()}


def known_fixes(run_dirs: Iterable[str | Path]) -> set[str]:
    """Every line that a resolved rollout's patch in ``run_dirs`` added: what a lookup, the
    trivial reranker, remembers of training."""
    return {line for run_dir in run_dirs for r in read_results(Path(run_dir)) if r.resolved
            for line in added_lines(r.patch)}


def best_of_n(candidates_by_task: Mapping[str, Sequence[RolloutResult]],
              scores: Mapping[str, Sequence[float]], *,
              fixes: set[str] | None = None) -> dict[str, Any]:
    """Per task: the value pick (highest score; ties to the lowest sample index) and whether
    it resolved, the random pick's expected success (the fraction resolved) and the oracle's
    (whether any resolved); overall, their means over tasks. With ``fixes`` (``known_fixes``
    of the training runs) also the lookup pick's expected success: a random candidate among
    those adding a line some resolved training patch added (all when none does). Where
    held-out fixes repeat training ones, the lookup reranks without reading anything."""
    if not candidates_by_task:
        raise ValueError("no tasks to rerank")
    tasks = {}
    for tid, candidates in candidates_by_task.items():
        if tid not in scores:
            raise ValueError(f"no scores for task {tid}")
        if not candidates or len(candidates) != len(scores[tid]):
            raise ValueError(f"task {tid}: {len(candidates)} candidate(s) but "
                             f"{len(scores[tid])} score(s); give one score per candidate")
        if any(math.isnan(s) for s in scores[tid]):
            raise ValueError(f"task {tid}: a score is NaN")
        pairs = list(zip(candidates, map(float, scores[tid]), strict=True))
        pick, pick_score = min(pairs, key=lambda p: (-p[1], p[0].sample))
        resolved = sum(c.resolved for c in candidates)
        tasks[tid] = {"n": len(candidates), "resolved": resolved, "pick": pick.sample,
                      "pick_score": pick_score, "value": float(pick.resolved),
                      "random": resolved / len(candidates), "oracle": float(resolved > 0)}
        if fixes is not None:
            looked_up = [c for c in candidates if added_lines(c.patch) & fixes] or candidates
            tasks[tid]["lookup"] = sum(c.resolved for c in looked_up) / len(looked_up)
    picks = ("value", "random", "oracle") + (("lookup",) if fixes is not None else ())
    overall = {k: mean(t[k] for t in tasks.values()) for k in picks}
    overall |= {"n": max(t["n"] for t in tasks.values()), "tasks": len(tasks)}
    return {"overall": overall, "tasks": tasks}


def candidates(run_dir: str | Path, tasks: Iterable[Task]) -> dict[str, list[RolloutResult]]:
    """A run's graded rollouts grouped by task, each group in sample order."""
    groups: dict[str, list[RolloutResult]] = defaultdict(list)
    for r in sorted(_graded(Path(run_dir), _task_map(tasks)), key=lambda r: r.key):
        groups[r.instance_id].append(r)
    return dict(groups)


def rerank_run(run_dir: str | Path, tasks: Iterable[Task], model: ValueModel, *,
               text_of: TextOf = "patch", fixes: set[str] | None = None) -> dict[str, Any]:
    """Best-of-N over a run with several samples per task (its graded rollouts); ``fixes``
    adds the lookup pick (see ``best_of_n``)."""
    by_id = _task_map(tasks)
    groups = candidates(run_dir, by_id.values())
    texts = {tid: [candidate_text(by_id[tid], r, run_dir, text_of=text_of) for r in rs]
             for tid, rs in groups.items()}
    flat = model.score([t for ts in texts.values() for t in ts])
    scores, start = {}, 0
    for tid, ts in texts.items():
        scores[tid], start = flat[start:start + len(ts)], start + len(ts)
    report = best_of_n(groups, scores, fixes=fixes)
    report["run"] = {"run_dir": str(run_dir), "text_of": text_of}
    return report


# --- reranking by likelihood --------------------------------------------------------------------

@torch.no_grad()
def action_likelihood(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast,
                      trajectory: Trajectory) -> float:
    """The mean log-probability a causal LM gives a trajectory's assistant turns, each given
    the conversation before it (so what the agent read is in view); -inf for a conversation
    the chat template cannot render faithfully. Ranking samples by it needs no training
    (Codex's mean log-p reranking). A pretrained model's in-context copying favours a value
    the agent read over one it never saw."""
    try:
        ids, mask, _ = tokenize_conversation(tokenizer, trajectory.messages, trajectory.tools,
                                             range(len(trajectory.steps)))
    except ChatTemplateError:
        return -math.inf
    device = next(model.parameters()).device
    targets = shift(torch.tensor([mask], dtype=torch.bool, device=device))
    if not targets.any():
        return -math.inf
    logprobs, _ = token_logprobs(model, torch.tensor([ids], device=device), mask=targets,
                                 entropy=False)
    return (logprobs[targets].sum() / targets.sum()).item()


def likelihood_rerank(run_dir: str | Path, tasks: Iterable[Task], model: PreTrainedModel,
                      tokenizer: PreTrainedTokenizerFast, *,
                      fixes: set[str] | None = None) -> dict[str, Any]:
    """Best-of-N over a run by :func:`action_likelihood` under ``model`` (a rollout without a
    conversation ranks last)."""
    groups = candidates(run_dir, tasks)
    scores = {}
    for tid, rs in groups.items():
        scores[tid] = []
        for r in rs:
            try:
                trajectory = from_result(r, Path(run_dir))
            except (ValueError, OSError):
                scores[tid].append(-math.inf)
                continue
            scores[tid].append(action_likelihood(model, tokenizer, trajectory))
    report = best_of_n(groups, scores, fixes=fixes)
    report["run"] = {"run_dir": str(run_dir), "scorer": "likelihood"}
    return report


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def report_table(report: dict[str, Any], *, per_task: bool = True) -> Table:
    """The report of :func:`best_of_n` as a table: one row per task, then the overall rates."""
    o = report["overall"]
    picks = [k for k in ("value", "random", "lookup", "oracle") if k in o]
    table = Table(title=f"best-of-{o['n']} over {o['tasks']} task(s)")
    for col in ("task", "resolved", "value pick", *picks):
        table.add_column(col, justify="left" if col == "task" else "right")
    if per_task:
        for tid, t in report["tasks"].items():
            table.add_row(tid, f"{t['resolved']}/{t['n']}",
                          f"#{t['pick']} ({t['pick_score']:.3f})",
                          *[_pct(t[k]) if k in ("random", "lookup") else
                            ("yes" if t[k] else "no") for k in picks])
        table.add_section()
    table.add_row("overall", "", "", *[_pct(o[k]) for k in picks], style="bold")
    return table
