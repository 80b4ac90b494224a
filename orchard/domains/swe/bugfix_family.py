"""A generated family of bug fixes whose right answer is only in the sandbox.

Each task is a small package (``<pkg>/config.py``, ``<pkg>/ops.py``, ``<pkg>/text.py``) with a
spec (``docs/SPEC.md``) and visible tests (``tests/``). One thing is wrong, of three kinds:

- ``spec``: a constant in ``config.py`` disagrees with the spec; the right number (2-999) is
  written only in ``docs/SPEC.md``.
- ``operator``: a function in ``ops.py`` uses the wrong arithmetic operator; the visible
  test's message says what it should return for its inputs.
- ``string``: a string in ``text.py`` is wrong; the failing visible test shows the right one.

The issue says where the bug is, never what the fix is: a policy has to read the spec or run
the tests. Values, names and packages are drawn per task, so no two tasks share a fix and no
held-out task's solving script is a training task's (``bugfix_family`` checks this). A policy
that ignores what it reads can do no better than guess: ``blind_fix`` is the best such policy
built from the training tasks, and the tests show it scores near chance.

Grading runs hidden tests (``test_hidden.py``, the task's test patch) over every constant,
function and string, so a fix that breaks a neighbour fails. Every task carries scripts for the
scripted teacher, as the settings family's do (``metadata["teacher"]``).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from orchard.domains.swe.model import Budget, RepoSource, SweTask, file_diff
from orchard.tasks.protocol import SUBMIT_COMMAND

KINDS = ("spec", "operator", "string")
PACKAGES = ["billing", "inventory", "shipping", "metrics", "auth", "search", "payments",
            "catalog", "alerts", "reports", "ledger", "gateway", "scheduler", "profiles"]
CONSTANTS = ["PORT", "TIMEOUT", "RETRIES", "WORKERS", "BATCH_SIZE", "MAX_ITEMS", "CACHE_TTL",
             "PAGE_SIZE", "QUEUE_DEPTH", "BACKOFF_MS"]
FUNCTIONS = ["combine", "merge", "scale", "blend", "total", "shift", "accumulate", "mix",
             "fold", "join_counts"]
OPERATORS = ("+", "-", "*")
STRINGS = {"UNIT": ["km", "mi", "kg", "lb", "m", "ft", "l", "gal"],
           "CURRENCY": ["EUR", "USD", "GBP", "JPY", "CHF", "SEK", "NOK", "INR"],
           "LOCALE": ["en_US", "en_GB", "de_DE", "fr_FR", "es_ES", "it_IT", "ja_JP", "pt_BR"],
           "GREETING": ["hello", "welcome", "hi", "greetings", "good day", "hey", "howdy",
                        "salut"],
           "SEPARATOR": [",", ";", "|", "/", ":", "-", "+", "."]}
SPEC = "docs/SPEC.md"
HIDDEN_TESTS = "test_hidden.py"
NUMBERS = range(2, 1000)


def _apply(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


class _Repo:
    """One task's package: its right state, drawn from ``rng``."""

    def __init__(self, rng: random.Random) -> None:
        self.pkg = rng.choice(PACKAGES)
        self.constants = {k: rng.choice(NUMBERS) for k in rng.sample(CONSTANTS, 4)}
        self.functions = {f: rng.choice(OPERATORS) for f in rng.sample(FUNCTIONS, 3)}
        self.strings = {k: rng.choice(STRINGS[k]) for k in rng.sample(sorted(STRINGS), 3)}
        # Each function's visible example: inputs whose results tell the operators apart.
        self.examples = {f: (rng.randrange(4, 10), rng.randrange(2, 4)) for f in self.functions}

    def config(self, constants: dict[str, int]) -> str:
        return '"""Service settings: see docs/SPEC.md."""\n' + "".join(
            f"{k} = {v}\n" for k, v in constants.items())

    def ops(self, functions: dict[str, str]) -> str:
        return '"""Arithmetic helpers."""\n' + "".join(
            f"\n\ndef {f}(a, b):\n    return a {op} b\n" for f, op in functions.items())

    def text(self, strings: dict[str, str]) -> str:
        return '"""User-facing text."""\n' + "".join(
            f'{k} = "{v}"\n' for k, v in strings.items())

    def spec(self) -> str:
        lines = [f"# {self.pkg} specification", "", "## Settings (config.py)", ""]
        lines += [f"- {k}: {v}" for k, v in self.constants.items()]
        return "\n".join(lines) + "\n"

    def visible_tests(self) -> dict[str, str]:
        ops = f"from {self.pkg} import ops\n"
        for f, (a, b) in self.examples.items():
            want = _apply(self.functions[f], a, b)
            ops += (f"\n\ndef test_{f}():\n    assert ops.{f}({a}, {b}) == {want}, "
                    f"\"{f}({a}, {b}) should be {want}\"\n")
        text = f"from {self.pkg} import text\n"
        for k, v in self.strings.items():
            text += f'\n\ndef test_{k.lower()}():\n    assert text.{k} == "{v}"\n'
        return {"tests/test_ops.py": ops, "tests/test_text.py": text}

    def hidden_tests(self) -> tuple[str, list[str]]:
        body = f"from {self.pkg} import config, ops, text\n"
        names = []
        for k, v in self.constants.items():
            names.append(f"test_config_{k.lower()}")
            body += f"\n\ndef {names[-1]}():\n    assert config.{k} == {v}\n"
        for f, op in self.functions.items():
            names.append(f"test_ops_{f}")
            cases = ", ".join(f"({a}, {b}, {_apply(op, a, b)})"
                              for a, b in ((7, 3), (12, 5), (2, 9)))
            body += (f"\n\ndef {names[-1]}():\n    for a, b, want in [{cases}]:\n"
                     f"        assert ops.{f}(a, b) == want\n")
        for k, v in self.strings.items():
            names.append(f"test_text_{k.lower()}")
            body += f'\n\ndef {names[-1]}():\n    assert text.{k} == "{v}"\n'
        return body, names

    def files(self, constants: dict[str, int], functions: dict[str, str],
              strings: dict[str, str]) -> dict[str, str]:
        return {f"{self.pkg}/__init__.py": "", f"{self.pkg}/config.py": self.config(constants),
                f"{self.pkg}/ops.py": self.ops(functions),
                f"{self.pkg}/text.py": self.text(strings), SPEC: self.spec(),
                **self.visible_tests(), ".gitignore": "__pycache__/\n*.pyc\n"}


def _esc(s: str) -> str:
    """``s`` taken literally by a sed basic regex (or replacement); no value holds a quote."""
    return "".join("\\" + c if c in "\\/.*[]^$&" else c for c in s)


def _sed(path: str, old: str, new: str, *, within: str | None = None) -> str:
    """A sed command replacing the line that the basic regex ``old`` matches by ``new`` in
    ``path``; with ``within`` (a function's name) only inside that function, since two
    helpers may share a line."""
    where = f"/^def {within}(/,/return/ " if within else ""
    return f"sed -i '{where}s/^{old}$/{_esc(new)}/' {path}"


def _buggy_line(kind: str, name: str) -> str:
    """A regex for the buggy line built from the issue's words alone. A fix written with it
    needs nothing the agent has not read: the wrong value is never shown, so a
    demonstration that matched it would teach a policy to guess it."""
    if kind == "operator":
        return _esc("    return a ") + "." + _esc(" b")
    return _esc(f"{name} = ") + ".*"


def _bug(repo: _Repo, kind: str, rng: random.Random) -> dict[str, Any]:
    """The wrong state, the issue's words, and the lines a fix (and a wrong fix) changes."""
    constants, functions, strings = (dict(repo.constants), dict(repo.functions),
                                     dict(repo.strings))
    if kind == "spec":
        name = rng.choice(list(constants))
        wrong = rng.choice([v for v in NUMBERS if v != constants[name]])
        decoy = rng.choice([v for v in NUMBERS if v not in (wrong, constants[name])])
        constants[name] = wrong
        path, look = f"{repo.pkg}/config.py", ("Let me read the spec.", f"cat {SPEC}")
        issue = f"{name} in {path} does not match the spec."
        line = (f"{name} = {wrong}", f"{name} = {repo.constants[name]}", f"{name} = {decoy}")
        test = f"test_config_{name.lower()}"
    elif kind == "operator":
        name = rng.choice(list(functions))
        right = functions[name]
        wrong, decoy = rng.sample([op for op in OPERATORS if op != right], 2)
        functions[name] = wrong
        path = f"{repo.pkg}/ops.py"
        look = ("Let me run the tests.", "python3 -m pytest -q -p no:cacheprovider tests")
        issue = f"{name}() in {path} returns wrong results."
        line = (f"    return a {wrong} b", f"    return a {right} b", f"    return a {decoy} b")
        test = f"test_ops_{name}"
    else:
        name = rng.choice(list(strings))
        wrong, decoy = rng.sample([s for s in STRINGS[name] if s != strings[name]], 2)
        strings[name] = wrong
        path = f"{repo.pkg}/text.py"
        look = ("Let me run the tests.", "python3 -m pytest -q -p no:cacheprovider tests")
        issue = f"{name} in {path} is wrong."
        line = (f'{name} = "{wrong}"', f'{name} = "{repo.strings[name]}"',
                f'{name} = "{decoy}"')
        test = f"test_text_{name.lower()}"
    return {"files": repo.files(constants, functions, strings), "path": path, "look": look,
            "issue": issue, "line": line, "test": test, "name": name}


def _neighbour_break(repo: _Repo, path: str) -> str:
    """A command that breaks something the fix did not touch: the first constant, off by one
    (or, when the bug is in config.py, the first string)."""
    if path.endswith("config.py"):
        k, v = next(iter(repo.strings.items()))
        return _sed(f"{repo.pkg}/text.py", _esc(f'{k} = "{v}"'), f'{k} = "{v}_"')
    k, n = next(iter(repo.constants.items()))
    return _sed(f"{repo.pkg}/config.py", _esc(f"{k} = {n}"), f"{k} = {n + 1}")


def _task(rng: random.Random, index: int, split: str, kinds: Sequence[str]) -> SweTask:
    repo = _Repo(rng)
    kind = kinds[index % len(kinds)]
    bug = _bug(repo, kind, rng)
    wrong_line, right_line, decoy_line = bug["line"]
    number = rng.randrange(1000, 10000)
    look = bug["look"]
    within = bug["name"] if kind == "operator" else None
    buggy = _buggy_line(kind, bug["name"])
    fix = (f"The fix: `{right_line.strip()}`.",
           _sed(bug["path"], buggy, right_line, within=within))
    done = ("Fixed; submitting.", SUBMIT_COMMAND)
    breaking = _neighbour_break(repo, bug["path"])
    teacher = {"solve": [look, fix, done],
               "fail": [[look, fix, ("One more change.", breaking), done],
                        [look, (f"The fix: `{decoy_line.strip()}`.",
                                _sed(bug["path"], buggy, decoy_line, within=within)),
                         done]]}
    hidden, tests = repo.hidden_tests()
    right_files = repo.files(repo.constants, repo.functions, repo.strings)
    path = bug["path"]
    return SweTask(
        instance_id=f"bugfix-{split}-{index:03d}", repo=f"orchard/bugfix-{repo.pkg}",
        version="1", problem_statement=f"Issue #{number}: {bug['issue']}",
        patch=file_diff(path, bug["files"][path], right_files[path]),
        test_patch=file_diff(HIDDEN_TESTS, None, hidden),
        FAIL_TO_PASS=[f"{HIDDEN_TESTS}::{bug['test']}"],
        PASS_TO_PASS=[f"{HIDDEN_TESTS}::{t}" for t in tests if t != bug["test"]],
        source=RepoSource(kind="files", files=bug["files"]),
        test_command=f"python3 -m pytest -rA -p no:cacheprovider {HIDDEN_TESTS}",
        test_timeout=60, budget=Budget(steps=6, wall_time=120, tokens=6144), split=split,
        metadata={"family": "bugfix", "kind": kind, "teacher": teacher,
                  "fix": {"path": path, "wrong": wrong_line, "right": right_line,
                          "name": bug["name"]}})


def blind_fix(train: Sequence[SweTask]) -> Callable[[SweTask], str]:
    """The best policy that never reads the sandbox: from a task's issue alone (its kind, file
    and name), it writes the right line most often seen for that name in ``train`` (or for
    its kind), whatever the line holds now. Returns task -> the shell command it runs."""
    seen: dict[tuple[str, str], Counter[str]] = {}
    for task in train:
        fix = task.metadata["fix"]
        for key in ((task.metadata["kind"], fix["name"]), (task.metadata["kind"], "")):
            seen.setdefault(key, Counter())[fix["right"]] += 1

    def command(task: SweTask) -> str:
        kind, fix = task.metadata["kind"], task.metadata["fix"]
        votes = seen.get((kind, fix["name"])) or seen.get((kind, ""))
        if not votes:
            return "true"
        guess = votes.most_common(1)[0][0]
        if kind != "operator":  # the line most seen for another name: keep this one's name
            guess = f"{fix['name']} = {guess.split(' = ', 1)[1]}"
        return _sed(fix["path"], _buggy_line(kind, fix["name"]), guess,
                    within=fix["name"] if kind == "operator" else None)
    return command


def solving_script(task: SweTask) -> tuple[str, ...]:
    """The commands of a task's solving script: what no other task may share."""
    return tuple(command for _, command in task.metadata["teacher"]["solve"])


def bugfix_family(n_train: int = 128, n_test: int = 64, seed: int = 0,
                  kinds: Sequence[str] = KINDS) -> list[SweTask]:
    """``n_train`` training and ``n_test`` held-out tasks, ``kinds`` in turn; the same seed
    gives the same set. No two tasks share an issue text or a solving script."""
    if n_train < 0 or n_test < 0:
        raise ValueError("task counts must be >= 0")
    if not kinds or set(kinds) - set(KINDS):
        raise ValueError(f"kinds must be some of {', '.join(KINDS)}; got {list(kinds)}")
    tasks: list[SweTask] = []
    statements: set[str] = set()
    scripts: set[tuple[str, ...]] = set()
    for split, n in (("train", n_train), ("test", n_test)):
        rng = random.Random(f"bugfix-{seed}-{split}")
        made = 0
        for _ in range(50 * n + 50):
            if made == n:
                break
            task = _task(rng, made, split, kinds)
            # A statement names its task (the teacher finds its script by it).
            if task.problem_statement in statements or solving_script(task) in scripts:
                continue
            statements.add(task.problem_statement)
            scripts.add(solving_script(task))
            tasks.append(task)
            made += 1
        else:
            raise ValueError(f"could not draw {n} distinct {split} tasks")
    return tasks
