"""Unit tests of the task model, the task loaders, the bundled and HumanEval sets, log-based
scoring, run results and reports, and the runner's helpers. No sandbox and no network: what
needs a real tool (git, pytest) runs it on files in tmp_path."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError
from rich.console import Console

from orchard.domains.swe import (
    RepoSource,
    SweTask,
    TaskLoadError,
    TaskSetupError,
    grading,
    load_tasks,
)
from orchard.domains.swe.grading import SweGrade
from orchard.domains.swe.harness import OracleHarness
from orchard.domains.swe.model import file_diff, patch_files
from orchard.env.client import ConnectError, WaitTimeout
from orchard.eval.report import compare_tables, draw_chart, run_table
from orchard.eval.results import (
    ROLLOUTS_FILE,
    Failure,
    RolloutResult,
    Timings,
    append_result,
    pass_at_k,
    read_results,
    summarize,
    write_outputs,
)
from orchard.eval.runner import RunConfig, RunMismatch, Runner, _scaled, classify

SYS_PYTHON = "/usr/bin/python3"  # has pytest; what the sandboxes' "python3" is


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


# --- 1. the task model ------------------------------------------------------------------------


def test_json_string_test_lists_parse_to_lists() -> None:
    # SWE-bench on the Hub stores FAIL_TO_PASS / PASS_TO_PASS as JSON strings.
    f2p, p2p = ["t.py::test_a", "t.py::test_b[1]"], ["t.py::test_c"]
    t = SweTask(instance_id="x-1", problem_statement="p", FAIL_TO_PASS=json.dumps(f2p),
             PASS_TO_PASS=json.dumps(p2p))
    assert f2p == t.FAIL_TO_PASS
    assert p2p == t.PASS_TO_PASS
    assert SweTask(instance_id="x-1", problem_statement="p", FAIL_TO_PASS=f2p,
                PASS_TO_PASS="").PASS_TO_PASS == []


@pytest.mark.parametrize(("fields", "field", "needle"), [
    ({"instance_id": "astropy__astropy-42", "FAIL_TO_PASS": "[]"}, None,
     "astropy__astropy-42: FAIL_TO_PASS is empty"),
    ({"instance_id": "bad id/with slash"}, "instance_id", "pattern"),
    ({"instance_id": "-leading-dash"}, "instance_id", "pattern"),
    ({"workdir": "relative/dir"}, "workdir", "absolute"),
])
def test_invalid_tasks_are_rejected(fields: dict, field: str | None, needle: str) -> None:
    base = {"instance_id": "ok-1", "problem_statement": "p", "FAIL_TO_PASS": ["t.py::t"]}
    with pytest.raises(ValidationError) as e:
        SweTask(**(base | fields))
    [err] = e.value.errors()
    assert err["loc"] == ((field,) if field else ())
    assert needle in err["msg"]


@pytest.mark.parametrize(("kind", "needle"), [
    ("dir", "path"), ("tarball", "path"), ("git_bundle", "path"), ("files", "files")])
def test_repo_sources_need_their_field(kind: str, needle: str) -> None:
    with pytest.raises(ValueError) as e:
        RepoSource(kind=kind)
    assert needle in str(e.value)
    assert RepoSource(kind="image").path is None  # the one kind that needs nothing


def test_patch_files_of_a_real_git_diff(tmp_path: Path) -> None:
    # A diff git itself wrote: a modification, a rename (with an edit) and a new file.
    git(tmp_path, "init", "-q")
    for name, text in {"pkg/a.py": "a = 1\n", "pkg/old.py": "x = 1\n" * 20}.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    git(tmp_path, "add", ".")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    (tmp_path / "pkg/a.py").write_text("a = 2\n")
    git(tmp_path, "mv", "pkg/old.py", "pkg/new.py")
    (tmp_path / "pkg/new.py").write_text("x = 1\n" * 19 + "x = 2\n")
    (tmp_path / "added.py").write_text("new\n")
    git(tmp_path, "add", "-A")
    diff = git(tmp_path, "diff", "--cached", "-M")
    assert "rename from pkg/old.py" in diff and "--- /dev/null" in diff
    assert set(patch_files(diff)) == {"pkg/a.py", "pkg/old.py", "pkg/new.py", "added.py"}
    assert "/dev/null" not in patch_files(diff)


def test_patch_files_of_a_plain_diff() -> None:
    plain = ("--- src/mod.py\t2024-01-01 00:00:00\n+++ src/mod.py\t2024-01-02 00:00:00\n"
             "@@ -1 +1 @@\n-a\n+b\n"
             "--- /dev/null\n+++ b/docs/new.md\n@@ -0,0 +1 @@\n+hi\n")
    assert patch_files(plain) == ["src/mod.py", "docs/new.md"]
    assert patch_files(file_diff("f.py", None, "x\n")) == ["f.py"]


def test_test_files_are_test_patch_files_plus_files_named_by_ids() -> None:
    t = SweTask(instance_id="x-1", problem_statement="p",
             test_patch=file_diff("tests/test_new.py", None, "def test_n():\n    pass\n"),
             FAIL_TO_PASS=["tests/test_a.py::test_x", "tests/test_new.py::test_n"],
             PASS_TO_PASS=["tests/unit/test_b.py::TestC::test_d[1-2]", "test_bare_name"])
    assert t.test_files() == {"tests/test_new.py", "tests/test_a.py", "tests/unit/test_b.py"}


# --- 2. loaders: every file format gives the same tasks ---------------------------------------

CALC = "def add(a, b):\n    return a - b\n"
ROWS = [
    {"instance_id": f"demo__{name}-1", "repo": f"demo/{name}", "base_commit": "0" * 40,
     "problem_statement": f"{name}: add() subtracts",
     "patch": file_diff("calc.py", CALC, CALC.replace("-", "+")),
     "test_patch": file_diff("tests/test_calc.py", None, "def test_add():\n    pass\n"),
     "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
     "PASS_TO_PASS": json.dumps(p2p), "image": "python:3.11", "split": split,
     "source": {"kind": "files", "files": {"calc.py": CALC}}, "metadata": {"difficulty": "easy"}}
    for name, split, p2p in (("alpha", "train", ["tests/test_calc.py::test_zero"]),
                             ("beta", "train", []), ("gamma", "test", ["t.py::test_q"]))]
IDS = [r["instance_id"] for r in ROWS]


def write_json(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = data if path.suffix == ".jsonl" else [data]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))  # type: ignore[union-attr]
    return path


def test_every_format_loads_the_same_tasks(tmp_path: Path) -> None:
    reference = load_tasks(write_json(tmp_path / "list.json", ROWS))
    assert [t.instance_id for t in reference] == IDS
    assert reference[0].FAIL_TO_PASS == ["tests/test_calc.py::test_add"]
    assert reference[1].PASS_TO_PASS == [] and reference[2].split == "test"
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "t.parquet")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "ds"))
    # A DatasetDict's rows carry no split: it comes from the dict's keys.
    bare = [{k: v for k, v in r.items() if k != "split"} for r in ROWS]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(bare[:2]),
                          "test": datasets.Dataset.from_list(bare[2:])}).save_to_disk(
        str(tmp_path / "dd"))
    for source in (write_json(tmp_path / "wrapped.json", {"tasks": ROWS}),
                   write_json(tmp_path / "t.jsonl", ROWS), tmp_path / "t.parquet",
                   tmp_path / "ds", tmp_path / "dd"):
        assert load_tasks(source) == reference, source
    assert load_tasks(tmp_path / "dd", split="test") == reference[2:]


def test_reference_pipeline_rows(tmp_path: Path) -> None:
    install = {"python": "3.11", "install": "pip install -e ."}
    row = {"problem_statement": "fix it", "patch": ROWS[0]["patch"], "metadata": {
        "instance_id": "ref__pipe-7", "repo": "ref/pipe", "base_commit": "f" * 40,
        "FAIL_TO_PASS": json.dumps(["tests/test_x.py::test_y"]), "PASS_TO_PASS": "[]",
        "image_url": "registry.example/ref-pipe:7", "workdir": "/testbed/",
        "pre_commands": ["pip install -e ."], "install_config": install}}
    [t] = load_tasks(write_json(tmp_path / "ref.jsonl", [row]))
    assert (t.instance_id, t.repo, t.image) == ("ref__pipe-7", "ref/pipe",
                                                "registry.example/ref-pipe:7")
    assert t.FAIL_TO_PASS == ["tests/test_x.py::test_y"] and t.workdir == "/testbed"
    assert t.pre_commands == ["pip install -e ."] and t.patch == ROWS[0]["patch"]
    assert t.metadata == {"install_config": install}


def test_relative_source_paths_resolve_against_the_file(tmp_path: Path) -> None:
    rows = [dict(ROWS[0], source={"kind": "dir", "path": "repos/alpha"}),
            dict(ROWS[1], source={"kind": "tarball", "path": str(tmp_path / "abs.tgz")})]
    for path in (write_json(tmp_path / "sets" / "t.json", rows),
                 write_json(tmp_path / "other" / "t.jsonl", rows)):
        alpha, beta = load_tasks(path)
        assert alpha.source.path == str((path.parent / "repos/alpha").resolve())
        assert beta.source.path == str(tmp_path / "abs.tgz")


def load_error(source: object, **kw: object) -> str:
    with pytest.raises(TaskLoadError) as e:
        load_tasks(source, **kw)  # type: ignore[arg-type]
    return str(e.value)


def test_load_errors_say_where_and_why(tmp_path: Path) -> None:
    assert "no task set at" in load_error(tmp_path / "missing.json")
    (tmp_path / "t.csv").write_text("a,b\n")
    assert "'.csv'" in load_error(tmp_path / "t.csv")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ROWS[0]) + "\n\n{not json\n")
    assert f"{bad}:3:" in load_error(bad)
    msg = load_error(write_json(tmp_path / "inv.json", [ROWS[0], dict(ROWS[1], workdir="w")]))
    assert "row 2" in msg and IDS[1] in msg and "workdir" in msg
    dup = write_json(tmp_path / "dup.json", [ROWS[0], ROWS[1], ROWS[0]])
    assert "appears twice" in load_error(dup) and IDS[0] in load_error(dup)


def test_unknown_split_and_ids(tmp_path: Path) -> None:
    path = write_json(tmp_path / "t.json", ROWS)
    msg = load_error(path, split="dev")
    assert "'dev'" in msg and "'test'" in msg and "'train'" in msg
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(
        str(tmp_path / "dd"))
    assert "train" in load_error(tmp_path / "dd", split="dev")
    assert "demo__nope-1" in load_error(path, ids=["demo__alpha-1", "demo__nope-1"])


def test_split_filter_keeps_order(tmp_path: Path) -> None:
    path = write_json(tmp_path / "t.json", ROWS)
    assert [t.instance_id for t in load_tasks(path, split="train")] == IDS[:2]
    assert [t.instance_id for t in load_tasks(path, ids=[IDS[2]])] == [IDS[2]]


def test_ids_filter_keeps_the_sets_order(tmp_path: Path) -> None:
    # load_tasks' docstring: "``ids`` keeps those instance ids, in the set's order".
    path = write_json(tmp_path / "t.json", ROWS)
    assert [t.instance_id for t in load_tasks(path, ids=[IDS[2], IDS[0]])] == [IDS[0], IDS[2]]


# --- 3. the bundled set ----------------------------------------------------------------------

BUG_KINDS = {"logic", "off_by_one", "wrong_api_use", "missing_edge_case", "multi_file",
             "new_function"}


@pytest.fixture(scope="module")
def bundled() -> list[SweTask]:
    return load_tasks("bundled")


def test_bundled_set_shape(bundled: list[SweTask]) -> None:
    assert len(bundled) >= 30
    assert {t.split for t in bundled} == {"train", "test"}
    assert {t.metadata.get("bug_kind") for t in bundled} == BUG_KINDS
    repos = [t.repo for t in bundled]
    assert len(set(repos)) == len(repos) and all(repos)


def test_every_bundled_task_is_well_formed(bundled: list[SweTask]) -> None:
    problems = {}
    for t in bundled:
        gold, tests = patch_files(t.patch), patch_files(t.test_patch)
        checks = {
            "FAIL_TO_PASS": len(t.FAIL_TO_PASS) >= 1, "PASS_TO_PASS": len(t.PASS_TO_PASS) >= 4,
            "gold patch": bool(t.patch.strip()) and bool(gold),
            "gold touches tests": not set(gold) & t.test_files(),
            "test patch": bool(tests) and all(p.startswith("tests/") for p in tests),
            "problem statement": bool(t.problem_statement.strip()),
            "source": t.source.kind == "dir" and Path(str(t.source.path)).is_dir()
            and (Path(str(t.source.path)) / ".gitignore").is_file()}
        if bad := [name for name, ok in checks.items() if not ok]:
            problems[t.instance_id] = bad
    assert problems == {}


# --- 4. HumanEval: the gold patch really solves the stub --------------------------------------


def test_humaneval_ids() -> None:
    tasks = load_tasks("humaneval")
    assert [t.instance_id for t in tasks] == [f"humaneval-{i}" for i in range(164)]


@pytest.mark.parametrize("number", [0, 38, 163])  # 38 calls a helper from its prompt
def test_humaneval_gold_patch_passes_and_stub_fails(tmp_path: Path, number: int) -> None:
    [task] = load_tasks("humaneval", ids=[f"humaneval-{number}"])
    assert task.source.files
    for name, text in task.source.files.items():
        (tmp_path / name).write_text(text)
    git(tmp_path, "init", "-q")

    def apply_and_test(patch_text: str) -> subprocess.CompletedProcess[str]:
        subprocess.run(["git", "apply", "-"], cwd=tmp_path, input=patch_text, check=True,
                       text=True, capture_output=True)
        return subprocess.run([SYS_PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "test_solution.py"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)

    stub = apply_and_test(task.test_patch)
    assert stub.returncode == 1 and "NotImplementedError" in stub.stdout, stub.stdout
    solved = apply_and_test(task.patch)
    assert solved.returncode == 0 and "1 passed" in solved.stdout, solved.stdout


# --- 5. scoring real pytest -rA output --------------------------------------------------------

GENERATED_TESTS = """\
import pytest
def test_ok(): pass
def test_bad(): assert 1 == 2
@pytest.mark.skip(reason="skipped F2P")
def test_skipped_f2p(): pass
@pytest.mark.skip(reason="skipped P2P")
def test_skipped_p2p(): pass
@pytest.mark.parametrize("x", [1, 2, 3])
def test_param(x): assert x != 2
"""


@pytest.fixture(scope="module")
def pytest_log(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("graded")
    (d / "test_gen.py").write_text(GENERATED_TESTS)
    out = subprocess.run([SYS_PYTHON, "-m", "pytest", "-rA", "-p", "no:cacheprovider",
                          "test_gen.py"], cwd=d, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "2 failed, 3 passed, 2 skipped" in out.stdout, out.stdout
    return out.stdout


def scored(log: str, f2p: list[str], p2p: list[str]) -> tuple[list[str], list[str]]:
    ids = [f"test_gen.py::{n}" for n in (*f2p, *p2p)]
    task = SweTask(instance_id="gen-1", problem_statement="p", FAIL_TO_PASS=ids[:len(f2p)],
                PASS_TO_PASS=ids[len(f2p):])
    f, p = grading.score(task, log)
    return [x.split("::")[1] for x in f], [x.split("::")[1] for x in p]


def test_status_parses_parametrized_ids(pytest_log: str) -> None:
    task = SweTask(instance_id="g", problem_statement="p", FAIL_TO_PASS=["a"])
    status = grading.test_status(task, pytest_log)
    assert {k: status[f"test_gen.py::test_param[{k}]"] for k in (1, 2, 3)} == {
        1: "PASSED", 2: "FAILED", 3: "PASSED"}


def test_score_failing_and_missing_tests(pytest_log: str) -> None:
    f2p, p2p = scored(pytest_log, ["test_ok", "test_param[2]", "test_missing"],
                      ["test_param[1]", "test_param[3]", "test_bad"])
    assert (f2p, p2p) == (["test_param[2]", "test_missing"], ["test_bad"])
    assert scored(pytest_log, ["test_ok", "test_param[3]"], ["test_param[1]"]) == ([], [])


def test_score_skipped_f2p_fails(pytest_log: str) -> None:
    assert scored(pytest_log, ["test_ok", "test_skipped_f2p"], []) == (["test_skipped_f2p"], [])


def test_score_skipped_p2p_under_rA_is_missing_and_fails(pytest_log: str) -> None:
    # pytest's -rA summary does not name skipped tests, so (as in SWE-bench's harness) a
    # skipped P2P test is missing from the log and counts as broken; a passing one is kept.
    assert scored(pytest_log, ["test_ok"], ["test_skipped_p2p", "test_param[1]"]) == (
        [], ["test_skipped_p2p"])


# --- 6. results: pass@k, summaries, files -----------------------------------------------------


def test_pass_at_k_matches_the_closed_form() -> None:
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                expected = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12), (n, c, k)
    for n, k in ((3, 4), (3, 0), (1, -1)):
        with pytest.raises(ValueError):
            pass_at_k(n, 0, k)


def rollout(tid: str, k: int, resolved: bool, *, failure: str | None = None,
            total: float = 10.0, env: float = 2.0, run_id: str = "r1") -> RolloutResult:
    grade = None if failure else SweGrade(
        instance_id=tid, resolved=resolved, reward=1.0 if resolved else -1.0,
        outcome="resolved" if resolved else "tests_failed")
    return RolloutResult(
        run_id=run_id, rollout_id=f"{run_id}.{tid}.{k}.1", instance_id=tid, sample=k,
        harness="oracle", resolved=resolved, grade=grade, n_steps=k + 1,
        failure=Failure(cls=failure, type="E", message="m") if failure else None,
        timings=Timings(total=total, env=env))


# task-a: 2 of 3 resolved; task-b: both failed before grading (environment, model).
RESULTS = [rollout("task-a", 0, True), rollout("task-a", 1, False, env=4.0),
           rollout("task-a", 2, True, total=20.0),
           rollout("task-b", 0, False, failure="environment"),
           rollout("task-b", 1, False, failure="model")]


def test_summarize() -> None:
    s = summarize(list(reversed(RESULTS)), n=3)
    o, a, b = s["overall"], s["tasks"]["task-a"], s["tasks"]["task-b"]
    assert (o["tasks"], o["rollouts"], o["resolved"]) == (2, 5, 2)
    assert o["resolved_rate"] == pytest.approx(2 / 5)
    assert a["pass_at_k"] == pytest.approx({"1": 2 / 3, "2": 1 - math.comb(1, 2) / math.comb(3, 2)})
    assert b["pass_at_k"] == {"1": 0.0, "2": 0.0} and b["n"] == 2
    assert o["pass_at_k"] == pytest.approx({"1": (2 / 3 + 0) / 2, "2": (1 + 0) / 2})
    assert o["failures"] == {"environment": 1, "model": 1} and a["failures"] == {}
    assert o["outcomes"] == {"resolved": 2, "tests_failed": 1, "not_graded": 2}
    assert o["env_share"] == pytest.approx((2 + 4 + 2 + 2 + 2) / (10 + 10 + 20 + 10 + 10))


def test_results_file_round_trip(tmp_path: Path) -> None:
    for r in RESULTS:
        append_result(tmp_path, r)
    assert read_results(tmp_path) == RESULTS == read_results(str(tmp_path))
    # The same rollout again (a rerun) wins over the earlier line.
    again = rollout("task-b", 1, True)
    append_result(tmp_path, again)
    # A crash mid-write leaves half a line: ignored, so that rollout reruns.
    cut = rollout("task-c", 0, True).model_dump_json()
    with open(tmp_path / ROLLOUTS_FILE, "a") as f:
        f.write(cut[: len(cut) // 2])
    got = {r.key: r for r in read_results(tmp_path)}
    assert set(got) == {r.key for r in RESULTS}
    assert got[("task-b", 1)] == again
    assert read_results(tmp_path / "nowhere") == []


def test_write_outputs(tmp_path: Path) -> None:
    summary = summarize(RESULTS, n=3)
    write_outputs(tmp_path, RESULTS, summary, {"run_id": "r1", "harness": "oracle"})
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["run"] == {"run_id": "r1", "harness": "oracle"}
    assert saved["overall"] == summary["overall"] and saved["tasks"] == summary["tasks"]
    rows = pq.read_table(tmp_path / "results.parquet").to_pylist()
    assert sorted((r["instance_id"], r["sample"]) for r in rows) == sorted(
        r.key for r in RESULTS)
    assert [r["failure_class"] for r in rows if r["instance_id"] == "task-b"] == [
        "environment", "model"]


# --- 7. reports -------------------------------------------------------------------------------


def run_summary(results: list[RolloutResult], run_id: str, harness: str) -> dict:
    return {"run": {"run_id": run_id, "harness": harness}, **summarize(results, n=3)}


SUMMARY_A = run_summary(RESULTS, "r1", "oracle")
SUMMARY_B = run_summary([rollout("task-a", 0, False), rollout("task-c", 0, True),
                         rollout("task-c", 1, True), rollout("task-d", 0, True)], "r2",
                        "mini-swe-agent")  # 75.0% resolved: no figure of run A


def rendered(tables: list) -> str:
    console = Console(record=True, width=200)
    for t in tables:
        console.print(t)
    return console.export_text()


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def test_run_table() -> None:
    text = rendered(run_table(SUMMARY_A))
    assert pct(SUMMARY_A["overall"]["resolved_rate"]) in text and "r1" in text
    assert all(tid in text for tid in SUMMARY_A["tasks"])
    assert "environment 1, model 1" in text
    assert "task-a" not in rendered(run_table(SUMMARY_A, per_task=False))


def test_compare_tables() -> None:
    text = rendered(compare_tables([SUMMARY_A, SUMMARY_B], [Path("runs/a"), Path("runs/b")]))
    for s in (SUMMARY_A, SUMMARY_B):
        assert pct(s["overall"]["resolved_rate"]) in text
    assert all(tid in text for tid in {*SUMMARY_A["tasks"], *SUMMARY_B["tasks"]})


def test_compare_tables_tell_runs_of_one_harness_apart() -> None:
    # run_label() adds the run directory's name, "oracle [baseline]", so that two runs of
    # the same harness get distinct columns.
    text = rendered(compare_tables([SUMMARY_A, SUMMARY_A],
                                   [Path("runs/baseline"), Path("runs/candidate")]))
    assert "oracle [baseline]" in text and "oracle [candidate]" in text


def test_draw_chart(tmp_path: Path) -> None:
    out = draw_chart([SUMMARY_A, SUMMARY_B], [Path("a"), Path("b")], tmp_path / "sub" / "c.png")
    data = out.read_bytes()
    assert out == tmp_path / "sub" / "c.png"
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


# --- 8. runner helpers ------------------------------------------------------------------------


def test_classify() -> None:
    import litellm.exceptions  # offline: conftest sets LITELLM_LOCAL_MODEL_COST_MAP

    assert classify(TaskSetupError("pre_commands failed")) == "task"
    assert classify(ConnectError("x")) == "environment"
    assert classify(WaitTimeout(504, "not ready")) == "environment"
    assert classify(litellm.exceptions.AuthenticationError(
        message="x", llm_provider="openai", model="m")) == "model"
    assert classify(ValueError("x")) == "harness"


def test_scaled_resources_double_per_attempt() -> None:
    two_gi = 2 * 1024**3
    assert _scaled("1", "2Gi", 1) == ("1", str(two_gi))
    assert _scaled("1", "2Gi", 3) == ("4", str(4 * two_gi))
    assert _scaled("500m", "512Mi", 2) == ("1", str(2 * 512 * 1024**2))


def test_run_dir_resume_and_mismatch(tmp_path: Path) -> None:
    tasks = load_tasks(write_json(tmp_path / "t.json", ROWS))
    out = tmp_path / "run"
    settings = {"tasks": "t.json", "harness": "oracle"}

    def runner(**s: object) -> Runner:
        return Runner(RunConfig(out=out, settings=settings | s), tasks, OracleHarness(),
                      client=None)  # type: ignore[arg-type]  # _open_run_dir needs none

    first = runner()
    saved = json.loads((out / "run.json").read_text())
    assert saved["run_id"] == first.run_id and first.run_id.startswith("r")
    assert saved["tasks"] == IDS and saved["settings"] == settings
    assert runner().run_id == first.run_id
    with pytest.raises(RunMismatch) as e:
        runner(harness="mini-swe-agent")
    assert str(out) in str(e.value) and first.run_id in str(e.value)
