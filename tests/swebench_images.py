"""SWE-bench instances for tests and benches: a tiny repository, rows in SWE-bench's schema,
and instance images that run swebench's own eval scripts.

An instance image holds what a SWE-bench eval script expects: ``/testbed`` as a git
repository at the instance's base commit, ``/opt/miniconda3/bin/activate`` (sourced before
``conda activate testbed``), bash, git, python and pytest. These come from the host's Debian
packages (``python3-pytest``, ``git``, ``bash``) on a busybox base, with the shared libraries
``ldd`` names, so the image is small and built without network or Docker.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from orchard.domains.swe.model import file_diff
from tests.image_fixtures import make_busybox_rootfs, make_oci_layout

PYTHON = Path("/usr/bin/python3")
# The conda environment a SWE-bench eval script activates: here, the host's python on PATH.
ACTIVATE = """\
# Stands in for miniconda's activate script: `conda activate testbed` puts the testbed's
# python (the image's /usr/bin/python3) first on PATH.
conda() { export PATH=/opt/miniconda3/envs/testbed/bin:$PATH; }
export PATH=/opt/miniconda3/bin:$PATH
"""
_GIT_ENV = {"GIT_AUTHOR_NAME": "dev", "GIT_AUTHOR_EMAIL": "dev@localhost",
            "GIT_COMMITTER_NAME": "dev", "GIT_COMMITTER_EMAIL": "dev@localhost",
            "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+0000",
            "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+0000"}

REPO = "orchard-test/calc"
CALC = ('def add(a, b):\n    """The sum of a and b."""\n    return a - b\n\n\n'
        'def neg(a):\n    return a\n')
OLD_TESTS = ("from calc import add, neg\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n\n\n"
             "def test_neg_zero():\n    assert neg(0) == 0\n")
ADD_TESTS = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
NEG_TESTS = "from calc import neg\n\n\ndef test_neg():\n    assert neg(2) == -2\n"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True, env={**os.environ, **_GIT_ENV}).stdout.strip()


def make_calc_repo(dest: Path) -> dict[str, str]:
    """The upstream repository: two base commits, one per instance. Returns their ids."""
    dest.mkdir(parents=True)
    _git(dest, "init", "-q", "-b", "main")
    (dest / "tests").mkdir()
    (dest / "calc.py").write_text(CALC)
    (dest / "tests" / "test_calc.py").write_text(OLD_TESTS)
    (dest / ".gitignore").write_text("__pycache__/\n")
    # Puts the repository on sys.path for `pytest` (a SWE-bench testbed installs it instead).
    (dest / "conftest.py").write_text("")
    _git(dest, "add", "-A")
    _git(dest, "commit", "-q", "-m", "calc")
    first = _git(dest, "rev-parse", "HEAD")
    (dest / "README").write_text("calc: add and neg\n")
    _git(dest, "add", "-A")
    _git(dest, "commit", "-q", "-m", "readme")
    return {"orchard-test__calc-1": first, "orchard-test__calc-2": _git(dest, "rev-parse", "HEAD")}


def eval_script(base_commit: str, test_patch: str, test_files: list[str]) -> str:
    """An eval script in the shape swebench's harness writes for a Python repository."""
    files = " ".join(test_files)
    return "\n".join([
        "#!/bin/bash", "set -uxo pipefail",
        "source /opt/miniconda3/bin/activate", "conda activate testbed",
        "cd /testbed", "git config --global --add safe.directory /testbed", "cd /testbed",
        "git status", "git show", f"git -c core.fileMode=false diff {base_commit}",
        "source /opt/miniconda3/bin/activate", "conda activate testbed",
        f"git checkout {base_commit} {files}",
        "git apply -v - <<'EOF_114329324912'", test_patch.rstrip("\n"), "EOF_114329324912",
        ": '>>>>> Start Test Output'",
        f"pytest -rA -p no:cacheprovider {files}",
        ": '>>>>> End Test Output'",
        f"git checkout {base_commit} {files}", ""])


def calc_rows(commits: dict[str, str]) -> list[dict[str, Any]]:
    """Two instances in SWE-bench's schema (the columns swebench 5 publishes), no ``image``."""
    gold_add = file_diff("calc.py", CALC, CALC.replace("return a - b", "return a + b"))
    gold_neg = file_diff("calc.py", CALC, CALC.replace("return a\n", "return -a\n"))
    specs = [("orchard-test__calc-1", gold_add, "tests/test_add.py", ADD_TESTS,
              "add() subtracts", ["tests/test_add.py::test_add"]),
             ("orchard-test__calc-2", gold_neg, "tests/test_neg.py", NEG_TESTS,
              "neg() returns its argument", ["tests/test_neg.py::test_neg"])]
    rows = []
    for iid, gold, test_file, tests, issue, f2p in specs:
        test_patch = file_diff(test_file, None, tests)
        base = commits[iid]
        rows.append({
            "repo": REPO, "instance_id": iid, "base_commit": base, "patch": gold,
            "test_patch": test_patch, "problem_statement": issue, "hints_text": "",
            "created_at": "2024-01-01T00:00:00Z", "version": "1.0",
            "FAIL_TO_PASS": json.dumps(f2p),
            "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_zero",
                                        "tests/test_calc.py::test_neg_zero"]),
            "environment_setup_commit": base, "difficulty": "<15 min fix",
            "eval_script": eval_script(base, test_patch, ["tests/test_calc.py", test_file]),
            "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail"})
    return rows


def write_jsonl(rows: Iterable[dict[str, Any]], path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_parquet(rows: list[dict[str, Any]], path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _host_files() -> set[Path]:
    """bash, git, python and pytest with what they load, from the host."""
    python = PYTHON.resolve()
    paths = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['stdlib'])"],
        check=True, capture_output=True, text=True).stdout.split()
    stdlib = Path(paths[0])
    files = {Path("/usr/bin/bash"), Path("/usr/bin/git"), python}
    for path in stdlib.rglob("*"):
        rel = path.relative_to(stdlib).parts
        # Not the tests, the GUI, or config-*/ (the static libpython, half the size).
        if path.is_file() and not rel[0].startswith("config-") and not {
                "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "__pycache__",
                "lib2to3", "pydoc_data"} & set(rel):
            files.add(path)
    for package in _python_packages("python3-pytest"):
        listed = subprocess.run(["dpkg", "-L", package], check=True, capture_output=True,
                                text=True).stdout.split("\n")
        files |= {Path(p) for p in listed if "/dist-packages/" in p and Path(p).is_file()
                  and "__pycache__" not in p}
    elfs = [f for f in files if f.suffix == ".so" or f in (python, Path("/usr/bin/git"),
                                                              Path("/usr/bin/bash"))]
    out = subprocess.run(["ldd", *map(str, elfs)], capture_output=True, text=True).stdout
    for line in out.splitlines():
        for word in line.split():
            if word.startswith("/") and Path(word).exists():
                files.add(Path(word))
    return files


def _python_packages(root: str) -> set[str]:
    """``root`` and the python3-* Debian packages it depends on, installed ones only."""
    seen: set[str] = set()
    todo = [root]
    while todo:
        package = todo.pop()
        if package in seen:
            continue
        seen.add(package)
        r = subprocess.run(["dpkg-query", "-W", "-f=${Depends}", package],
                           capture_output=True, text=True)
        for alternative in r.stdout.split(","):
            for name in (a.split()[0].split(":")[0] for a in alternative.split("|")
                         if a.strip()):
                if name.startswith("python3-") and _installed(name):
                    todo.append(name)
                    break
    return seen


def _installed(package: str) -> bool:
    r = subprocess.run(["dpkg-query", "-W", "-f=${db:Status-Status}", package],
                       capture_output=True, text=True)
    return r.stdout == "installed"


def make_testbed_rootfs(dest: Path) -> Path:
    """The image without its repository: busybox, the host's bash/git/python/pytest, and the
    conda activation path SWE-bench eval scripts source."""
    make_busybox_rootfs(dest)
    for src in sorted(_host_files()):
        target = dest / str(src).lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)  # follows symlinks: the file under the name it is loaded by
    python = PYTHON.resolve()
    for link in (dest / "usr/bin/python3", dest / "bin/bash", dest / "bin/git"):
        if link.exists() or link.is_symlink():
            link.unlink()
    (dest / "usr/bin/python3").symlink_to(python.name)
    (dest / "bin/bash").symlink_to("/usr/bin/bash")
    (dest / "bin/git").symlink_to("/usr/bin/git")
    env_bin = dest / "opt/miniconda3/envs/testbed/bin"
    env_bin.mkdir(parents=True)
    for name in ("python", "python3"):
        (env_bin / name).symlink_to(f"/usr/bin/{python.name}")
    (env_bin / "pytest").write_text(f"#!/usr/bin/{python.name}\nimport sys\nimport pytest\n"
                                    "sys.exit(pytest.console_main())\n")
    (env_bin / "pytest").chmod(0o755)
    (dest / "opt/miniconda3/bin").mkdir(parents=True)
    (dest / "opt/miniconda3/bin/activate").write_text(ACTIVATE)
    return dest


def testbed_layer(upstream: Path, base_commit: str) -> bytes:
    """The image's last layer: /testbed, a clone of ``upstream`` checked out at
    ``base_commit``."""
    work = upstream.parent / f"testbed-{base_commit[:12]}"
    subprocess.run(["git", "clone", "-q", str(upstream), str(work)], check=True)
    _git(work, "-c", "advice.detachedHead=false", "checkout", "-q", base_commit)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(work, arcname="testbed")
    shutil.rmtree(work)
    return buf.getvalue()


# As swebench's instance images set it: a plain PATH, /testbed the working directory.
IMAGE_CONFIG = {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                "WorkingDir": "/testbed", "Cmd": ["/bin/bash"]}


def make_instance_image(rootfs: Path, upstream: Path, base_commit: str, dest: Path) -> Path:
    """An OCI layout: the testbed rootfs, then /testbed at ``base_commit``."""
    return make_oci_layout(rootfs, dest, [testbed_layer(upstream, base_commit)],
                           config=IMAGE_CONFIG)
