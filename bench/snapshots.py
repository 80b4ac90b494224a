"""Snapshots, forks and pause on the local backend, against creating from scratch.

One orchestrator, one run. A source sandbox gets a git repository (a working tree of random
text files committed once, about --repo-mb on disk with its .git). Then:

* scratch: ``--forks`` sandboxes created side by side, each running the same set-up again
  (the baseline a fork replaces), time until every one has the repository;
* snapshot: a snapshot of the source, repeated (``--repeat``), median;
* fork: ``--forks`` forks of the source, time to each fork's first exec (``true``) and to a
  ``git status`` after it, from the fork request;
* disk: bytes each fork stores after those, against the snapshot's bytes (goal: <= 5%);
* pause: pause + resume round trips of the source;
* burst: ``--burst`` forks in one request, time until all are ready, next to the same number
  of bare creates (no set-up) in one burst.

    .venv/bin/python bench/snapshots.py [--repo-mb 200] [--forks 8] [--burst 1000] [--quick]
"""

from __future__ import annotations

import concurrent.futures
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    BenchServer,
    base_parser,
    finish,
    print_table,
    summarize_ms,
)

from orchard.env.client import Sandbox, SandboxClient  # noqa: E402

GIT_STATUS = "git -C /workspace/repo status --short | wc -l"


def setup_script(repo_mb: int) -> str:
    """About repo_mb on disk: half in the working tree, the rest in .git (base64 text packs
    to about three quarters of its size)."""
    files = max(1, repo_mb * 1024 // 2 // 256)  # 256 KiB files
    return (
        "set -e; mkdir -p /workspace/repo && cd /workspace/repo && git init -q . && "
        f"for i in $(seq {files}); do head -c 196608 /dev/urandom | base64 -w 100 "
        "> f$i.txt; done && git add -A && git -c user.name=b -c user.email=b@b "
        "commit -qm init && du -sb /workspace/repo | cut -f1"
    )


def disk_bytes(top: Path) -> int:
    return sum(p.lstat().st_blocks * 512 for p in top.rglob("*"))


def scratch(client: SandboxClient, n: int, setup: str) -> dict[str, Any]:
    """n sandboxes made the old way, side by side: create, then the set-up in each."""
    def one(_: int) -> float:
        t0 = time.perf_counter()
        sb = client.create_sandbox()
        try:
            result = sb.exec(setup, timeout=1200)
            assert result.ok, result.stderr
            assert sb.exec(GIT_STATUS).ok
            return time.perf_counter() - t0
        finally:
            sb.delete()

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        each = list(pool.map(one, range(n)))
    return {"all_s": time.perf_counter() - t0, "each": summarize_ms(each)}


def forks(client: SandboxClient, source: Sandbox, n: int, data_dir: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    made = source.fork(n, wait=False, keep_snapshot=True)
    forked = time.perf_counter() - t0

    def first_execs(sb: Sandbox) -> tuple[float, float]:
        sb.wait_ready()
        assert sb.exec("true").ok
        first = time.perf_counter() - t0
        # git re-reads every file whose inode changed, as in any fresh checkout.
        assert sb.exec(GIT_STATUS).ok
        return first, time.perf_counter() - t0

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        timed = list(pool.map(first_execs, made))
    firsts, gits = [t[0] for t in timed], [t[1] for t in timed]
    all_s = time.perf_counter() - t0
    snap_id = made[0].info.from_snapshot
    assert snap_id is not None
    snap_bytes = disk_bytes(data_dir / "local" / "snapshots" / snap_id)
    per_fork = [disk_bytes(data_dir / "local" / "sandboxes" / sb.id / "upper") for sb in made]
    for sb in made:
        sb.delete()
    client.delete_snapshot(snap_id)
    return {"fork_request_ms": forked * 1000, "first_exec": summarize_ms(firsts),
            "git_status_done": summarize_ms(gits),
            "all_s": all_s, "snapshot_bytes": snap_bytes,
            "fork_bytes_median": statistics.median(per_fork), "fork_bytes_max": max(per_fork),
            "fork_share_max": max(per_fork) / snap_bytes}


def snapshots(client: SandboxClient, source: Sandbox, repeat: int) -> dict[str, Any]:
    took, size = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        snap = source.snapshot()
        took.append(time.perf_counter() - t0)
        size = snap.size_bytes
        client.delete_snapshot(snap.snapshot_id)
    return {"took": summarize_ms(took), "size_bytes": size}


def pauses(source: Sandbox, repeat: int) -> dict[str, Any]:
    took = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        source.pause()
        source.resume()
        took.append(time.perf_counter() - t0)
    return summarize_ms(took)


def burst_forks(client: SandboxClient, source: Sandbox, n: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    made = source.fork(n, wait=False)
    for sb in made:
        sb.wait_ready(600)
    took = time.perf_counter() - t0
    delete_all(client, made)
    return {"n": n, "all_ready_s": took}


def burst_creates(client: SandboxClient, n: int) -> dict[str, Any]:
    t0 = time.perf_counter()

    def one(_: int) -> Sandbox:
        return client.create_sandbox(timeout=600)

    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        made = list(pool.map(one, range(n)))
    took = time.perf_counter() - t0
    delete_all(client, made)
    return {"n": n, "all_ready_s": took}


def delete_all(client: SandboxClient, made: list[Sandbox]) -> None:
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda sb: sb.delete(), made))
    while len(client.list_sandboxes()) > 1:  # the source stays
        time.sleep(0.2)


def report(args: Any, r: dict[str, Any]) -> None:
    s, f, sc = r["snapshot"], r["fork"], r["scratch"]
    rows = [
        ["repository in the source", f"{r['repo_bytes'] / 1e6:.0f} MB", "", ""],
        ["set-up once (create + git repo)", f"{r['setup_s']:.2f} s", "", ""],
        ["snapshot", f"{s['took']['p50']:.0f} ms", f"{s['size_bytes'] / 1e6:.0f} MB", ""],
        [f"{args.forks} forks: request", f"{f['fork_request_ms']:.0f} ms", "", ""],
        [f"{args.forks} forks: first exec p50", f"{f['first_exec']['p50']:.0f} ms",
         f"all {f['all_s']:.2f} s",
         f"{sc['all_s'] / f['all_s']:.1f}x faster than scratch"],
        [f"{args.forks} forks: git status done p50", f"{f['git_status_done']['p50']:.0f} ms",
         "", ""],
        [f"{args.forks} from scratch (create + set-up + git status each)",
         f"{sc['each']['p50']:.0f} ms",
         f"all {sc['all_s']:.2f} s", ""],
        ["bytes on disk per fork (max)", f"{f['fork_bytes_max'] / 1e3:.0f} kB",
         f"{100 * f['fork_share_max']:.2f}% of snapshot", "goal <= 5%: "
         + ("met" if f["fork_share_max"] <= 0.05 else "NOT met")],
        ["pause + resume round trip p50", f"{r['pause']['p50']:.1f} ms", "", ""],
    ]
    if "burst_forks" in r:
        bf, bc = r["burst_forks"], r["burst_creates"]
        rows += [[f"{bf['n']} forks in one request, all ready", f"{bf['all_ready_s']:.1f} s", "",
                  ""],
                 [f"{bc['n']} bare creates (no set-up), all ready",
                  f"{bc['all_ready_s']:.1f} s", "", ""]]
    print_table("snapshots, forks and pause (local backend, one run)",
                ["what", "median / time", "", "vs baseline"], rows)


def main() -> int:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--repo-mb", type=int, default=200)
    parser.add_argument("--forks", type=int, default=8)
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if args.quick:
        args.repo_mb, args.forks, args.burst, args.repeat = 8, 3, 20, 2
    setup = setup_script(args.repo_mb)
    server = BenchServer(max_sandboxes=max(2000, args.burst + 16))
    results: dict[str, Any] = {}
    with server, SandboxClient(server.url, timeout=600) as client:
        t0 = time.perf_counter()
        source = client.create_sandbox(ttl=86400)
        done = source.exec(setup, timeout=1200)
        assert done.ok, done.stderr
        results["setup_s"] = time.perf_counter() - t0
        results["repo_bytes"] = int(done.stdout.split()[-1])
        results["scratch"] = scratch(client, args.forks, setup)
        results["snapshot"] = snapshots(client, source, args.repeat)
        results["fork"] = forks(client, source, args.forks, server.data_dir)
        results["pause"] = pauses(source, 20 if not args.quick else 5)
        if args.burst:
            results["burst_forks"] = burst_forks(client, source, args.burst)
            results["burst_creates"] = burst_creates(client, args.burst)
        source.delete()
    return finish("snapshots", args, results, server, report)


if __name__ == "__main__":
    sys.exit(main())
