"""Grading in fresh sandboxes: every outcome, every repository source, task validation, and
the bundled task sets (all bundled tasks must validate; CI runs this)."""

from __future__ import annotations

import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard.domains.swe import (
    RepoSource,
    SweTask,
    file_diff,
    grade,
    load_tasks,
    validate_task,
    validate_tasks,
)
from orchard.env.client import SandboxClient
from tests.conftest import needs_root

pytestmark = needs_root

LABELS = {"test": "grading"}
BUGGY = 'def add(a, b):\n    """The sum of a and b."""\n    return a - b\n\n\ndef neg(a):\n' \
        '    return -a\n'
FIXED = BUGGY.replace("return a - b", "return a + b")
OLD_TESTS = ("from calc import add, neg\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n\n\n"
             "def test_right_zero():\n    assert add(7, 0) == 7\n\n\n"
             "def test_neg():\n    assert neg(2) == -2\n")
NEW_TESTS = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
FILES = {"calc.py": BUGGY, "tests/test_calc.py": OLD_TESTS, ".gitignore": "__pycache__/\n"}
GOLD = file_diff("calc.py", BUGGY, FIXED)
P2P = ["tests/test_calc.py::test_zero", "tests/test_calc.py::test_right_zero",
       "tests/test_calc.py::test_neg"]


def calc_task(**overrides: object) -> SweTask:
    fields: dict[str, object] = dict(
        instance_id="calc-1", problem_statement="add() subtracts", patch=GOLD,
        test_patch=file_diff("tests/test_add.py", None, NEW_TESTS),
        FAIL_TO_PASS=["tests/test_add.py::test_add"], PASS_TO_PASS=P2P,
        source=RepoSource(kind="files", files=FILES))
    return SweTask(**(fields | overrides))


@pytest.fixture(scope="module")
def client(orchestrator: str) -> Iterator[SandboxClient]:
    with SandboxClient(orchestrator) as c:
        yield c
        # Grading deletes its sandbox whatever happened: nothing of this module is left.
        assert c.list_sandboxes(labels=LABELS) == []


def test_the_gold_patch_resolves(client: SandboxClient) -> None:
    g = grade(client, calc_task(), GOLD, labels=LABELS)
    assert (g.resolved, g.reward, g.outcome, g.reason) == (True, 1.0, "resolved", "")
    assert g.patch_method == "git apply"
    assert (g.f2p_total, g.f2p_passed, g.p2p_total, g.p2p_passed) == (1, 1, 3, 3)
    assert "PASSED tests/test_add.py::test_add" in g.test_output_tail
    assert g.test_exit_code == 0 and g.grading_seconds > 0 and g.sandbox_id


def test_no_submission_is_minus_one_without_a_sandbox(client: SandboxClient) -> None:
    for patch in (None, "", "  \n"):
        g = grade(client, calc_task(), patch, labels=LABELS)
        assert (g.resolved, g.reward, g.outcome, g.sandbox_id) == (False, -1.0, "empty_patch",
                                                                    None)


def test_a_patch_that_does_not_apply(client: SandboxClient) -> None:
    bad = file_diff("calc.py", "something else\n", "entirely\n")
    g = grade(client, calc_task(), bad, labels=LABELS)
    assert (g.resolved, g.reward, g.outcome) == (False, -1.0, "patch_failed")
    assert [a.split(":")[0] for a in g.patch_attempts] == [
        "git apply", "git apply --reject", "patch --fuzz=5"]
    assert "does not apply" in g.reason


def test_a_stale_patch_applies_with_fuzz(client: SandboxClient) -> None:
    # Written against a tree whose context line differs: git refuses, patch's fuzz does not.
    stale = GOLD.replace(' """The sum of a and b."""', ' """Sum of a and b."""')
    assert stale != GOLD
    g = grade(client, calc_task(), stale, labels=LABELS)
    assert g.resolved and g.patch_method == "patch --fuzz=5"
    assert len(g.patch_attempts) == 2


def test_a_patch_that_edits_the_tests_is_not_graded(client: SandboxClient) -> None:
    cheat = GOLD + file_diff("tests/test_calc.py", OLD_TESTS, OLD_TESTS + "# ok\n")
    g = grade(client, calc_task(), cheat, labels=LABELS)
    assert (g.resolved, g.outcome, g.sandbox_id) == (False, "edits_tests", None)
    assert "tests/test_calc.py" in g.reason
    # Creating the file the test patch adds is editing the tests too.
    g = grade(client, calc_task(), file_diff("tests/test_add.py", None, "x = 1\n"),
              labels=LABELS)
    assert g.outcome == "edits_tests" and "tests/test_add.py" in g.reason


def test_a_fix_that_breaks_other_tests(client: SandboxClient) -> None:
    breaks = file_diff("calc.py", BUGGY, FIXED.replace("return -a", "return a"))
    g = grade(client, calc_task(), breaks, labels=LABELS)
    assert (g.resolved, g.outcome) == (False, "tests_failed")
    assert g.p2p_failing == ["tests/test_calc.py::test_neg"] and g.f2p_failing == []
    assert (g.f2p_passed, g.p2p_passed) == (1, 2)
    assert "1/3 PASS_TO_PASS broken" in g.reason


def test_tests_that_run_too_long_are_killed_and_not_resolved(client: SandboxClient) -> None:
    slow = "import time\n\n\ndef test_add():\n    time.sleep(60)\n"
    task = calc_task(test_patch=file_diff("tests/test_add.py", None, slow), test_timeout=2)
    g = grade(client, task, GOLD, labels=LABELS)
    assert (g.resolved, g.reward, g.outcome) == (False, -1.0, "test_timeout")
    assert "2 s" in g.reason and g.test_seconds < 60


def test_a_failing_pre_command_is_a_setup_failure(client: SandboxClient) -> None:
    task = calc_task(pre_commands=["echo installing; exit 3"])
    g = grade(client, task, GOLD, labels=LABELS)
    assert (g.resolved, g.outcome) == (False, "setup_failed")
    assert "exit 3" in g.reason and "installing" in g.reason


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                          check=True, capture_output=True, text=True).stdout.strip()


def test_every_repository_source_kind(client: SandboxClient, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for name, text in FILES.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    tarball = tmp_path / "repo.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(repo, arcname=".")
    git_repo = tmp_path / "git"
    _git(tmp_path, "init", "-q", str(git_repo))
    for name, text in FILES.items():
        (git_repo / name).parent.mkdir(parents=True, exist_ok=True)
        (git_repo / name).write_text(text)
    _git(git_repo, "add", "-A")
    _git(git_repo, "commit", "-qm", "base")
    base = _git(git_repo, "rev-parse", "HEAD")
    # A later commit on the branch: grading must check out base_commit, not the tip.
    (git_repo / "calc.py").write_text("broken on purpose\n")
    _git(git_repo, "commit", "-qam", "later")
    _git(git_repo, "bundle", "create", str(tmp_path / "repo.bundle"), "--all")
    sources = {
        "dir": (RepoSource(kind="dir", path=str(repo)), None),
        "tarball": (RepoSource(kind="tarball", path=str(tarball)), None),
        "git_bundle": (RepoSource(kind="git_bundle", path=str(tmp_path / "repo.bundle")), base),
        "files": (RepoSource(kind="files", files=FILES), None),
    }
    for kind, (source, commit) in sources.items():
        task = calc_task(source=source, base_commit=commit)
        assert grade(client, task, GOLD, labels=LABELS).resolved, kind
        assert not grade(client, task, None, labels=LABELS, test_empty=True).resolved, kind


def test_a_missing_repository_is_a_setup_failure(client: SandboxClient, tmp_path: Path) -> None:
    task = calc_task(source=RepoSource(kind="tarball", path=str(tmp_path / "gone.tgz")))
    g = grade(client, task, GOLD, labels=LABELS)
    assert g.outcome == "setup_failed" and "gone.tgz" in g.reason


def test_validate_tells_good_tasks_from_broken_ones(client: SandboxClient) -> None:
    good = validate_task(client, calc_task(), labels=LABELS)
    assert good.ok and good.problems == []
    assert good.gold is not None and good.gold.resolved
    assert good.empty is not None and good.empty.f2p_failing == ["tests/test_add.py::test_add"]

    no_fix = calc_task(patch=file_diff("calc.py", BUGGY, BUGGY + "\n# tidy\n"))
    check = validate_task(client, no_fix, labels=LABELS)
    assert not check.ok and "the gold patch does not resolve it" in check.problems[0]

    # An F2P test that passes without the fix tells nothing apart...
    weak = calc_task(test_patch=file_diff("tests/test_add.py", None, NEW_TESTS +
                                          "\n\ndef test_trivial():\n    assert add(0, 0) == 0\n"),
                     FAIL_TO_PASS=["tests/test_add.py::test_add",
                                   "tests/test_add.py::test_trivial"])
    check = validate_task(client, weak, labels=LABELS)
    assert check.problems == ["FAIL_TO_PASS tests pass without the fix: "
                              "tests/test_add.py::test_trivial"]
    # ...and a task whose tests all pass unfixed cannot reward a fix.
    check = validate_task(client, calc_task(FAIL_TO_PASS=["tests/test_calc.py::test_zero"],
                                            PASS_TO_PASS=[]), labels=LABELS)
    assert check.problems == ["the empty patch resolves it: its tests pass without any fix"]


def test_every_bundled_task_validates(client: SandboxClient) -> None:
    tasks = load_tasks("bundled")
    checks = validate_tasks(client, tasks, concurrency=2, labels=LABELS)
    broken = {c.instance_id: c.problems for c in checks if not c.ok}
    assert broken == {}
    assert len(checks) >= 30


def test_a_sample_of_humaneval_validates(client: SandboxClient) -> None:
    tasks = load_tasks("humaneval")
    sample = tasks[::16]  # 11 problems spread over the set; the closing note ran all 164
    checks = validate_tasks(client, sample, concurrency=2, labels=LABELS)
    assert {c.instance_id: c.problems for c in checks if not c.ok} == {}


def test_an_archive_with_many_files_round_trips(client: SandboxClient) -> None:
    # A repository of a few hundred files arrives whole (one upload, one exec).
    files = {f"pkg/m{i}.py": f"X = {i}\n" for i in range(300)}
    files["tests/test_sum.py"] = ("import importlib\n\n\ndef test_sum():\n    assert sum(importlib"
                                  ".import_module(f'pkg.m{i}').X for i in range(300)) == 44850\n")
    files["calc.py"] = BUGGY
    task = calc_task(source=RepoSource(kind="files", files=files),
                     PASS_TO_PASS=["tests/test_sum.py::test_sum"])
    g = grade(client, task, GOLD, labels=LABELS)
    assert g.resolved, g.reason
