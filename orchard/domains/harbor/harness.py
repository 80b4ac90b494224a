"""The Harbor domain's harness: Harbor's oracle agent (``orchard eval --harness
harbor-oracle``). A Harbor task is graded in the rollout's own sandbox, by its tests, before
the sandbox goes: the harness hands the grade to the runner in ``HarnessResult.grade``."""

from __future__ import annotations

from orchard.domains.harbor.grading import run_solution, run_tests
from orchard.domains.harbor.task import HarborTask
from orchard.eval.harness import HarnessError, HarnessResult, RolloutContext
from orchard.tasks.served import GoldFailed


class HarborOracleHarness:
    """solution/solve.sh in the rollout's sandbox, as Harbor's oracle agent runs it; then the
    task's tests. Checks a Harbor dataset end to end through ``orchard eval``."""

    name = "harbor-oracle"
    model_upstream = None

    def run(self, ctx: RolloutContext) -> HarnessResult:
        task = ctx.task
        if not isinstance(task, HarborTask):
            raise HarnessError(f"{self.name} runs Harbor tasks; {task.instance_id} is not one")
        with ctx.sandbox() as sandbox:  # the task's image, its log directories made
            try:
                run_solution(sandbox, task)
            except GoldFailed as e:
                raise HarnessError(f"the oracle of {task.instance_id} cannot run: {e}") from None
            with ctx.timed():
                grade = run_tests(sandbox, task)
        return HarnessResult(exit_status="Submitted", n_steps=1, grade=grade)
