"""SWE-bench datasets by name: rows in SWE-bench's schema load as tasks whose images follow
swebench's naming scheme (or the row's own ``image``), and grading runs each instance's own
eval script in its image and reads the log with swebench's get_eval_report."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchard.domains import load_tasks, resolve
from orchard.domains.swe import (
    SweGrade,
    SweTask,
    TaskSetupError,
    grade,
    open_task_sandbox,
    validate_task,
)
from orchard.domains.swe.swebench_datasets import InstanceImages
from orchard.env.client import SandboxClient, SandboxNotReady
from orchard.tasks import TaskLoadError
from tests.conftest import needs_root
from tests.registry import Registry
from tests.swebench_images import (
    calc_rows,
    make_calc_repo,
    make_instance_image,
    make_testbed_rootfs,
    write_jsonl,
    write_parquet,
)

ORCHARD = Path(sys.executable).with_name("orchard")
LABELS = {"test": "swebench"}
IDS = ["orchard-test__calc-1", "orchard-test__calc-2"]


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    repo = tmp_path_factory.mktemp("upstream") / "calc"
    return repo, make_calc_repo(repo)


@pytest.fixture(scope="module")
def rows(upstream: tuple[Path, dict[str, str]]) -> list[dict[str, Any]]:
    return calc_rows(upstream[1])


@pytest.fixture()
def namespace(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Tests choose the namespace and tag; the machine's own settings do not leak in."""
    monkeypatch.delenv("ORCHARD_SWEBENCH_NAMESPACE", raising=False)
    monkeypatch.delenv("ORCHARD_SWEBENCH_TAG", raising=False)
    yield


def test_instance_images_are_named_as_swebench_names_them(monkeypatch, namespace) -> None:
    from swebench.task.checks import expected_image

    default = InstanceImages.from_env()
    assert default.name("django__django-11099") == expected_image("django__django-11099")
    assert default.name("django__django-11099") == \
        "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    monkeypatch.setenv("ORCHARD_SWEBENCH_NAMESPACE", "127.0.0.1:5000/mirror/")
    monkeypatch.setenv("ORCHARD_SWEBENCH_TAG", "v2")
    assert InstanceImages.from_env().name("Org__Repo-7") == \
        "127.0.0.1:5000/mirror/sweb.eval.x86_64.org_1776_repo-7:v2"
    # A directory names OCI layouts in it by swebench's file-safe name.
    monkeypatch.setenv("ORCHARD_SWEBENCH_NAMESPACE", "/srv/images")
    assert InstanceImages.from_env().name("org__repo-7") == \
        "/srv/images/sweb.eval.x86_64.org__repo-7__v2"


def test_a_dataset_file_loads_the_same_from_jsonl_and_parquet(
        rows: list[dict[str, Any]], tmp_path: Path, namespace: None) -> None:
    loaded = [load_tasks(write_jsonl(rows, tmp_path / "verified.jsonl"))[1],
              load_tasks(write_parquet(rows, tmp_path / "verified.parquet"))[1]]
    assert loaded[0] == loaded[1]
    first = loaded[0][0]
    assert [t.instance_id for t in loaded[0]] == IDS
    assert first.image == "swebench/sweb.eval.x86_64.orchard-test_1776_calc-1:latest"
    assert (first.workdir, first.source.kind, first.test_timeout) == ("/testbed", "image", 1800)
    assert first.eval_script == rows[0]["eval_script"] and first.eval_type == "pass_and_fail"
    assert first.FAIL_TO_PASS == ["tests/test_add.py::test_add"]  # from the JSON string
    assert first.metadata == {"difficulty": "<15 min fix"}  # the column SweTask lacks


def test_the_instance_s_image_field_wins(rows: list[dict[str, Any]], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHARD_SWEBENCH_NAMESPACE", "127.0.0.1:5000/swebench")
    own = [{**rows[0], "image": "ghcr.io/org/calc:fixed"}, {**rows[1], "image": ""}]
    tasks = load_tasks(write_jsonl(own, tmp_path / "own.jsonl"))[1]
    assert [t.sandbox_spec().image for t in tasks] == [
        "ghcr.io/org/calc:fixed",
        # An empty image (Parquet fills a column some rows lack) is no image: the scheme.
        "127.0.0.1:5000/swebench/sweb.eval.x86_64.orchard-test_1776_calc-2:latest"]


@pytest.mark.parametrize(("change", "message"), [
    ({"log_parser": ""}, "row 1: SWE-bench instance orchard-test__calc-1 lacks log_parser"),
    ({"image_assets": json.dumps({"test_patch": [{"path": "a.png", "url": "u"}]})},
     "orchard-test__calc-1 has image_assets .* Orchard does not stage them"),
    ({"eval_script": None}, "SWE-bench row without eval_script: swebench 5 grades"),
])
def test_an_instance_swebench_cannot_grade_is_a_clear_error(
        rows: list[dict[str, Any]], tmp_path: Path, change: dict[str, Any],
        message: str) -> None:
    row = {k: v for k, v in {**rows[0], **change}.items() if v is not None}
    with pytest.raises(TaskLoadError, match=message):
        load_tasks(write_jsonl([row], tmp_path / "bad.jsonl"))


def test_an_orchard_task_with_no_eval_script_is_not_a_swebench_row(tmp_path: Path) -> None:
    row = {"instance_id": "t-1", "problem_statement": "p", "FAIL_TO_PASS": ["t::a"],
           "eval_script": "", "image": "host"}
    task = load_tasks(write_jsonl([row], tmp_path / "own.jsonl"))[1][0]
    assert (task.workdir, task.image, task.eval_script) == ("/workspace", "host", "")


def test_hub_ids_go_to_the_swe_domain_and_mistyped_paths_do_not() -> None:
    assert resolve("princeton-nlp/SWE-bench_Verified").name == "swe"
    with pytest.raises(TaskLoadError, match="no task set at data/tasks.jsonl"):
        resolve("data/tasks.jsonl")


def test_a_downloaded_dataset_directory_loads_through_datasets(
        rows: list[dict[str, Any]], tmp_path: Path, namespace: None) -> None:
    """A copy of a Hub dataset (`hf download --local-dir DIR`) is read by
    datasets.load_dataset, as the Hub is, with its splits."""
    data = tmp_path / "SWE-bench_Verified" / "data"
    data.mkdir(parents=True)
    write_parquet(rows, data / "test-00000-of-00001.parquet")
    tasks = load_tasks(tmp_path / "SWE-bench_Verified", split="test")[1]
    assert [(t.instance_id, t.split) for t in tasks] == [(i, "test") for i in IDS]


def test_the_hub_unreachable_is_a_clear_error(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    r = subprocess.run([str(ORCHARD), "tasks", "list", "princeton-nlp/SWE-bench_Verified"],
                       capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    err = " ".join(r.stderr.split())
    assert "Traceback" not in err
    assert "could not load 'princeton-nlp/SWE-bench_Verified' from the Hugging Face Hub or " \
           "its cache" in err
    assert "hf download --repo-type dataset princeton-nlp/SWE-bench_Verified" in err


# --- grading in instance images ---------------------------------------------------------------


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory: pytest.TempPathFactory,
              upstream: tuple[Path, dict[str, str]]) -> Path:
    """The instance images as OCI layouts, named as swebench names them in a directory."""
    rootfs = make_testbed_rootfs(tmp_path_factory.mktemp("testbed") / "rootfs")
    images = tmp_path_factory.mktemp("swebench-images")
    repo, commits = upstream
    for iid, base in commits.items():
        make_instance_image(rootfs, repo, base, images / f"sweb.eval.x86_64.{iid}__latest")
    shutil.rmtree(rootfs)
    return images


@pytest.fixture(scope="module")
def namespace_ref(registry: Registry, image_dir: Path) -> str:
    """A registry namespace holding the instance images under the names swebench's own
    ``expected_image`` gives them."""
    from swebench.task.checks import expected_image

    namespace = f"{registry.host}/swebench"
    for iid in IDS:
        name, tag = expected_image(iid, namespace).removeprefix(registry.host + "/").split(":")
        registry.push(image_dir / f"sweb.eval.x86_64.{iid}__latest", name, tag)
    return namespace


@pytest.fixture(scope="module")
def client(orchestrator: str) -> Iterator[SandboxClient]:
    with SandboxClient(orchestrator) as c:
        yield c
        assert c.list_sandboxes(labels=LABELS) == []  # grading deleted every sandbox


@pytest.fixture()
def tasks(rows: list[dict[str, Any]], namespace_ref: str, tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> list[SweTask]:
    monkeypatch.setenv("ORCHARD_SWEBENCH_NAMESPACE", namespace_ref)
    monkeypatch.delenv("ORCHARD_SWEBENCH_TAG", raising=False)
    return load_tasks(write_jsonl(rows, tmp_path / "verified.jsonl"))[1]


def _assert_gold_report(g: SweGrade) -> None:
    assert (g.outcome, g.resolved, g.reward, g.f2p_passed, g.p2p_passed) == \
        ("resolved", True, 1.0, 1, 2), g.reason + g.test_output_tail
    report = g.swebench_report
    assert report is not None
    assert (report["resolved"], report["patch_successfully_applied"]) == (True, True)
    assert report["tests_status"]["FAIL_TO_PASS"] == {
        "success": ["tests/test_add.py::test_add"], "failure": []}
    assert report["tests_status"]["PASS_TO_PASS"]["failure"] == []
    # The eval script really ran: its markers and swebench's recorded exit code are in the log.
    assert ">>>>> End Test Output" in g.test_output_tail
    assert ">>>>> Test Exit Code: 0" in g.test_output_tail


@needs_root
def test_the_gold_patch_resolves_in_the_pulled_instance_image(
        client: SandboxClient, tasks: list[SweTask], namespace_ref: str) -> None:
    task = tasks[0]
    assert task.image == f"{namespace_ref}/sweb.eval.x86_64.orchard-test_1776_calc-1:latest"
    _assert_gold_report(grade(client, task, task.patch, labels=LABELS))


@needs_root
def test_a_wrong_patch_and_no_patch_do_not_resolve(client: SandboxClient,
                                                   tasks: list[SweTask]) -> None:
    task = tasks[1]
    wrong = tasks[0].patch  # fixes add(), not neg()
    g = grade(client, task, wrong, labels=LABELS)
    assert (g.outcome, g.resolved, g.reward) == ("tests_failed", False, -1.0)
    assert g.reason == "1/1 FAIL_TO_PASS still failing"
    report = g.swebench_report
    assert report is not None and report["resolved"] is False
    assert report["tests_status"]["FAIL_TO_PASS"]["failure"] == ["tests/test_neg.py::test_neg"]
    assert sorted(report["tests_status"]["PASS_TO_PASS"]["success"]) == [
        "tests/test_calc.py::test_neg_zero", "tests/test_calc.py::test_zero"]
    empty = grade(client, task, "", labels=LABELS)
    assert (empty.outcome, empty.resolved, empty.sandbox_id) == ("empty_patch", False, None)


@needs_root
def test_validation_runs_gold_and_untouched_in_the_instance_images(
        client: SandboxClient, tasks: list[SweTask]) -> None:
    check = validate_task(client, tasks[1], labels=LABELS)
    assert check.ok, check.problems
    assert check.empty is not None and check.empty.swebench_report is not None
    assert check.empty.f2p_failing == ["tests/test_neg.py::test_neg"]


@needs_root
def test_the_row_s_image_overrides_the_scheme_in_grading(
        client: SandboxClient, rows: list[dict[str, Any]], registry: Registry,
        image_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    own = registry.push(image_dir / "sweb.eval.x86_64.orchard-test__calc-1__latest",
                        "elsewhere/calc", "1")
    # Nothing lives under this namespace: only the row's own image can grade it.
    monkeypatch.setenv("ORCHARD_SWEBENCH_NAMESPACE", f"{registry.host}/nothing-here")
    task = load_tasks(write_jsonl([{**rows[0], "image": own}], tmp_path / "own.jsonl"))[1][0]
    assert task.image == own
    _assert_gold_report(grade(client, task, task.patch, labels=LABELS))


@needs_root
def test_the_directory_namespace_grades_from_oci_layouts(
        client: SandboxClient, rows: list[dict[str, Any]], image_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHARD_SWEBENCH_NAMESPACE", str(image_dir))
    task = load_tasks(write_jsonl(rows[:1], tmp_path / "one.jsonl"))[1][0]
    assert task.image == str(image_dir / "sweb.eval.x86_64.orchard-test__calc-1__latest")
    _assert_gold_report(grade(client, task, task.patch, labels=LABELS))


@needs_root
def test_a_missing_image_names_the_instance_and_the_image(
        client: SandboxClient, tasks: list[SweTask], namespace_ref: str) -> None:
    gone = tasks[0].model_copy(update={
        "instance_id": "orchard-test__calc-404",
        "image": f"{namespace_ref}/sweb.eval.x86_64.orchard-test_1776_calc-404:latest"})
    # Refused at create (a setup failure) or failing to start (an environment failure): both
    # say which instance and which image.
    with pytest.raises((TaskSetupError, SandboxNotReady)) as raised:
        open_task_sandbox(client, gone, labels=LABELS)
    message = str(raised.value)
    assert "task orchard-test__calc-404: " in message, message
    assert (f"no sandbox from its image {gone.image}: " in message
            or f"its image {gone.image} cannot be used: " in message), message


@needs_root
def test_orchard_tasks_list_and_validate_on_the_dataset_file(
        rows: list[dict[str, Any]], namespace_ref: str, tmp_path: Path,
        orchestrator: str) -> None:
    dataset = write_parquet(rows, tmp_path / "verified.parquet")
    env = {**os.environ, "ORCHARD_SWEBENCH_NAMESPACE": namespace_ref, "COLUMNS": "250"}
    listed = subprocess.run([str(ORCHARD), "tasks", "list", str(dataset), "--json"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert listed.returncode == 0, listed.stderr
    assert [(t["instance_id"], t["image"]) for t in json.loads(listed.stdout)] == [
        (iid, f"{namespace_ref}/sweb.eval.x86_64.{iid.replace('__', '_1776_')}:latest")
        for iid in IDS]
    checked = subprocess.run(
        [str(ORCHARD), "tasks", "validate", str(dataset), "--orchestrator", orchestrator],
        capture_output=True, text=True, timeout=600, env=env)
    assert checked.returncode == 0, (checked.stdout, checked.stderr)
    assert "2/2 tasks valid" in checked.stderr


@needs_root
def test_orchard_eval_runs_the_dataset_in_its_instance_images(
        rows: list[dict[str, Any]], namespace_ref: str, tmp_path: Path,
        orchestrator: str) -> None:
    dataset = write_jsonl(rows, tmp_path / "verified.jsonl")
    env = {**os.environ, "ORCHARD_SWEBENCH_NAMESPACE": namespace_ref}
    out = tmp_path / "run"
    done = subprocess.run(
        [str(ORCHARD), "eval", "--tasks", str(dataset), "--harness", "oracle", "--out",
         str(out), "--orchestrator", orchestrator, "--no-per-task"],
        capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, (done.stdout, done.stderr)
    saved = json.loads((out / "results.json").read_text())
    assert {tid: t["resolved"] for tid, t in saved["tasks"].items()} == dict.fromkeys(IDS, 1)
    graded = [json.loads(line)["grade"] for line in
              (out / "rollouts.jsonl").read_text().splitlines()]
    assert sorted(g["swebench_report"]["resolved"] for g in graded) == [True, True]
