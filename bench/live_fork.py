"""Live snapshots and forks (CRIU) on the local backend, against their files-only twins.

One orchestrator, one run; medians of --repeat:

* checkpoint: a live snapshot of a sandbox whose Python server holds --heap-mb of heap (pages
  it wrote), its time and bytes, next to a files-only snapshot of the same sandbox;
* restore: a sandbox created from the live snapshot, until its server answers with the same
  heap digest, next to one created from the files-only snapshot with the server started again
  (the baseline a live snapshot replaces: the heap is built anew);
* fork of --forks: live forks until every fork's server answers, next to files-only forks
  with a restart in each;
* web branch: a web rollout (the web teacher on shop-buy-mouse) branched before its --turn-th
  model call: a live fork of a sandbox at that turn until its first observation, next to
  replaying the first --turn turns in a fresh sandbox (orchard.rollout.traces.restore).

    .venv/bin/python bench/live_fork.py [--heap-mb 200] [--forks 8] [--turn 5] [--quick]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import BenchServer, base_parser, finish, print_table  # noqa: E402

from orchard.domains import make_harness  # noqa: E402
from orchard.domains.web import load_web_tasks  # noqa: E402
from orchard.env.client import Sandbox, SandboxClient  # noqa: E402
from orchard.eval import RunConfig, evaluate  # noqa: E402
from orchard.recipes.trajectories import load_trajectories  # noqa: E402
from orchard.rollout.traces.branch import restore  # noqa: E402

# The heap is random 1 MiB blocks, so every page is present and distinct to CRIU.
SERVER = r'''
import hashlib, http.server, os, sys
heap = [os.urandom(1 << 20) for _ in range(int(sys.argv[1]))]
digest = hashlib.sha256(b"".join(h[:64] for h in heap)).hexdigest().encode()
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(digest)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", 8123), Handler).serve_forever()
'''
ASK = ("python3 -c \"import urllib.request; "
       "print(urllib.request.urlopen('http://127.0.0.1:8123').read().decode())\"")


def answer(sb: Sandbox, timeout: float = 120) -> str:
    """The server's digest, once it answers."""
    deadline = time.monotonic() + timeout
    while True:
        done = sb.exec(ASK)
        if done.exit_code == 0:
            return done.stdout.strip()
        if time.monotonic() > deadline:
            raise RuntimeError(f"no answer from the server in {sb.id}: {done.stderr}")
        time.sleep(0.05)


def start_server(sb: Sandbox, heap_mb: int) -> None:
    sb.start_process(f"python3 /workspace/server.py {heap_mb}")


def median_of(repeat: int, run: Callable[[], float]) -> float:
    return statistics.median(run() for _ in range(repeat))


def checkpoints(client: SandboxClient, sb: Sandbox, repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, memory in (("live", True), ("files", False)):
        took, size = [], 0
        for _ in range(repeat):
            t0 = time.perf_counter()
            snap = sb.snapshot(memory=memory)
            took.append(time.perf_counter() - t0)
            size = (snap.memory_bytes or 0) + snap.size_bytes
            client.delete_snapshot(snap.snapshot_id)
        out[kind] = {"s": statistics.median(took), "bytes": size}
    return out


def restores(client: SandboxClient, sb: Sandbox, digest: str, heap_mb: int,
             repeat: int) -> dict[str, Any]:
    live, files = sb.snapshot(memory=True, keep=True), sb.snapshot(keep=True)

    def from_live() -> float:
        t0 = time.perf_counter()
        with client.create_sandbox(from_snapshot=live.snapshot_id) as new:
            assert answer(new) == digest  # the same heap, not a new one
            return time.perf_counter() - t0

    def from_files() -> float:
        t0 = time.perf_counter()
        with client.create_sandbox(from_snapshot=files.snapshot_id) as new:
            start_server(new, heap_mb)
            answer(new)
            return time.perf_counter() - t0

    out = {"live_s": median_of(repeat, from_live), "files_s": median_of(repeat, from_files)}
    for snap in (live, files):
        client.delete_snapshot(snap.snapshot_id)
    return out


def forks(sb: Sandbox, digest: str, heap_mb: int, n: int, repeat: int) -> dict[str, Any]:
    def fork(memory: bool) -> float:
        t0 = time.perf_counter()
        made = sb.fork(n, memory=memory)
        try:
            for new in made:
                if not memory:
                    start_server(new, heap_mb)
            for new in made:
                got = answer(new)
                assert not memory or got == digest
            return time.perf_counter() - t0
        finally:
            for new in made:
                new.delete()

    return {"live_s": median_of(repeat, lambda: fork(True)),
            "files_s": median_of(repeat, lambda: fork(False))}


def web_branch(client: SandboxClient, turn: int, repeat: int) -> dict[str, Any]:
    task = next(t for t in load_web_tasks() if t.instance_id == "shop-buy-mouse")
    with tempfile.TemporaryDirectory(prefix="orchard-live-fork-") as tmp:
        out = Path(tmp) / "run"
        evaluate([task], make_harness("web-teacher", [task], teacher_solve=1.0), out, client,
                 config=RunConfig(out=out))
        (traj,) = load_trajectories(out)
        trace = traj.trace()
    assert len(traj.steps) > turn, f"the rollout has {len(traj.steps)} turns, not > {turn}"
    replays, lives, same = [], [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        replayed = restore(trace, client, turn)
        page = replayed.browser("observe")
        replays.append(time.perf_counter() - t0)
        try:
            t0 = time.perf_counter()
            (fork,) = replayed.fork(1, memory=True)
            seen = fork.browser("observe")
            lives.append(time.perf_counter() - t0)
            same.append((seen.url, seen.tree) == (page.url, page.tree))
            fork.delete()
        finally:
            replayed.delete()
    return {"turn": turn, "replay_s": statistics.median(replays),
            "live_fork_s": statistics.median(lives), "same_page": all(same)}


def report(args: Any, r: dict[str, Any]) -> None:
    c, rs, f, w = r["checkpoint"], r["restore"], r["fork"], r["web"]
    rows = [
        [f"checkpoint, {args.heap_mb} MB heap", f"{c['live']['s']:.2f} s",
         f"{c['live']['bytes'] / 1e6:.0f} MB",
         f"files-only snapshot {c['files']['s']:.2f} s, {c['files']['bytes'] / 1e6:.1f} MB"],
        ["restore: create from it until it answers", f"{rs['live_s']:.2f} s", "",
         f"files-only + restart {rs['files_s']:.2f} s "
         f"({rs['files_s'] / rs['live_s']:.1f}x the live one)"],
        [f"fork of {args.forks} until all answer", f"{f['live_s']:.2f} s", "",
         f"files-only + restart {f['files_s']:.2f} s "
         f"({f['files_s'] / f['live_s']:.1f}x the live one)"],
        [f"web branch at turn {w['turn']}: live fork + observe", f"{w['live_fork_s']:.2f} s",
         "same page" if w["same_page"] else "PAGE DIFFERS",
         f"replaying {w['turn']} turns {w['replay_s']:.2f} s "
         f"({w['replay_s'] / w['live_fork_s']:.1f}x the live fork)"],
    ]
    print_table(f"live snapshots and forks (CRIU, local backend, one run, median of "
                f"{args.repeat})", ["what", "median", "bytes", "baseline"], rows)


def main() -> int:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--heap-mb", type=int, default=200)
    parser.add_argument("--forks", type=int, default=8)
    parser.add_argument("--turn", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.quick:
        args.heap_mb, args.forks, args.repeat = 16, 2, 1
    server = BenchServer()
    results: dict[str, Any] = {}
    with server, SandboxClient(server.url, timeout=600) as client:
        with client.create_sandbox(memory="2Gi") as sb:
            sb.upload_content(SERVER.encode(), "/workspace/server.py")
            start_server(sb, args.heap_mb)
            digest = answer(sb)
            results["checkpoint"] = checkpoints(client, sb, args.repeat)
            results["restore"] = restores(client, sb, digest, args.heap_mb, args.repeat)
            results["fork"] = forks(sb, digest, args.heap_mb, args.forks, args.repeat)
        results["web"] = web_branch(client, args.turn, args.repeat)
    return finish("live_fork", args, results, server, report)


if __name__ == "__main__":
    sys.exit(main())
