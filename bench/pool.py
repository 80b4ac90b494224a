"""Create -> ready from a warm pool against a cold launch, at the API, in the same run.

One orchestrator with a pool of ``--size`` 'host' sandboxes. n interleaved rounds of: a warm
create (POST /sandboxes for the pool's shape; it answers running, taken from the pool), then
a cold one (the same shape with its own ``sandbox_id``, which a pool cannot serve: POST, then
GET .../wait). Each sandbox is deleted after its round, untimed, and each warm round first
waits, untimed, for a ready pool sandbox, so every warm create is a hit unless the pool is
empty (misses are counted and timed as cold). At the end the server is restarted without
``pools:``, which deletes the pool's sandboxes, before the usual teardown and leak check.
The issue's goal: a pool create p50 <= 5 ms.

    .venv/bin/python bench/pool.py [-n 100] [--size 4] [--quick]
"""

from __future__ import annotations

import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    BenchServer,
    base_parser,
    finish,
    print_table,
    summarize_ms,
    verdict,
)

GOAL_MS = 5.0


def ready(http: httpx.Client) -> int:
    return http.get("/pools").json()[0]["ready"]


def wait_for(predicate: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError("the pool did not fill in time")
        time.sleep(0.01)


def rounds(http: httpx.Client, n: int) -> dict[str, Any]:
    warm, cold, misses = [], [], 0
    for i in range(n):
        wait_for(lambda: ready(http) >= 1)
        t0 = time.perf_counter()
        r = http.post("/sandboxes", json={"image": "host"}).json()
        if r["pool"] is None:  # a miss: a cold launch after all
            misses += 1
            http.get(f"/sandboxes/{r['sandbox_id']}/wait", params={"timeout": 60})
        warm.append(time.perf_counter() - t0)
        assert r["status"] in ("running", "pending"), r
        http.delete(f"/sandboxes/{r['sandbox_id']}")
        t0 = time.perf_counter()
        sid = http.post("/sandboxes", json={"image": "host", "sandbox_id": f"cold-{i}"}).json()[
            "sandbox_id"]
        rec = http.get(f"/sandboxes/{sid}/wait", params={"timeout": 60}).json()
        cold.append(time.perf_counter() - t0)
        assert rec["status"] == "running" and rec["pool"] is None, rec
        http.delete(f"/sandboxes/{sid}")
    return {"warm": summarize_ms(warm), "cold": summarize_ms(cold), "misses": misses,
            "speedup_p50": statistics.median(cold) / statistics.median(warm)}


def drain_pool(server: BenchServer) -> None:
    """Restart the server without pools: its first pass deletes the pool's sandboxes."""
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(30)
    server.settings = None
    server.start()
    with httpx.Client(base_url=server.url, timeout=30) as http:
        wait_for(lambda: http.get("/pools").json() == [])
    server.delete_all()


def report(args: Any, results: dict[str, Any]) -> None:
    r = results["rounds"]
    rows = [[kind, r[kind]["p50"], r[kind]["p90"], r[kind]["p99"], r[kind]["max"]]
            for kind in ("warm", "cold")]
    print_table(f"create -> ready at the API, n={args.n}, pool size {args.size} (ms)",
                ["create", "p50", "p90", "p99", "max"], rows)
    print(f"cold p50 / warm p50: {r['speedup_p50']:.1f}x; pool misses: {r['misses']}; "
          f"goal warm p50 <= {GOAL_MS} ms: {results['goal']}")


def main() -> int:
    parser = base_parser(__doc__ or "")
    parser.add_argument("-n", type=int, default=100)
    parser.add_argument("--size", type=int, default=4)
    args = parser.parse_args()
    if args.quick:
        args.n = 10
    server = BenchServer(port=args.port, settings={
        "pools": [{"name": "bench", "image": "host", "size": args.size}],
        "reconcile_interval": 1, "pool_interval": 0.2})
    with server:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            wait_for(lambda: ready(http) == args.size)
            results: dict[str, Any] = {"rounds": rounds(http, args.n)}
            results["pools"] = http.get("/pools").json()
        drain_pool(server)
    results["goal"] = verdict(results["rounds"]["warm"]["p50"], GOAL_MS)
    return finish("pool", args, results, server, report)


if __name__ == "__main__":
    sys.exit(main())
