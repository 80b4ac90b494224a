"""Shared helpers of the benchmarks: a private orchestrator, statistics, tables and JSON.

Every benchmark starts its own orchestrator as a child process (``BenchServer``) on a free
127.0.0.1 port with a fresh temporary data dir, and tears it down completely at the end:
delete every sandbox, SIGTERM the server, check that nothing leaked (no process still runs
from the data dir, no cgroup of its group still holds a process), remove the data dir.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Self

import httpx
import yaml
from rich.console import Console
from rich.table import Table

BENCH_DIR = Path(__file__).resolve().parent
# A test that runs a benchmark points this elsewhere, so the committed results stay as run.
RESULTS_DIR = Path(os.environ.get("ORCHARD_BENCH_RESULTS") or BENCH_DIR / "results")
REPO_ROOT = BENCH_DIR.parent
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Where a cgroup tree of each kind lives on a v1/hybrid host and on a pure v2 host.
CGROUP_TREES = ("pids", "memory", "cpu", "freezer", "unified", "")

console = Console()


# --- statistics -----------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation between closest ranks."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


def summarize_ms(seconds: Sequence[float]) -> dict[str, float]:
    """n, mean, min, p50, p90, p99, max of durations given in seconds, reported in ms."""
    ms = [s * 1000.0 for s in seconds]
    if not ms:
        return {"n": 0}
    return {
        "n": len(ms),
        "mean": statistics.fmean(ms),
        "min": min(ms),
        "p50": percentile(ms, 50),
        "p90": percentile(ms, 90),
        "p99": percentile(ms, 99),
        "max": max(ms),
    }


def verdict(value: float, limit: float) -> str:
    """'met' when value <= limit (a lower-is-better goal), else 'NOT met'."""
    return "met" if value <= limit else "NOT met"


def raw_spawn_baseline(n: int) -> list[float]:
    """Seconds per ``subprocess.run(["bash", "-c", "true"])`` on the host, n times."""
    times: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(["bash", "-c", "true"], check=True)
        times.append(time.perf_counter() - t0)
    return times


def process_cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_cpu_s() -> float:
    """CPU-seconds all CPUs spent not idle since boot (every process, not only ours)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


# --- output ---------------------------------------------------------------------------------


def fmt(value: Any, digits: int = 2) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    table = Table(title=title, title_justify="left")
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(fmt(v) for v in row))
    console.print(table)


def machine_info() -> dict[str, Any]:
    mem_kib = 0
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    return {
        "cpus": os.cpu_count(),
        "mem_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg": os.getloadavg(),
    }


def code_fingerprint() -> dict[str, Any]:
    """Which orchard/ code was measured: the tree is edited while benchmarks run."""
    h = hashlib.sha256()
    newest = 0.0
    for src in sorted((REPO_ROOT / "orchard").rglob("*.py")):
        h.update(str(src.relative_to(REPO_ROOT)).encode() + b"\0" + src.read_bytes())
        newest = max(newest, src.stat().st_mtime)
    backend = (REPO_ROOT / "orchard/env/backends/local/backend.py").read_text()
    return {
        "orchard_sha256": h.hexdigest()[:16],
        "newest_source_mtime": dt.datetime.fromtimestamp(newest, dt.UTC).isoformat(
            timespec="seconds"),
        "local_backend": "zygote" if "zygote" in backend else "per-sandbox interpreter",
    }


def write_json(name: str, args: argparse.Namespace, results: dict[str, Any]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    tag = getattr(args, "tag", None)
    path = RESULTS_DIR / (f"{name}-{tag}.json" if tag else f"{name}.json")
    doc = {
        "benchmark": name,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "argv": sys.argv[1:],
        "args": vars(args),
        "machine": machine_info(),
        "code": CODE_AT_START,
        "code_at_end": code_fingerprint(),
        "results": results,
    }
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    console.print(f"[dim]results written to {path}[/dim]")
    return path


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--port", type=int, default=0, help="orchestrator port (0: a free one)")
    parser.add_argument("--tag", help="write bench/results/<name>-<tag>.json instead")
    return parser


# --- the orchestrator under test ------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cgroup_group_key(data_dir: Path, sub: str = "local") -> str:
    """The per-data-dir cgroup group the local backend uses: ``orchard/<key>``.

    Mirrors ``LocalBackend.__init__``: sha256 of the resolved ``<data_dir>/<sub>``, 12 hex
    (``sub`` is "local" for an orchestrator; the fake kubelet's backend lives in "kubelet").
    """
    return hashlib.sha256(str((data_dir / sub).resolve()).encode()).hexdigest()[:12]


def group_dirs(data_dir: Path, sub: str = "local") -> list[Path]:
    """This orchestrator's cgroup group directories, one per mounted hierarchy."""
    key = cgroup_group_key(data_dir, sub)
    out = []
    for tree in CGROUP_TREES:
        d = CGROUP_ROOT / tree / "orchard" / key if tree else CGROUP_ROOT / "orchard" / key
        if d.is_dir():
            out.append(d)
    return out


def sandbox_cgroup(data_dir: Path, sandbox_id: str) -> Path | None:
    """The sandbox's cgroup in the pids hierarchy (v1) or the unified one (v2)."""
    key = cgroup_group_key(data_dir)
    for base in (CGROUP_ROOT / "pids", CGROUP_ROOT / "unified", CGROUP_ROOT):
        d = base / "orchard" / key / sandbox_id
        if (d / "cgroup.procs").exists():
            return d
    return None


def cgroup_pids(cgroup_dir: Path) -> list[int]:
    try:
        text = (cgroup_dir / "cgroup.procs").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def processes_mentioning(needle: str) -> list[tuple[int, str]]:
    """(pid, cmdline) of every process whose command line contains ``needle``."""
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            raw = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        cmd = raw.replace(b"\0", b" ").decode(errors="replace")
        if needle in cmd:
            found.append((int(entry), cmd[:160]))
    return found


def leak_report(data_dir: Path, sub: str = "local") -> dict[str, Any]:
    """What of this orchestrator is still alive: cgroups holding processes, processes."""
    busy: dict[str, int] = {}
    sandbox_dirs = 0
    for group in group_dirs(data_dir, sub):
        for d in group.iterdir():
            if not d.is_dir():
                continue
            sandbox_dirs += 1
            pids = cgroup_pids(d)
            if pids:
                busy[str(d)] = len(pids)
    procs = processes_mentioning(str(data_dir))
    return {
        "cgroup_dirs_left": sandbox_dirs,
        "cgroups_with_processes": busy,
        "processes_left": [cmd for _, cmd in procs],
        "leaked": bool(busy or procs),
    }


def force_kill_group(data_dir: Path, sub: str = "local") -> int:
    """Kill what is left in this orchestrator's own cgroups (only ours: orchard/<our key>).

    Only for a server that failed to tear its sandboxes down; returns the processes killed.
    """
    pids: set[int] = set()
    for group in group_dirs(data_dir, sub):
        for d in group.iterdir():
            if not d.is_dir() or not cgroup_pids(d):
                continue
            pids.update(cgroup_pids(d))
            if (d / "cgroup.kill").exists():
                with contextlib.suppress(OSError):
                    (d / "cgroup.kill").write_text("1")
    killed = 0
    for pid in sorted(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
        cgroup_pids(d) for g in group_dirs(data_dir, sub) for d in g.iterdir() if d.is_dir()
    ):
        time.sleep(0.1)
    return killed


def remove_group_dirs(data_dir: Path, sub: str = "local") -> None:
    """Remove our now-empty cgroup group directories (only ours: orchard/<our key>)."""
    for group in group_dirs(data_dir, sub):
        for d in [*group.iterdir(), group]:
            if d.is_dir() and not cgroup_pids(d):
                with contextlib.suppress(OSError):
                    d.rmdir()


class StartStop:
    """The context-manager side of a helper with start() and stop(): a start that fails
    half-way still stops what it started."""

    def start(self) -> Any:
        raise NotImplementedError

    def stop(self) -> Any:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _unwind_on_signals() -> dict[int, Any]:
    """SIGINT and SIGTERM raise KeyboardInterrupt in the main thread from now on, so a bench
    stopped either way unwinds through its servers' stop. A bench started in the background
    by a script inherits SIGINT ignored, and a plain SIGTERM kills it without unwinding,
    which leaves the orchestrator (its own session) and the temp dir behind. Returns the
    handlers it replaced."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, signal.default_int_handler)
            for sig in (signal.SIGINT, signal.SIGTERM)}


class BenchServer(StartStop):
    """``serve(...)`` in a child process, with a private data dir; a context manager.

    ``settings``: more orchestrator settings (e.g. ``{"backend": "kubernetes", "kubernetes":
    {...}}``), written to a YAML config file in the temp dir and passed as ``config=``.
    ``drained``: for a backend whose sandboxes are not this host's cgroups, a check that
    their teardown is complete; ``stop`` waits for it after deleting every sandbox, before
    SIGTERM (deletion answers at once, teardown follows).
    """

    def __init__(self, *, max_sandboxes: int = 2000, max_concurrent_creates: int = 64,
                 port: int = 0, startup_timeout: float = 90.0,
                 settings: dict[str, Any] | None = None,
                 drained: Callable[[], bool] | None = None, tree: Path | None = None) -> None:
        self.max_sandboxes = max_sandboxes
        self.max_concurrent_creates = max_concurrent_creates
        self.settings = settings
        self.drained = drained
        self.tree = tree  # another checkout's code (a baseline), instead of this one
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.startup_timeout = startup_timeout
        # Short and free of ',' and ':' (the backend refuses those in overlay options).
        self.tmp = Path(tempfile.mkdtemp(prefix="orchard-bench-", dir="/tmp"))
        self.data_dir = self.tmp / "data"
        self.log_path = self.tmp / "server.log"
        self.config_path: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.leaks: dict[str, Any] = {}
        self._handlers: dict[int, Any] = {}

    def start(self) -> str:
        self._handlers = _unwind_on_signals()
        config = ""
        if self.settings:
            self.config_path = self.tmp / "config.yaml"
            self.config_path.write_text(yaml.safe_dump(self.settings, sort_keys=False))
            config = f"config=Path({str(self.config_path)!r}), "
        code = (
            "from pathlib import Path; from orchard.env.server import serve; "
            f"serve(port={self.port}, data_dir=Path({str(self.data_dir)!r}), {config}"
            f"log_level='warning', max_sandboxes={self.max_sandboxes}, "
            f"max_concurrent_creates={self.max_concurrent_creates})"
        )
        log = self.log_path.open("wb")
        env = {**os.environ, "PYTHONPATH": str(self.tree)} if self.tree else None
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            cwd=self.tree or REPO_ROOT, start_new_session=True, env=env,
        )
        log.close()
        deadline = time.monotonic() + self.startup_timeout
        with httpx.Client(timeout=2.0) as http:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"orchestrator exited with {self.proc.returncode}:\n"
                                       + self.log_tail())
                with contextlib.suppress(httpx.HTTPError):
                    if http.get(f"{self.url}/health").status_code == 200:
                        return self.url
                if time.monotonic() > deadline:
                    raise RuntimeError(f"orchestrator not healthy after {self.startup_timeout}s")
                time.sleep(0.05)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def delete_all(self, timeout: float = 120.0) -> int:
        """Delete every sandbox the server lists; returns how many it had."""
        if self.proc is None or self.proc.poll() is not None:
            return 0
        with httpx.Client(base_url=self.url, timeout=30.0) as http:
            try:
                ids = [s["sandbox_id"] for s in http.get("/sandboxes").json()["sandboxes"]]
            except httpx.HTTPError:
                return 0

            def delete(sid: str) -> None:
                with contextlib.suppress(httpx.HTTPError):
                    http.delete(f"/sandboxes/{sid}")

            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                list(pool.map(delete, ids))
            # Deletion answers at once; teardown (kill the cgroup, remove the dir) follows.
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                left = [d for g in group_dirs(self.data_dir) for d in g.iterdir() if d.is_dir()
                        and cgroup_pids(d)]
                if not left and (self.drained is None or self.drained()):
                    break
                time.sleep(0.1)
        return len(ids)

    def stop(self) -> dict[str, Any]:
        """Delete all sandboxes, SIGTERM the server, check for leaks, remove the data dir."""
        deleted = self.delete_all()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        time.sleep(0.5)
        self.leaks = {"sandboxes_deleted_at_stop": deleted, **leak_report(self.data_dir)}
        if self.leaks["leaked"]:
            console.print(f"[bold red]LEAK after stop:[/bold red] {self.leaks}")
            self.leaks["force_killed"] = force_kill_group(self.data_dir)
            self.leaks["after_force_kill"] = leak_report(self.data_dir)
        remove_group_dirs(self.data_dir)
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.leaks["data_dir_removed"] = not self.tmp.exists()
        for sig, handler in self._handlers.items():
            if handler is not None:  # None: set outside Python, so it cannot be put back
                signal.signal(sig, handler)
        self._handlers = {}
        return self.leaks



def print_leaks(leaks: dict[str, Any]) -> None:
    status = "[red]LEAKED[/red]" if leaks.get("leaked") else "[green]clean[/green]"
    console.print(
        f"teardown: {status}; sandboxes deleted at stop: {leaks.get('sandboxes_deleted_at_stop')},"
        f" cgroups with processes: {len(leaks.get('cgroups_with_processes', {}))}, processes "
        f"left: {len(leaks.get('processes_left', []))}, data dir removed: "
        f"{leaks.get('data_dir_removed')}"
    )


# --- creating sandboxes in bulk -------------------------------------------------------------


async def create_sandboxes_async(url: str, n: int, concurrency: int = 16) -> list[str]:
    """Create ``n`` sandboxes (each waited ready) at bounded concurrency; returns their ids.

    The client does not delete them on close: the caller (or ``BenchServer.stop``) does.
    """
    import asyncio

    from orchard.env.client import AsyncSandboxClient

    sem = asyncio.Semaphore(concurrency)
    async with AsyncSandboxClient(url, timeout=120.0, cleanup_on_close=False) as client:

        async def one() -> str:
            async with sem:
                sb = await client.create_sandbox()
                return sb.id

        return list(await asyncio.gather(*(one() for _ in range(n))))


def create_sandboxes(url: str, n: int, concurrency: int = 16) -> list[str]:
    import asyncio

    return asyncio.run(create_sandboxes_async(url, n, concurrency))


CODE_AT_START = code_fingerprint()


def finish(name: str, args: Any, results: dict[str, Any], server: BenchServer,
           report: Callable[[Any, dict[str, Any]], None]) -> int:
    """Record the server's teardown, print the report, write the JSON; the exit code says
    whether anything leaked."""
    results["teardown"] = server.leaks
    report(args, results)
    write_json(name, args, results)
    print_leaks(server.leaks)
    return 1 if server.leaks.get("leaked") else 0
