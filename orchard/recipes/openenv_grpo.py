"""GRPO with TRL against an Orchard OpenEnv server (``orchard openenv serve``).

``OrchardRollouts`` is a ``rollout_func`` for ``trl.GRPOTrainer``: for each prompt of the
batch (a task's prompt; TRL repeats it ``num_generations`` times) the policy writes one
completion, and that completion is played as one episode of the task on the server: each
fenced ```bash block is run as a command in the episode's sandbox, in order, and the rest of
the text is submitted as the answer. The task's own grading gives the reward, which reaches
the trainer as the ``env_reward`` column that the ``env_reward`` reward function returns.

    dataset = task_dataset(tasks)
    rollouts = OrchardRollouts("http://127.0.0.1:8000", tasks)
    trainer = GRPOTrainer(model, reward_funcs=env_reward, train_dataset=dataset,
                          rollout_func=rollouts, args=GRPOConfig(num_generations=4, ...))

One model turn per episode: a command's output is not fed back to the policy.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from datasets import Dataset

from orchard.openenv import TaskAction, TaskEnv
from orchard.tasks.protocol import Task

COMMAND_BLOCK = re.compile(r"```(?:bash|sh)[ \t]*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class Episode:
    """One completion as the server played it: the task's grade and what it earned."""

    task_id: str
    episode_id: str
    commands: int
    reward: float
    outcome: str


def task_dataset(tasks: Sequence[Task]) -> Dataset:
    """One conversational row per task: its prompt as the user's message, and its id."""
    return Dataset.from_list([{"prompt": [{"role": "user", "content": t.prompt}],
                               "task_id": t.instance_id} for t in tasks])


def env_reward(completions: list[Any], env_reward: list[float], **kwargs: Any) -> list[float]:
    """The reward function for GRPOTrainer: the grade each completion's episode earned."""
    return [float(r) for r in env_reward]


def split_completion(text: str) -> tuple[list[str], str]:
    """(the fenced bash blocks, in order; the text around them, the answer)."""
    return COMMAND_BLOCK.findall(text), COMMAND_BLOCK.sub("", text).strip()


class OrchardRollouts:
    """``rollout_func`` for GRPOTrainer: completions by the trainer's model, each played as an
    episode of its prompt's task on the OpenEnv server at ``base_url`` (``concurrency``
    episodes at once; the server's --max-sessions must allow them). ``episodes`` keeps every
    episode played, in order."""

    def __init__(self, base_url: str, tasks: Sequence[Task], *, max_commands: int = 8,
                 concurrency: int = 4) -> None:
        self.base_url = base_url
        self.max_commands = max_commands
        self.concurrency = concurrency
        self.task_ids: dict[str, str] = {}
        for t in tasks:
            if self.task_ids.setdefault(t.prompt, t.instance_id) != t.instance_id:
                raise ValueError(f"tasks {self.task_ids[t.prompt]} and {t.instance_id} have "
                                 "the same prompt: a completion could not tell them apart")
        self.episodes: list[Episode] = []

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        tokenizer = trainer.processing_class
        prompt_ids = [tokenizer.apply_chat_template(p, add_generation_prompt=True,
                                                    tokenize=True, return_dict=False)
                      for p in prompts]
        completion_ids, logprobs = self._generate(trainer, prompt_ids)
        texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        task_ids = [self._task_id(p) for p in prompts]
        with ThreadPoolExecutor(self.concurrency) as pool:
            played = list(pool.map(self._play, task_ids, texts))
        self.episodes.extend(played)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids,
                "logprobs": logprobs, "env_reward": [e.reward for e in played],
                "episode_id": [e.episode_id for e in played]}

    def _task_id(self, prompt: Any) -> str:
        text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        try:
            return self.task_ids[text]
        except KeyError:
            raise ValueError(f"no task has the prompt {text[:80]!r}: build the dataset with "
                             "task_dataset(tasks) from the tasks given here") from None

    @torch.no_grad()
    def _generate(self, trainer: Any, prompt_ids: list[list[int]]
                  ) -> tuple[list[list[int]], list[list[float]]]:
        """One sampled completion per prompt, cut after its end token, with the sampling
        distribution's log-prob of each token."""
        args, tokenizer = trainer.args, trainer.processing_class
        model = trainer.accelerator.unwrap_model(trainer.model)
        width = max(map(len, prompt_ids))
        pad = tokenizer.pad_token_id
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_ids])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids])
        out = model.generate(
            input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
            do_sample=True, temperature=args.temperature, top_p=args.top_p,
            max_new_tokens=args.max_completion_length, pad_token_id=pad,
            return_dict_in_generate=True, output_scores=True)
        scores = model.compute_transition_scores(out.sequences, out.scores,
                                                 normalize_logits=True)
        ends = set(trainer.eos_token_ids) if hasattr(trainer, "eos_token_ids") else {
            tokenizer.eos_token_id}
        completions, logprobs = [], []
        for row, row_scores in zip(out.sequences[:, width:].tolist(), scores.tolist(),
                                   strict=True):
            cut = next((i + 1 for i, t in enumerate(row) if t in ends), len(row))
            completions.append(row[:cut])
            logprobs.append(row_scores[:cut])
        return completions, logprobs

    def _play(self, task_id: str, text: str) -> Episode:
        commands, answer = split_completion(text)
        commands = commands[:self.max_commands]
        with TaskEnv(base_url=self.base_url).sync() as env:
            result = env.reset(task_id=task_id)
            for command in commands:
                result = env.step(TaskAction(command=command))
                if result.done:  # the task's step budget ran out
                    break
            if not result.done:
                result = env.step(TaskAction(submit=True, answer=answer or None))
            state = env.state()
        grade = result.observation.grade or {}
        return Episode(task_id, str(state.episode_id), len(commands), float(result.reward or 0),
                       str(grade.get("outcome", "")))
