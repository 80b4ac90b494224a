"""Running a Harbor task in an Orchard sandbox as Harbor does: the log directories, the oracle
solution (``/solution/solve.sh``), the tests (``/tests/test.sh``) and the reward they write
(``/logs/verifier/reward.json`` or ``reward.txt``); validation by the oracle and by doing
nothing, each in a fresh sandbox."""

from __future__ import annotations

import json
import math
import shlex
import tarfile
import tempfile
import uuid
from pathlib import Path

from pydantic import ConfigDict, Field

from orchard.domains.harbor.task import HarborTask, resolve_env
from orchard.env.client import NotFoundError, Sandbox, SandboxClient
from orchard.tasks.protocol import Grade, TaskSetupError
from orchard.tasks.served import GoldFailed, ServedOutcome, ServedTaskCheck, validate_served

# Harbor's paths inside the environment (harbor.models.trial.paths.EnvironmentPaths).
LOG_DIRS = ("/logs/agent", "/logs/verifier", "/logs/artifacts")
REWARD_JSON, REWARD_TEXT = "/logs/verifier/reward.json", "/logs/verifier/reward.txt"
TESTS, SOLUTION = "/tests", "/solution"


class HarborGrade(Grade):
    model_config = ConfigDict(extra="ignore")

    outcome: ServedOutcome = Field(description="task_error: the tests wrote no reward (or an "
                                   "unreadable one); the task is broken, not the rollout.")
    reason: str
    rewards: dict[str, float] = Field(default_factory=dict,
                                      description="Every reward the tests wrote, by name.")


HarborTaskCheck = ServedTaskCheck[HarborGrade]


def upload_dir(sandbox: Sandbox, source: Path, target: str) -> None:
    """Copy a local directory's contents into ``target`` in one archive, keeping modes and
    links (the image needs ``tar``, as Harbor's own transfers do)."""
    staged = f"/tmp/.orchard-upload-{uuid.uuid4().hex}.tar.gz"
    with tempfile.NamedTemporaryFile(suffix=".tar.gz") as archive:
        with tarfile.open(fileobj=archive, mode="w:gz") as tar:
            tar.add(source, arcname=".")
        archive.flush()
        sandbox.upload_file(archive.name, staged)
    q = shlex.quote
    unpacked = sandbox.exec(f"mkdir -p {q(target)} && tar -xzf {staged} -C {q(target)}; "
                            f"status=$?; rm -f {staged}; exit $status")
    if not unpacked.ok:
        raise TaskSetupError(f"could not unpack {source} into {target} in sandbox {sandbox.id}: "
                           f"{(unpacked.stderr or unpacked.stdout).strip()[-300:]}")


def set_up(sandbox: Sandbox, task: HarborTask) -> None:
    """Harbor's log directories, and for a named image without a Dockerfile, the task's
    environment files in the working directory (as Harbor's providers upload them)."""
    dirs = " ".join(LOG_DIRS)
    made = sandbox.exec(f"mkdir -p {dirs} && chmod 777 {dirs}")
    if not made.ok:
        raise TaskSetupError(f"could not make {dirs} in sandbox {sandbox.id}: {made.stderr}")
    env_dir = task.environment_dir
    if not task.build and env_dir.is_dir() and any(env_dir.iterdir()):
        upload_dir(sandbox, env_dir, task.workdir or sandbox.exec("pwd").stdout.strip() or "/")


def run_solution(sandbox: Sandbox, task: HarborTask) -> None:
    """The oracle: ``solution/`` into /solution, then solve.sh, its output in
    /logs/agent/oracle.txt. Its exit code is not judged: the tests are."""
    if not (task.solution_dir / "solve.sh").is_file():
        raise GoldFailed(f"{task.solution_dir / 'solve.sh'} does not exist")
    try:
        upload_dir(sandbox, task.solution_dir, SOLUTION)
    except TaskSetupError as e:
        raise GoldFailed(str(e)) from None
    sandbox.exec(f"chmod +x {SOLUTION}/solve.sh && {SOLUTION}/solve.sh "
                 "> /logs/agent/oracle.txt 2>&1", cwd=task.workdir,
                 env={"DEBIAN_FRONTEND": "noninteractive", **resolve_env(task.solution_env)},
                 timeout=task.budget.wall_time)


def run_tests(sandbox: Sandbox, task: HarborTask) -> HarborGrade:
    """``tests/`` into /tests, test.sh run, and the reward it wrote read back."""
    def graded(outcome: ServedOutcome, reason: str, rewards: dict[str, float],
               reward: float) -> HarborGrade:
        return HarborGrade(instance_id=task.instance_id, resolved=outcome == "resolved",
                           reward=reward, outcome=outcome, reason=reason, rewards=rewards)

    sandbox.exec(f"rm -f {REWARD_JSON} {REWARD_TEXT}")
    try:
        upload_dir(sandbox, task.tests_dir, TESTS)
    except TaskSetupError as e:
        return graded("task_error", str(e), {}, 0.0)
    ran = sandbox.exec(f"chmod +x {TESTS}/test.sh && {TESTS}/test.sh "
                       "> /logs/verifier/test-stdout.txt 2>&1", cwd=task.workdir,
                       env=resolve_env(task.verifier_env), timeout=task.verifier_timeout)
    try:
        rewards = _read_rewards(sandbox)
    except ValueError as e:
        return graded("task_error", str(e), {}, 0.0)
    if rewards is None:
        tail = sandbox.exec("tail -c 300 /logs/verifier/test-stdout.txt").stdout.strip()
        return graded("task_error", f"test.sh (exit {ran.exit_code}) wrote no reward to "
                      f"{REWARD_TEXT} or {REWARD_JSON}: {tail}", {}, 0.0)
    # The reward is the one named "reward", or the only one there is.
    reward = rewards.get("reward", next(iter(rewards.values())) if len(rewards) == 1 else None)
    if reward is None:
        return graded("task_error", f"{REWARD_JSON} names no 'reward' among {sorted(rewards)}",
                      rewards, 0.0)
    # Harbor counts a trial as solved at reward 1; partial credit is a reward below it.
    outcome: ServedOutcome = "resolved" if reward >= 1.0 else "unresolved"
    return graded(outcome, f"reward {reward:g} (test.sh exit {ran.exit_code})", rewards, reward)


def _read_rewards(sandbox: Sandbox) -> dict[str, float] | None:
    """reward.json (name -> number) before reward.txt (one number), as Harbor reads them;
    None when the tests wrote neither, a ValueError when one is not numbers."""
    for path in (REWARD_JSON, REWARD_TEXT):
        try:
            text = sandbox.download_content(path).decode()
        except NotFoundError:
            continue
        try:
            parsed = json.loads(text) if path == REWARD_JSON else {"reward": float(text)}
            if not isinstance(parsed, dict):
                parsed = {"reward": parsed}
            rewards = {str(k): float(v) for k, v in parsed.items()}
        except (ValueError, TypeError):
            raise ValueError(f"{path} holds no number: {text[:100]!r}") from None
        if not all(math.isfinite(v) for v in rewards.values()):
            raise ValueError(f"{path} holds a reward that is not finite: {text[:100]!r}")
        return rewards
    return None


def validate_harbor(client: SandboxClient, task: HarborTask, *,
                    labels: dict[str, str] | None = None) -> HarborTaskCheck:
    """The oracle solution earns reward 1 and doing nothing does not, each in a fresh sandbox
    of the task's image (a Dockerfile is built before each; the second build is cached)."""
    def start(sb: Sandbox) -> str | None:
        try:
            set_up(sb, task)
        except TaskSetupError as e:
            return f"its environment cannot run it: {e}"
        return None

    def gold(sb: Sandbox) -> None:
        run_solution(sb, task)

    return validate_served(client, task, start=start, gold=gold,
                           grade=lambda sb, answer: run_tests(sb, task),
                           environment_errors=(), labels=labels)
