"""A generated task family small enough for a tiny policy to learn on a CPU in minutes.

Each task is a one-module repository, ``settings.py``, holding four constants; the issue says
which one has the wrong value and what it must be ("PORT in settings.py is 17; it should be
80."). The tests check every constant: the wrong one FAIL_TO_PASS, the others PASS_TO_PASS (so
a fix that breaks a neighbour fails). Each constant has one right value across the family; the
instances differ in which constant is wrong and how, and the held-out split holds (constant,
wrong value) pairs that no training task has.

Why fixed right values: a random-init model of ~1M parameters trained for minutes on a CPU
learns to pick a name out of the issue but not to copy an arbitrary number from it (copying
needs attention circuits that take far longer to form). A pretrained policy does not need the
simplification; the family keeps it so that the CPU demo measures the training pipeline, not
the limits of a tiny model.

Every task carries scripts for the scripted teacher (``metadata["teacher"]``): a solving one
(look, fix with sed, submit), and two failing ones — a fix followed by a breaking edit (a
rising then falling trajectory: what credit assignment learns from) and a wrong fix.
"""

from __future__ import annotations

import random

from orchard.domains.swe.model import Budget, RepoSource, SweTask, file_diff
from orchard.tasks.protocol import SUBMIT_COMMAND

MODULE = "settings.py"
TESTS = "test_settings.py"
RIGHT = {"TIMEOUT": 30, "RETRIES": 5, "PORT": 80, "WORKERS": 8}
"""Each constant's right value."""
WRONG_VALUES = range(2, 100)


def _module(values: dict[str, int]) -> str:
    return '"""Service settings."""\n' + "".join(f"{k} = {v}\n" for k, v in values.items())


def _tests(values: dict[str, int]) -> str:
    body = "import settings\n"
    for k, v in values.items():
        body += f"\n\ndef test_{k.lower()}():\n    assert settings.{k} == {v}\n"
    return body


def _sed(name: str, value: int) -> str:
    return f"sed -i 's/^{name} = .*/{name} = {value}/' {MODULE}"


def _task(rng: random.Random, index: int, split: str) -> SweTask:
    right = dict(RIGHT)
    wrong_name = rng.choice(list(right))
    new = right[wrong_name]
    wrong = {**right, wrong_name: rng.choice([v for v in WRONG_VALUES if v != new])}
    other = rng.choice([k for k in right if k != wrong_name])
    off_by = rng.choice([v for v in WRONG_VALUES if v not in (new, wrong[wrong_name])])
    look = ("Let me read the settings.", f"cat {MODULE}")
    fix = (f"{wrong_name} must be {new}.", _sed(wrong_name, new))
    done = ("Fixed; submitting.", SUBMIT_COMMAND)
    teacher = {
        "solve": [look, fix, done],
        "fail": [
            [look, fix, (f"{other} should change too.", _sed(other, right[other] + 1)), done],
            [look, (f"{wrong_name} must be {off_by}.", _sed(wrong_name, off_by)), done],
        ],
    }
    tests = [f"{TESTS}::test_{k.lower()}" for k in right]
    f2p = f"{TESTS}::test_{wrong_name.lower()}"
    statement = f"{wrong_name} in {MODULE} is {wrong[wrong_name]}; it should be {new}."
    return SweTask(
        instance_id=f"settings-{split}-{index:03d}", repo="orchard/settings-family",
        version="1", problem_statement=statement,
        patch=file_diff(MODULE, _module(wrong), _module(right)),
        test_patch=file_diff(TESTS, None, _tests(right)),
        FAIL_TO_PASS=[f2p], PASS_TO_PASS=[t for t in tests if t != f2p],
        source=RepoSource(kind="files", files={MODULE: _module(wrong),
                                               ".gitignore": "__pycache__/\n*.pyc\n"}),
        test_command=f"python3 -m pytest -rA -p no:cacheprovider {TESTS}",
        test_timeout=60, budget=Budget(steps=6, wall_time=120, tokens=4096),
        split=split, metadata={"family": "settings", "teacher": teacher})


def settings_family(n_train: int = 48, n_test: int = 16, seed: int = 0) -> list[SweTask]:
    """``n_train`` training and ``n_test`` held-out tasks; the same seed gives the same set."""
    if n_train < 0 or n_test < 0:
        raise ValueError("task counts must be >= 0")
    distinct = len(RIGHT) * (len(WRONG_VALUES) - 1)  # one per (name, wrong value)
    if n_train + n_test > distinct:
        raise ValueError(f"the family has {distinct} distinct tasks; ask for at most that many "
                         f"(got {n_train} + {n_test})")
    tasks: list[SweTask] = []
    seen: set[str] = set()
    for split, n in (("train", n_train), ("test", n_test)):
        rng = random.Random(f"{seed}-{split}")
        while len(tasks) < n + (n_train if split == "test" else 0):
            task = _task(rng, len(tasks) - (n_train if split == "test" else 0), split)
            # A statement names its task (the teacher finds its script by it): keep them unique.
            if task.problem_statement not in seen:
                seen.add(task.problem_statement)
                tasks.append(task)
    return tasks
