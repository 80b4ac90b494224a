"""Real-kernel tests for per-sandbox cgroups (run as root; adapt to v1, v2 and hybrid hosts)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from orchard.env.backends.local.cgroupfs import read_file
from orchard.env.backends.local.cgroups import (
    CgroupError,
    CgroupManager,
    parse_cpu,
    parse_memory,
)
from tests.conftest import wait_until

ROOT = Path("/sys/fs/cgroup")

# -- parsing (no privileges needed) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("q", "cores"),
    [
        ("2", 2.0),
        ("0.5", 0.5),
        ("500m", 0.5),
        ("1m", 0.001),
        ("1.", 1.0),
        (".25", 0.25),
        (" 3 ", 3.0),
        ("1500m", 1.5),
    ],
)
def test_parse_cpu(q: str, cores: float) -> None:
    assert parse_cpu(q) == pytest.approx(cores)


@pytest.mark.parametrize(
    ("q", "fragment"),
    [
        ("", "invalid cpu"),
        ("-1", "invalid cpu"),
        ("0", "at least 1m"),
        ("0.5m", "at least 1m"),
        ("2 cores", "invalid cpu"),
        ("1e3", "invalid cpu"),
        ("nan", "invalid cpu"),
        ("1Gi", "invalid cpu"),
    ],
)
def test_parse_cpu_errors(q: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        parse_cpu(q)


@pytest.mark.parametrize(
    ("q", "size"),
    [
        ("512Mi", 512 * 2**20),
        ("8Gi", 8 * 2**30),
        ("1G", 10**9),
        ("1000", 1000),
        ("1.5Gi", 3 * 2**29),
        ("64k", 64_000),
        ("1Ki", 1024),
        ("2Ti", 2 * 2**40),
        ("1E", 10**18),
        ("0.5", 1),
    ],
)
def test_parse_memory(q: str, size: int) -> None:
    assert parse_memory(q) == size


@pytest.mark.parametrize(
    ("q", "fragment"),
    [
        ("", "invalid memory"),
        ("-1Mi", "invalid memory"),
        ("0", "greater than zero"),
        ("512m", "did you mean 'Mi'"),
        ("1K", "Ki/Mi/Gi"),
        ("1GB", "Ki/Mi/Gi"),
        ("1e9", "invalid memory"),
        ("lots", "invalid memory"),
    ],
)
def test_parse_memory_errors(q: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        parse_memory(q)


# -- real cgroups -----------------------------------------------------------------------------

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not ROOT.is_dir(), reason="needs root and a cgroup filesystem"
)


def _group_dirs(mgr: CgroupManager) -> set[Path]:
    return {
        Path(where.split(":", 1)[1]) / mgr.group
        for where in mgr.layout().values()
        if where != "unavailable"
    }


@contextmanager
def _managed(group: str, root: Path) -> Iterator[CgroupManager]:
    """A manager whose sandboxes and group directories are all removed afterwards."""
    mgr = CgroupManager(group, root)
    try:
        yield mgr
    finally:
        for sid in mgr.list():
            mgr.kill(sid)
        assert mgr.list() == set()
        for d in _group_dirs(mgr):
            if d.exists():
                assert not [p for p in d.iterdir() if p.is_dir()], f"left behind under {d}"
                d.rmdir()
        assert not any(d.exists() for d in _group_dirs(mgr))


@pytest.fixture
def group() -> str:
    return f"orchard-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def mgr(group: str) -> Iterator[CgroupManager]:
    with _managed(group, ROOT) as m:
        yield m


def _launch(mgr: CgroupManager, sid: str, *argv: str) -> subprocess.Popen[str]:
    """Start argv inside the sandbox's cgroups, joining them before exec like a launcher."""
    files = [str(p) for p in mgr.procs_files(sid)]
    script = (
        'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n-1)); '
        'done; exec "$@"'
    )
    return subprocess.Popen(
        ["sh", "-c", script, "sh", str(len(files)), *files, *argv],
        stdout=subprocess.PIPE,
        text=True,
    )


def _gone_or_zombie(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return "\nState:\tZ" in status


def _layout_roots() -> list[Path]:
    """The default root plus every single hierarchy mount, so each kill strategy gets tested:
    cgroup.kill (v2), freeze + signal (v1 freezer), and plain signalling (e.g. v1 pids)."""
    if os.geteuid() != 0 or not ROOT.is_dir():
        return [ROOT]
    layout = CgroupManager("probe", ROOT).layout()
    mounts = {Path(w.split(":", 1)[1]) for w in layout.values() if w != "unavailable"}
    return [ROOT, *sorted(m for m in mounts if m != ROOT)]


@needs_root
def test_layout_and_bad_names(mgr: CgroupManager) -> None:
    layout = mgr.layout()
    print("layout:", layout)
    assert set(layout) == {"cpu", "memory", "pids", "freezer", "kill"}
    assert all(v == "unavailable" or v[:3] in ("v1:", "v2:") for v in layout.values())
    for bad in ("../escape", "a/b", "", ".hidden"):
        with pytest.raises(ValueError, match="invalid sandbox id"):
            mgr.create(bad, None, None, None)
    with pytest.raises(ValueError, match="relative path"):
        CgroupManager("../elsewhere")
    with pytest.raises(ValueError, match="invalid memory"):
        mgr.create("s1", None, "12 megs", None)
    assert mgr.list() == set()


@needs_root
def test_create_twice_and_procs_files(mgr: CgroupManager) -> None:
    with pytest.raises(CgroupError, match="create"):
        mgr.procs_files("dup")
    mgr.create("dup", None, None, None)
    files = mgr.procs_files("dup")
    assert files and all(f.name == "cgroup.procs" and f.exists() for f in files)
    with pytest.raises(CgroupError, match="already exists"):
        mgr.create("dup", None, None, None)


@needs_root
def test_reading_a_cgroup_removed_under_us_means_gone(mgr: CgroupManager) -> None:
    # A reader racing the removal holds the file open while the cgroup goes.
    # Reopening through /proc/self/fd reproduces that race every time.
    mgr.create("racing", None, None, None)
    fds = [os.open(f, os.O_RDONLY) for f in mgr.procs_files("racing")]
    try:
        mgr.kill("racing")
        assert "racing" not in mgr.list()
        for fd in fds:
            assert read_file(Path(f"/proc/self/fd/{fd}")) is None
    finally:
        for fd in fds:
            os.close(fd)
    assert read_file(ROOT / "no-such-cgroup" / "cgroup.procs") is None
    with pytest.raises(IsADirectoryError):
        read_file(ROOT)


@needs_root
def test_unwritable_cgroupfs_raises_with_hint(mgr: CgroupManager) -> None:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child process
        code = 3
        try:
            os.setgid(65534)
            os.setuid(65534)
            mgr.create("nobody", None, None, None)
            code = 1
        except CgroupError as exc:
            code = 0 if "run as root" in str(exc) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@needs_root
def test_memory_limit_oom_kills(mgr: CgroupManager) -> None:
    res = mgr.create("mem", None, "64Mi", None)
    print(res)
    if not res["memory"].enforced:
        assert "memory" in res["memory"].detail
        pytest.skip(res["memory"].detail)
    assert mgr.memory_usage("mem") is not None
    assert not mgr.oom_killed("mem")
    proc = _launch(
        mgr,
        "mem",
        sys.executable,
        "-c",
        "chunks = []\n"
        "for _ in range(20): chunks.append(b'x' * (10 << 20))\n"
        "print('survived', flush=True)",
    )
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == -9, out
    assert "survived" not in out
    assert mgr.oom_killed("mem")


@needs_root
def test_pids_limit(mgr: CgroupManager) -> None:
    res = mgr.create("pids", None, None, 20)
    print(res)
    if not res["pids"].enforced:
        assert "pids" in res["pids"].detail
        pytest.skip(res["pids"].detail)
    proc = _launch(
        mgr,
        "pids",
        sys.executable,
        "-c",
        "import os, time\n"
        "kids, err = 0, None\n"
        "for _ in range(100):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as e:\n"
        "        err = e.errno\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    kids += 1\n"
        "print(kids, err, flush=True)\n"
        "time.sleep(60)\n",
    )
    assert proc.stdout is not None
    kids, err = proc.stdout.readline().split()
    assert err == str(errno.EAGAIN)
    assert int(kids) + 1 <= 20
    assert len(mgr.pids("pids")) == int(kids) + 1
    mgr.kill("pids")
    assert proc.wait(timeout=10) == -9


@needs_root
def test_cpu_limit(mgr: CgroupManager) -> None:
    res = mgr.create("cpu", "250m", None, None)
    tiny = mgr.create("cpu-tiny", "1m", None, None)
    print(res, tiny)
    if not res["cpu"].enforced:
        assert "cpu" in res["cpu"].detail
        pytest.skip(res["cpu"].detail)
    version, mount = mgr.layout()["cpu"].split(":", 1)
    d, dt = (Path(mount) / mgr.group / sid for sid in ("cpu", "cpu-tiny"))
    if version == "v1":
        assert (d / "cpu.cfs_quota_us").read_text().split() == ["25000"]
        assert (d / "cpu.cfs_period_us").read_text().split() == ["100000"]
        # 1m cannot be expressed in a 100ms period: the kernel's floor is a 1ms quota.
        assert (dt / "cpu.cfs_quota_us").read_text().split() == ["1000"]
        assert (dt / "cpu.cfs_period_us").read_text().split() == ["1000000"]
    else:
        assert (d / "cpu.max").read_text().split() == ["25000", "100000"]
        assert (dt / "cpu.max").read_text().split() == ["1000", "1000000"]
    proc = _launch(
        mgr,
        "cpu",
        sys.executable,
        "-c",
        "import time\n"
        "end = time.monotonic() + 1.0\n"
        "while time.monotonic() < end: pass\n"
        "print(time.process_time(), flush=True)\n",
    )
    out, _ = proc.communicate(timeout=30)
    share = float(out)
    print(f"busy loop for 1s wall under a 0.25-core limit used {share:.2f}s of CPU")
    assert share < 0.75


@needs_root
@pytest.mark.parametrize("root", _layout_roots(), ids=str)
def test_kill_process_tree(group: str, root: Path) -> None:
    with _managed(group, root) as mgr:
        print(root, mgr.layout())
        mgr.create("tree", None, None, None)
        mgr.create("bystander", None, None, None)
        assert mgr.list() == {"tree", "bystander"}
        proc = _launch(
            mgr,
            "tree",
            sys.executable,
            "-c",
            "import os, signal, subprocess, time\n"
            "subprocess.Popen(['sleep', '300'])\n"
            "subprocess.Popen(['sh', '-c', 'sleep 300 & sleep 300 & wait'])\n"
            "if os.fork() == 0:\n"  # a daemon: double fork + setsid escapes the process tree
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "        time.sleep(300)\n"
            "    os._exit(0)\n"
            "print('ready', flush=True)\n"
            "time.sleep(300)\n",
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        # launcher python, sleep, sh + 2 sleeps, daemon = 6
        assert wait_until(lambda: len(mgr.pids("tree")) >= 6), mgr.pids("tree")
        members = mgr.pids("tree")
        assert proc.pid in members

        mgr.kill("tree", timeout=5)
        assert proc.wait(timeout=5) == -9
        assert mgr.pids("tree") == set()
        assert all(_gone_or_zombie(p) for p in members)
        assert not any((d / "tree").exists() for d in _group_dirs(mgr))
        assert mgr.list() == {"bystander"}
        mgr.kill("tree")  # idempotent
        mgr.kill("never-created")
        assert mgr.list() == {"bystander"}


@needs_root
def test_v2_code_paths(group: str) -> None:
    """Exercise the v2 tree directly: enforced where it has controllers, honest where not."""
    v2 = CgroupManager(group, ROOT).layout()["kill"]
    if v2 == "unavailable":
        pytest.skip("no cgroup v2 mount on this host")
    v2_root = Path(v2.split(":", 1)[1])
    with _managed(group, v2_root) as mgr:
        layout = mgr.layout()
        print(layout)
        res = mgr.create("v2", "1", "128Mi", 32)
        print(res)
        d = v2_root / mgr.group / "v2"
        expected = {
            "cpu": ("cpu.max", "100000 100000"),
            "memory": ("memory.max", "134217728"),
            "pids": ("pids.max", "32"),
        }
        for name, (filename, value) in expected.items():
            if layout[name] == "unavailable":
                assert not res[name].enforced
                assert f"no {name} controller on this host" in res[name].detail
            elif res[name].enforced:
                assert (d / filename).read_text().strip() == value
            else:
                assert "delegated" in res[name].detail or "subtree_control" in res[name].detail
        host = CgroupManager(group, ROOT).layout()
        for name in expected:
            if host[name].startswith("v1:"):  # hybrid: bound to v1, so v2 cannot enforce it
                assert not res[name].enforced

        assert mgr.procs_files("v2") == [d / "cgroup.procs"]
        proc = _launch(mgr, "v2", "sh", "-c", "sleep 300 & sleep 300 & echo ready; wait")
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        assert len(mgr.pids("v2")) == 3
        # v2 "no internal processes": the group directory itself stays empty.
        assert (v2_root / mgr.group / "cgroup.procs").read_text() == ""
        mgr.kill("v2")
        assert proc.wait(timeout=5) == -9
        assert not d.exists()
        assert mgr.list() == set()
