"""The personal-assistant domain, bundled: requests over a seeded world (hand-written and
generated sets, YAML files), the tool-calling assistant and its scripted teacher, validation by
the gold run, and the demo adapter."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from orchard.domains.assistant import ASSISTANT_SETS, load_assistant_tasks, validate_assistant
from orchard.domains.assistant.model import AssistantTask
from orchard.domains.domain import Domain, Episodes, HarnessOptions, Listing, validate_each


class AssistantSource:
    """The assistant sets (hand-written, generated, both) and YAML files of assistant tasks
    (a task seeds a ``world:``)."""

    names: Sequence[str] = ASSISTANT_SETS

    def accepts(self, path: Path) -> bool:
        if path.suffix.lower() not in (".yaml", ".yml"):
            return False
        text = path.read_text(errors="replace") if path.is_file() else ""
        return re.search(r"^\s*-?\s*world:", text, re.MULTILINE) is not None

    def load(self, source: str | Path, *, split: str | None = None,
             ids: Iterable[str] | None = None) -> list[AssistantTask]:
        keep = set(ids) if ids else None
        return [t for t in load_assistant_tasks(source, split=split)
                if keep is None or t.instance_id in keep]


def _judge(options: HarnessOptions) -> Any:
    from orchard.domains.assistant.judge import RubricJudge

    return (RubricJudge(options.judge_url, options.judge_model or "judge")
            if options.judge_url else None)


def _assistant_teacher(tasks: Sequence[Any], options: HarnessOptions) -> Any:
    from orchard.domains.assistant.harness import AssistantTeacherHarness

    return AssistantTeacherHarness(tasks, solve=options.teacher_solve, judge=_judge(options))


def _assistant(tasks: Sequence[Any], options: HarnessOptions) -> Any:
    from orchard.domains.assistant.harness import AssistantHarness

    return AssistantHarness(*options.require_model("assistant"),
                            render_with=options.render_with, judge=_judge(options))


def _row(a: AssistantTask) -> tuple[str, ...]:
    return (a.instance_id, a.split or "", ",".join(c.name for c in a.checks),
            str(len(a.rubric)), a.goal)


def _demo(agent_config: dict[str, Any]) -> Any:
    from orchard.domains.assistant.demo import AssistantFamily

    return AssistantFamily()


def _mcp(sandbox: Any) -> Any:
    from orchard.domains.assistant.mcp_client import mcp_session

    return mcp_session(sandbox)


ASSISTANT = Domain(
    name="assistant", task_type=AssistantTask, source=AssistantSource(),
    harnesses={"assistant-teacher": _assistant_teacher, "assistant": _assistant},
    validate=validate_each(validate_assistant),
    listing=Listing(("instance_id", "split", "checks", "rubric", "goal"), _row,
                    frozenset({"gold", "world"})),
    demos={"assistant": _demo},
    episodes=Episodes(mcp=_mcp))
