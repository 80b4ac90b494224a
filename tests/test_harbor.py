"""Harbor on Orchard: Harbor's own CLI (the pinned ``harbor`` in .venv-harbor, run as a
subprocess) runs a small dataset the test writes with its oracle agent in sandboxes of a real
orchestrator on loopback, through ``orchard.integrations.harbor``; ``orchard tasks validate``
agrees on the same directories. Harbor and its children run with a guard that refuses and
records any lookup or connection beyond loopback: none may happen."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchard.cli import app
from orchard.domains import resolve
from orchard.domains.harbor import HarborTask, load_harbor_tasks, read_task, validate_harbor
from orchard.env.client import SandboxClient
from orchard.tasks import TaskLoadError
from orchard.tasks.images import ImageBuild
from tests.conftest import dedicated_orchestrator, dies_with_the_tests, kube_settings, needs_root
from tests.fakekube.cluster import FakeCluster
from tests.harbor_tasks import write_dataset, write_task
from tests.image_fixtures import make_busybox_rootfs

ROOT = Path(__file__).resolve().parent.parent
HARBOR = ROOT / ".venv-harbor" / "bin" / "harbor"
PROVIDER = "orchard.integrations.harbor.environment:OrchardEnvironment"
GUARD = Path(__file__).resolve().parent / "net_guard"


def harbor_run(dataset: Path, jobs: Path, orchestrator: str, *args: str,
               agent: str = "oracle", job: str = "job") -> dict[str, dict]:
    """``harbor run`` on the dataset, on Orchard; each trial's result by task name."""
    assert HARBOR.exists(), f"{HARBOR} is missing: run `make harbor` (scripts/harbor-python.sh)"
    guard_log = jobs / "net-guard.log"
    env = {
        "PATH": os.environ["PATH"], "HOME": str(jobs), "ORCHARD_URL": orchestrator,
        "PYTHONPATH": f"{GUARD}:{ROOT}", "NET_GUARD_LOG": str(guard_log),
        # Harbor's telemetry and litellm's price list would go to the internet; both off.
        "HARBOR_TELEMETRY": "0", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    done = subprocess.run(
        [str(HARBOR), "run", "--path", str(dataset), "--agent", agent, "--env", PROVIDER,
         "--jobs-dir", str(jobs), "--job-name", job, "--n-concurrent", "3", "--yes", "--quiet",
         *args], env=env, capture_output=True, text=True, timeout=600,
        preexec_fn=dies_with_the_tests)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not guard_log.exists(), f"Harbor reached beyond loopback: {guard_log.read_text()}"
    trials = [json.loads(p.read_text()) for p in (jobs / job).glob("*/result.json")]
    return {t["task_name"]: t for t in trials}


def rewards(trials: dict[str, dict]) -> dict[str, float | None]:
    return {name: (t["verifier_result"] or {}).get("rewards", {}).get("reward")
            for name, t in trials.items()}


@pytest.fixture(scope="module")
def base_image(busybox_image: str) -> str:
    """An image in the test registry on loopback (tests/registry.py)."""
    return busybox_image


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory, base_image: str) -> Path:
    """Three tasks whose environment/Dockerfile is FROM the registry's image."""
    return write_dataset(tmp_path_factory.mktemp("harbor-dataset"), base_image, build=True)


@pytest.fixture(scope="module")
def oracle_run(dataset: Path, orchestrator: str, tmp_path_factory: pytest.TempPathFactory
               ) -> dict[str, dict]:
    return harbor_run(dataset, tmp_path_factory.mktemp("harbor-jobs"), orchestrator)


@needs_root
def test_harbor_s_oracle_earns_reward_1_on_every_task(oracle_run: dict[str, dict],
                                                      orchestrator: str) -> None:
    assert sorted(oracle_run) == ["task-00", "task-01", "task-02"]
    for name, trial in oracle_run.items():
        assert trial["exception_info"] is None, (name, trial["exception_info"])
    assert rewards(oracle_run) == {"task-00": 1.0, "task-01": 1.0, "task-02": 1.0}
    # Harbor downloaded the logs the sandbox wrote; the sandboxes are gone.
    trial_dir = Path(oracle_run["task-02"]["trial_uri"].removeprefix("file://"))
    assert (trial_dir / "verifier" / "reward.txt").read_text().strip() == "1"
    assert (trial_dir / "agent" / "oracle.txt").exists()
    with SandboxClient(orchestrator) as client:
        assert not [s for s in client.list_sandboxes() if "harbor.session" in s.labels]


@needs_root
def test_doing_nothing_earns_0(dataset: Path, orchestrator: str, tmp_path: Path) -> None:
    """Harbor's nop agent: the same tests, nothing solved, reward 0 everywhere."""
    trials = harbor_run(dataset, tmp_path, orchestrator, agent="nop")
    assert rewards(trials) == {"task-00": 0.0, "task-01": 0.0, "task-02": 0.0}


@needs_root
def test_orchard_tasks_validate_agrees_with_harbor(dataset: Path, orchestrator: str,
                                                   oracle_run: dict[str, dict]) -> None:
    result = CliRunner().invoke(app, ["tasks", "validate", str(dataset), "--orchestrator",
                                      orchestrator, "--json"])
    assert result.exit_code == 0, result.output
    checks = {c["instance_id"]: c for c in json.loads(result.stdout)}
    assert {n: c["ok"] for n, c in checks.items()} == {n: True for n in oracle_run}
    assert {n: c["gold"]["reward"] for n, c in checks.items()} == rewards(oracle_run)
    assert {c["empty"]["reward"] for c in checks.values()} == {0.0}


@needs_root
def test_orchard_eval_runs_the_oracle_harness(dataset: Path, orchestrator: str,
                                              tmp_path: Path) -> None:
    from orchard.eval import RolloutResult

    result = CliRunner().invoke(app, ["eval", "--tasks", str(dataset), "--harness",
                                      "harbor-oracle", "--out", str(tmp_path / "run"),
                                      "--orchestrator", orchestrator])
    assert result.exit_code == 0, result.output
    rows = [RolloutResult.model_validate_json(line) for line in
            (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert sorted((r.instance_id, r.grade.reward, r.grade.resolved) for r in rows) == [
        (f"task-0{i}", 1.0, True) for i in range(3)]


@needs_root
def test_the_sandbox_gets_the_task_s_limits_and_network(tmp_path: Path, base_image: str,
                                                        orchestrator: str) -> None:
    """A task naming a registry image (no Dockerfile): cpus, memory_mb, storage_mb and an
    allow-list become the sandbox's; --no-delete keeps it for a look."""
    task = write_task(tmp_path / "ds", "sized", "tree", base_image, build=False)
    toml = (task / "task.toml").read_text().replace(
        'network_mode = "no-network"\n',
        'network_mode = "allowlist"\nallowed_hosts = ["10.254.254.254"]\ncpus = 0.5\n'
        'memory_mb = 256\nstorage_mb = 64\n')
    (task / "task.toml").write_text(toml)
    trials = harbor_run(tmp_path / "ds", tmp_path / "jobs", orchestrator, "--no-delete")
    assert rewards(trials) == {"sized": 1.0}
    with SandboxClient(orchestrator) as client:
        kept = [s for s in client.list_sandboxes() if s.labels.get("harbor.session", "")
                .startswith("sized__")]
        try:
            assert len(kept) == 1
            info = kept[0]
            assert (info.cpu, info.memory, info.disk) == ("500m", "256Mi", "64Mi")
            assert (info.block_network, info.egress) == (False, ["10.254.254.254/32"])
        finally:
            for s in kept:
                client.delete_sandbox(s.sandbox_id)


@needs_root
def test_harbor_runs_on_the_kubernetes_backend(data_dir: Path, orchestrator: str,
                                               tmp_path: Path) -> None:
    """The same provider against an orchestrator on the Kubernetes backend (a fake cluster
    whose kubelet runs each pod as a local sandbox of the image the pod names)."""
    short = Path(tempfile.mkdtemp(prefix="/tmp/orc-k8s-hb-"))
    (short / "kubelet").mkdir()
    (short / "kubelet" / "bundle").symlink_to(data_dir / "local" / "bundle")
    rootfs = make_busybox_rootfs(short / "kubelet" / "images" / "busybox")  # where it may be
    dataset = write_dataset(tmp_path / "ds", "harbor-test/busybox:1", build=False, n=2)
    try:
        with FakeCluster(short, images={"harbor-test/busybox:1": str(rootfs)}) as cluster, \
                dedicated_orchestrator(data_dir, **kube_settings(cluster)) as url:
            trials = harbor_run(dataset, tmp_path / "jobs", url)
            with SandboxClient(url) as client:
                assert not client.list_sandboxes()
    finally:
        shutil.rmtree(short, ignore_errors=True)
    assert rewards(trials) == {"task-00": 1.0, "task-01": 1.0}
    assert {t["exception_info"] for t in trials.values()} == {None}


@needs_root
def test_validate_names_what_is_wrong(tmp_path: Path, base_image: str,
                                      orchestrator: str) -> None:
    wrong = write_task(tmp_path, "wrong-solution", "tree", base_image, build=False)
    (wrong / "solution" / "solve.sh").write_text("#!/bin/sh\nmkdir -p /workspace/out\n")
    easy = write_task(tmp_path, "passes-anyway", "tree", base_image, build=False)
    (easy / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    silent = write_task(tmp_path, "no-reward", "tree", base_image, build=False)
    (silent / "tests" / "test.sh").write_text("#!/bin/sh\necho checked\n")
    with SandboxClient(orchestrator) as client:
        checks = {t.instance_id: validate_harbor(client, t) for t in load_harbor_tasks(tmp_path)}
    assert not any(c.ok for c in checks.values())
    assert checks["wrong-solution"].problems == [
        "the gold solution does not resolve it: reward 0 (test.sh exit 0)"]
    assert checks["passes-anyway"].problems == [
        "doing nothing resolves it: reward 1 (test.sh exit 0)"]
    assert any("wrote no reward" in p and "checked" in p
               for p in checks["no-reward"].problems), checks["no-reward"].problems


# --- the task source, without sandboxes ---

def test_a_harbor_dataset_is_the_harbor_domain_s(tmp_path: Path) -> None:
    write_dataset(tmp_path / "ds", "/images/base", build=True, n=2)
    assert resolve(tmp_path / "ds").name == "harbor"
    assert resolve(tmp_path / "ds" / "task-01").name == "harbor"
    assert resolve(tmp_path).name == "swe"  # task directories only one level down
    tasks = load_harbor_tasks(tmp_path / "ds")
    assert [t.instance_id for t in tasks] == ["task-00", "task-01"]
    task = tasks[0]
    assert isinstance(task, HarborTask) and task.build and task.network_mode == "no-network"
    assert task.image == "harbor/task-00"
    spec = task.sandbox_spec()
    assert spec.image == ImageBuild(build=task.environment_dir, tag="harbor/task-00")
    assert (spec.block_network, spec.served) == (True, True)
    assert task.budget.wall_time == 120 and task.verifier_timeout == 120


@pytest.mark.parametrize(("edit", "error"), [
    (lambda t: (t / "instruction.md").unlink(), "has no instruction.md"),
    (lambda t: (t / "environment" / "Dockerfile").unlink(),
     "neither environment/Dockerfile nor .environment. docker_image"),
    (lambda t: ((t / "environment" / "Dockerfile").rename(t / "environment" /
                                                          "docker-compose.yaml")),
     "one container per sandbox"),
    (lambda t: (t / "task.toml").write_text("[environment\n"), "task.toml: "),
    (lambda t: (t / "task.toml").write_text('[[steps]]\nname = "one"\n'), "multi-step"),
])
def test_a_broken_task_directory_is_a_clear_error(tmp_path: Path, edit, error: str) -> None:
    task = write_task(tmp_path, "t", "tree", "/images/base", build=True)
    edit(task)
    with pytest.raises(TaskLoadError, match=error):
        read_task(task)


def test_env_templates_come_from_the_host_env(tmp_path: Path, monkeypatch) -> None:
    from orchard.domains.harbor import resolve_env

    monkeypatch.setenv("HB_SET", "from-host")
    monkeypatch.delenv("HB_UNSET", raising=False)
    assert resolve_env({"A": "${HB_SET}", "B": "${HB_UNSET:-dflt}", "C": "plain"}) == {
        "A": "from-host", "B": "dflt", "C": "plain"}
    with pytest.raises(ValueError, match="set HB_UNSET"):
        resolve_env({"A": "${HB_UNSET}"})
