"""The format-only control: SFT examples that teach the tool-call form and nothing of the skill.

Each conversation opens as a real mini-swe-agent rollout of a training task does (its system
and user turns rendered from the agent config, the bash tool offered), then the assistant
looks around with commands that change nothing (``ls``, ``git status``, ``cat`` or ``head``
of a file the fix does not touch) and submits. Observations are what those commands print in
the task's fresh workspace, computed from its inline files and rendered with the config's
observation template. Every assistant turn is trained, under the same masks as SFT examples
(``build_sft_dataset``). Trained on these, a policy gains the format and no fix; compared with
SFT on real rollouts, the gap is the skill.

    examples = format_control_examples(train_tasks, tokenizer, samples=2, seed=0)
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jinja2 import StrictUndefined, Template

from orchard.domains.swe.minisweagent import config_from_specs
from orchard.domains.swe.model import SweTask, patch_files
from orchard.recipes.demo import COMPACT_CONFIG
from orchard.recipes.sft import SFTExample, build_sft_dataset
from orchard.recipes.trajectories import Trajectory
from orchard.tasks.protocol import SUBMIT_COMMAND

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

THOUGHTS = ("Let me look around.", "Let me check the repository.", "I will look first.")
DONE = "Submitting."


def _render(template: str, **variables: Any) -> str:
    return Template(template, undefined=StrictUndefined).render(**variables)


def _ls(files: Mapping[str, Any]) -> str:
    # `ls` in a pipe: one name a line, sorted; .git and dotfiles hidden.
    top = {path.split("/", 1)[0] for path in files}
    return "".join(f"{name}\n" for name in sorted(top) if not name.startswith("."))


def _head(text: str, n: int) -> str:
    return "".join(text.splitlines(keepends=True)[:n])


def looks(task: SweTask) -> list[tuple[str, str]]:
    """(command, its output in the fresh workspace) for each look-around command of
    ``task``: none edits a file, and none reads a file the gold patch touches."""
    if task.source.kind != "files" or not task.source.files:
        raise ValueError(f"{task.instance_id}: the format control computes its observations "
                         f"from inline files (source.kind 'files', as the generated families "
                         f"have); this task's repository is {task.source.kind!r}")
    touched = set(patch_files(task.patch))
    found = [("ls", _ls(task.source.files)), ("git status --short", "")]
    for path, content in sorted(task.source.files.items()):
        if path in touched or not isinstance(content, str) or not content:
            continue
        found += [(f"cat {path}", content), (f"head -n 5 {path}", _head(content, 5))]
    return found


def opening_messages(task: SweTask, config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The system and user turns a mini-swe-agent rollout of ``task`` opens with under
    ``config``, for templates that use no variable but ``task`` (the compact config's)."""
    agent = config.get("agent", {})
    return [{"role": "system", "content": _render(agent["system_template"],
                                                  task=task.problem_statement)},
            {"role": "user", "content": _render(agent["instance_template"],
                                                task=task.problem_statement)}]


def format_control_conversation(task: SweTask, config: Mapping[str, Any],
                                rng: random.Random) -> list[dict[str, Any]]:
    """One conversation (OpenAI-shaped messages): the rollout's opening turns, one or two
    look-around calls with their observations, then the submission."""
    model = config.get("model", {})
    messages = opening_messages(task, config)
    chosen = rng.sample(looks(task), rng.choice((1, 2)))
    for i, (command, output) in enumerate([*chosen, (SUBMIT_COMMAND, None)]):
        call_id = f"call_{i}"
        thought = DONE if output is None else rng.choice(THOUGHTS)
        messages.append({"role": "assistant", "content": thought, "tool_calls": [
            {"id": call_id, "type": "function", "function": {
                "name": "bash", "arguments": json.dumps({"command": command})}}]})
        if output is not None:  # the submission ends the rollout before any observation
            content = _render(model["observation_template"], output={
                "output": output, "returncode": 0, "exception_info": ""})
            messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
    return messages


def format_control_examples(
    tasks: Sequence[SweTask],
    tokenizer: PreTrainedTokenizerBase,
    *,
    config: Mapping[str, Any] | None = None,
    samples: int = 1,
    seed: int = 0,
    max_tokens: int = 8192,
) -> list[SFTExample]:
    """``samples`` format-only examples per task (see the module doc), every assistant turn
    trained. ``config``: the mini-swe-agent config the real rollouts run (default the demo's
    compact one), whose templates give the system, user and observation turns. Raises
    ValueError when a conversation cannot be masked or is over ``max_tokens``."""
    from minisweagent.models.utils.actions_toolcall import BASH_TOOL

    config = config if config is not None else config_from_specs([COMPACT_CONFIG])
    rng = random.Random(f"format-control-{seed}")
    trajectories = [
        Trajectory(rollout_id=f"format-control.{task.instance_id}.{k}",
                   instance_id=task.instance_id,
                   messages=format_control_conversation(task, config, rng),
                   tools=[BASH_TOOL], resolved=True, reward=0.0,
                   metadata={"control": "format"})
        for task in tasks for k in range(samples)]
    examples, dropped = build_sft_dataset(trajectories, {}, tokenizer, max_tokens=max_tokens)
    if dropped:
        rollout, why = next(iter(dropped.items()))
        raise ValueError(f"{len(dropped)} format-control conversations cannot be trained "
                         f"({rollout}: {why}); raise max_tokens or check the chat template")
    return examples
