"""The software-engineering domain, bundled: SWE-bench-style tasks (files, the bundled set,
HumanEval, the generated settings and bug-fix families), mini-swe-agent and its harnesses,
validation by the gold patch, and the demo adapters of both families."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from orchard.domains.domain import Domain, Episodes, HarnessOptions, Listing
from orchard.domains.swe.loaders import NAMED_SETS, load_tasks
from orchard.domains.swe.model import SweTask
from orchard.domains.swe.swebench_datasets import is_hub_id
from orchard.env.client import Sandbox, SandboxClient
from orchard.tasks.protocol import Submission


class SweSource:
    """The named SWE sets, any task file or directory but a YAML file (web and assistant
    task files are YAML; a SWE task directory holds its task.yaml inside), and Hugging Face
    dataset ids of SWE-bench instances."""

    names: Sequence[str] = NAMED_SETS

    def accepts(self, path: Path) -> bool:
        return path.suffix.lower() not in (".yaml", ".yml")

    def accepts_name(self, name: str) -> bool:
        return is_hub_id(name)

    def load(self, source: str | Path, *, split: str | None = None,
             ids: Iterable[str] | None = None) -> list[SweTask]:
        return load_tasks(source, split=split, ids=ids)


def _oracle(tasks: Sequence[Any], options: HarnessOptions) -> Any:
    from orchard.domains.swe.harness import OracleHarness

    return OracleHarness()


def _teacher(tasks: Sequence[Any], options: HarnessOptions) -> Any:
    from orchard.domains.swe.harness import TeacherHarness

    return TeacherHarness(tasks, solve=options.teacher_solve, config=options.config)


def _mini_swe_agent(tasks: Sequence[Any], options: HarnessOptions) -> Any:
    from orchard.domains.swe.harness import MiniSweAgentHarness

    if not options.model_url or not options.model:
        raise ValueError("the mini-swe-agent harness needs --model-url (an OpenAI-"
                         "compatible server, e.g. http://127.0.0.1:8000) and --model "
                         "(the name it serves)")
    return MiniSweAgentHarness(options.model_url, options.model, token_ids=options.token_ids,
                               config=options.config, render_with=options.render_with)


def _validate(client: SandboxClient, tasks: Sequence[Any], concurrency: int,
              on_done: Any) -> list[Any]:
    from orchard.domains.swe.validate import validate_tasks

    return validate_tasks(client, list(tasks), concurrency=concurrency, on_done=on_done)


def _row(t: SweTask) -> tuple[str, ...]:
    return (t.instance_id, t.split or "", str(t.metadata.get("bug_kind", "")),
            str(len(t.FAIL_TO_PASS)), str(len(t.PASS_TO_PASS)), str(t.image))


def _settings_demo(agent_config: dict[str, Any]) -> Any:
    from orchard.domains.swe.demo import SweFamily

    return SweFamily(agent_config)


def _bugfix_demo(agent_config: dict[str, Any]) -> Any:
    from orchard.domains.swe.bugfix_family import bugfix_family
    from orchard.domains.swe.demo import SweFamily

    return SweFamily(agent_config, bugfix_family)


def _bugfix_read_demo(agent_config: dict[str, Any]) -> Any:
    """The bug-fix family's operator and string bugs: the two kinds whose right value a
    failing visible test shows, so a run of the tests tells the policy the fix."""
    from functools import partial

    from orchard.domains.swe.bugfix_family import bugfix_family
    from orchard.domains.swe.demo import SweFamily

    return SweFamily(agent_config, partial(bugfix_family, kinds=("operator", "string")))


def _workdir(task: SweTask) -> str:
    return task.workdir


def _submission(task: SweTask, sandbox: Sandbox, setup: Any, answer: str | None) -> Submission:
    """The workspace's diff against the base commit ``set_up`` made: what the runner grades."""
    from orchard.domains.swe.workspace import workspace_patch

    return Submission(patch=workspace_patch(sandbox, task, setup.base_commit), answer=answer)


SWE = Domain(
    name="swe", task_type=SweTask, source=SweSource(),
    harnesses={"oracle": _oracle, "teacher": _teacher, "mini-swe-agent": _mini_swe_agent},
    validate=_validate,
    listing=Listing(("instance_id", "split", "kind", "F2P", "P2P", "image"), _row,
                    frozenset({"patch", "test_patch", "source"})),
    demos={"swe": _settings_demo, "bugfix": _bugfix_demo, "bugfix-read": _bugfix_read_demo},
    episodes=Episodes(workdir=_workdir, submission=_submission))
