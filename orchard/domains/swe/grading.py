"""Grade a candidate patch in a FRESH sandbox from the task's image.

The SWE-bench procedure: prepare the repository, apply the candidate (``git apply``, then
``git apply --reject``, then ``patch --fuzz=5``: the sandbox agent's patch endpoint), apply the
test patch, run the test command, parse per-test outcomes with swebench's log parser, and call
the task resolved iff every FAIL_TO_PASS and PASS_TO_PASS test passes. Reward +1 if resolved,
-1 otherwise. A task with swebench's ``eval_script`` (a SWE-bench instance) runs that script
after the candidate instead (it applies the test patch itself), and swebench's
``get_eval_report`` reads the log and says whether it is resolved.

An environment failure (no sandbox, agent unreachable) is raised, not graded: it says nothing
about the patch, and the caller retries it. Everything the patch is to blame for is a Grade.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ConfigDict, Field

from orchard.domains.swe.model import SweTask, patch_files
from orchard.domains.swe.workspace import open_task_sandbox, prepare_workspace
from orchard.env.client import OrchardError, SandboxClient
from orchard.tasks.protocol import Grade, TaskSetupError

if TYPE_CHECKING:
    from swebench.types import TestSpec

Outcome = Literal["resolved", "empty_patch", "patch_failed", "edits_tests", "tests_failed",
                  "test_timeout", "test_patch_failed", "setup_failed"]
TAIL_CHARS = 4000
# Where swebench's harness puts the eval script in the container.
EVAL_SCRIPT_PATH = "/eval.sh"


class SweGrade(Grade):
    """What grading found; ``reason`` says in words why a task is not resolved."""

    model_config = ConfigDict(extra="ignore")

    outcome: Outcome
    patch_method: str | None = Field(None, description="Which method applied the candidate.")
    patch_attempts: list[str] = Field(default_factory=list)
    f2p_total: int = 0
    f2p_passed: int = 0
    p2p_total: int = 0
    p2p_passed: int = 0
    f2p_failing: list[str] = Field(default_factory=list)
    p2p_failing: list[str] = Field(default_factory=list)
    test_exit_code: int | None = None
    test_output_tail: str = ""
    grading_seconds: float = 0.0
    setup_seconds: float = 0.0
    test_seconds: float = 0.0
    sandbox_id: str | None = None
    swebench_report: dict[str, Any] | None = Field(
        None, description="swebench's get_eval_report for the instance (eval_script tasks).")


def _graded(task: SweTask, outcome: Outcome, reason: str, **fields: object) -> SweGrade:
    return SweGrade(instance_id=task.instance_id, resolved=outcome == "resolved",
                 reward=1.0 if outcome == "resolved" else -1.0, outcome=outcome, reason=reason,
                 f2p_total=len(task.FAIL_TO_PASS), p2p_total=len(task.PASS_TO_PASS),
                 **fields)  # type: ignore[arg-type]


def test_status(task: SweTask, log: str) -> dict[str, str]:
    """Per-test outcomes (``PASSED``, ``FAILED``, ...) parsed by swebench's parser."""
    from swebench.harness.log_parsers import PARSER_REGISTRY  # 1.5 s import: only when grading

    try:
        parser = PARSER_REGISTRY[task.log_parser]
    except KeyError:
        raise ValueError(f"task {task.instance_id}: unknown log_parser {task.log_parser!r}; "
                         "use a name from swebench's PARSER_REGISTRY, e.g. parse_log_pytest"
                         ) from None
    return parser(log, None)


def score(task: SweTask, log: str) -> tuple[list[str], list[str]]:
    """The FAIL_TO_PASS and PASS_TO_PASS tests that did NOT pass, by SWE-bench's rules: a
    missing or skipped F2P test fails; a P2P test the log reports as skipped is kept, but
    pytest's ``-rA`` summary does not name skipped tests, so there a skipped P2P test is
    missing and fails (as in SWE-bench's own harness)."""
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS
    from swebench.harness.grading import get_eval_tests_report

    report = get_eval_tests_report(test_status(task, log), {
        FAIL_TO_PASS: task.FAIL_TO_PASS, PASS_TO_PASS: task.PASS_TO_PASS})
    return report[FAIL_TO_PASS]["failure"], report[PASS_TO_PASS]["failure"]


def test_spec(task: SweTask) -> TestSpec:
    """swebench's TestSpec of an eval_script task, from swebench's own make_test_spec."""
    from swebench.harness.utils import make_test_spec

    return make_test_spec({
        "instance_id": task.instance_id, "image": task.image, "repo": task.repo,
        "version": task.version, "FAIL_TO_PASS": task.FAIL_TO_PASS,
        "PASS_TO_PASS": task.PASS_TO_PASS, "log_parser": task.log_parser,
        "eval_type": task.eval_type, "eval_script": task.eval_script})


def eval_report(spec: TestSpec, patch: str, log: str) -> dict[str, Any]:
    """swebench's report on one eval script's log (``resolved``, ``tests_status``, ...)."""
    from swebench.harness.grading import get_eval_report

    with tempfile.NamedTemporaryFile("w", suffix=".log", encoding="utf-8") as f:
        f.write(log)
        f.flush()
        report = get_eval_report(spec, {"instance_id": spec.instance_id, "model_patch": patch,
                                        "model_name_or_path": "orchard"}, f.name,
                                 include_tests_status=True)
    return report[spec.instance_id]


def _report_failures(task: SweTask, report: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The FAIL_TO_PASS and PASS_TO_PASS tests swebench's report does not count as passing;
    all of them when it found no test results in the log."""
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS

    status = report.get("tests_status")
    if status is None:
        return list(task.FAIL_TO_PASS), list(task.PASS_TO_PASS)
    return status[FAIL_TO_PASS]["failure"], status[PASS_TO_PASS]["failure"]


def grade(client: SandboxClient, task: SweTask, patch: str | None, *,
          labels: dict[str, str] | None = None, timeout: float | None = None,
          test_empty: bool = False) -> SweGrade:
    """Grade ``patch`` (None or blank: no submission) for ``task`` in a fresh sandbox.

    No submission is graded without a sandbox, unless ``test_empty``: then the tests run on
    the untouched repository, as task validation needs."""
    start = time.monotonic()
    timeout = timeout or task.test_timeout
    empty = not patch or not patch.strip()
    if empty and not test_empty:
        return _graded(task, "empty_patch", "no patch was submitted",
                       grading_seconds=time.monotonic() - start)
    patch = patch or ""
    touched = sorted(set(patch_files(patch)) & task.test_files())
    if touched:
        return _graded(task, "edits_tests", "the patch edits the grading tests' files "
                       f"({', '.join(touched)}); they are the task's, not the candidate's",
                       grading_seconds=time.monotonic() - start)
    try:
        sandbox = open_task_sandbox(client, task, labels={"orchard.dev/purpose": "grading",
                                                          **(labels or {})},
                                    ttl=timeout + 600)
    except TaskSetupError as e:
        return _graded(task, "setup_failed", str(e), grading_seconds=time.monotonic() - start)
    sandbox_id = sandbox.id
    try:
        try:
            ws = prepare_workspace(sandbox, task)
        except TaskSetupError as e:
            return _graded(task, "setup_failed", str(e), sandbox_id=sandbox_id,
                           grading_seconds=time.monotonic() - start)
        common: dict[str, object] = {"sandbox_id": sandbox_id, "setup_seconds": ws.seconds}
        if not empty:
            applied = sandbox.apply_patch(patch, timeout=120, cwd=task.workdir)
            common |= {"patch_method": applied.method, "patch_attempts": applied.attempts}
        if not empty and not applied.success:
            return _graded(task, "patch_failed", "the patch does not apply with git apply, "
                           "git apply --reject or patch --fuzz=5: "
                           f"{applied.attempts[-1] if applied.attempts else applied.stderr}",
                           grading_seconds=time.monotonic() - start, **common)
        spec = test_spec(task) if task.eval_script else None
        if spec is None and task.test_patch.strip():
            tests = sandbox.apply_patch(task.test_patch, timeout=120, cwd=task.workdir)
            if not tests.success:
                return _graded(task, "test_patch_failed", "the test patch no longer applies "
                               "on top of the candidate: "
                               f"{tests.attempts[-1] if tests.attempts else tests.stderr}",
                               grading_seconds=time.monotonic() - start, **common)
        t0 = time.monotonic()
        if spec is None:
            job = sandbox.exec(task.test_command, cwd=task.workdir, timeout=timeout)
            log = job.stdout + ("\n" + job.stderr if job.stderr else "")
        else:
            # One stream, as in swebench's container: the script's `set -x` trace on stderr
            # holds the markers that bracket the test output on stdout.
            sandbox.upload_content(spec.eval_script, EVAL_SCRIPT_PATH, mode=0o755)
            job = sandbox.exec(["/bin/bash", "-c", f"/bin/bash {EVAL_SCRIPT_PATH} 2>&1"],
                               cwd=task.workdir, timeout=timeout)
            log = job.stdout
        common |= {"test_exit_code": job.exit_code, "test_output_tail": log[-TAIL_CHARS:],
                   "test_seconds": time.monotonic() - t0}
        if job.timed_out:
            return _graded(task, "test_timeout", f"the tests ran past {timeout:g} s and were "
                           "killed", grading_seconds=time.monotonic() - start, **common)
        unread = ""
        if spec is None:
            f2p_failing, p2p_failing = score(task, log)
            resolved = not f2p_failing and not p2p_failing
        else:
            report = eval_report(spec, patch, log)
            f2p_failing, p2p_failing = _report_failures(task, report)
            resolved = bool(report["resolved"])
            common["swebench_report"] = report
            if "tests_status" not in report:
                unread = ("swebench found no test results in the log"
                          + (f" ({report['infra_failure_reason']})"
                             if report.get("infra_failure_reason") else ""))
        counts = {"f2p_failing": f2p_failing, "p2p_failing": p2p_failing,
                  "f2p_passed": len(task.FAIL_TO_PASS) - len(f2p_failing),
                  "p2p_passed": len(task.PASS_TO_PASS) - len(p2p_failing)}
        if resolved:
            return _graded(task, "resolved", "", grading_seconds=time.monotonic() - start,
                           **common, **counts)
        why = [unread,
               f"{len(f2p_failing)}/{len(task.FAIL_TO_PASS)} FAIL_TO_PASS still failing"
               if f2p_failing else "",
               f"{len(p2p_failing)}/{len(task.PASS_TO_PASS)} PASS_TO_PASS broken"
               if p2p_failing else ""]
        return _graded(task, "tests_failed", "; ".join(w for w in why if w),
                       grading_seconds=time.monotonic() - start, **common, **counts)
    finally:
        with contextlib.suppress(OrchardError):  # already gone: reaped, or its TTL ran out
            sandbox.delete()
