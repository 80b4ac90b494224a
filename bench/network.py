"""Create and exec latency of networked sandboxes, next to blocked ones and a raw spawn.

For each mode (``block_network`` true, then false, then false with an ``egress`` allow-list,
which adds the sandbox's own resolver) on one orchestrator: n sequential
create -> ready -> delete lifecycles (create = POST + wait), then n interleaved rounds of one
raw host ``bash -c true`` and one ``exec(["true"])`` in a sandbox of that mode. With
``--baseline-tree DIR`` (a checkout of older code, e.g. ``git worktree add /tmp/base <rev>``)
the same runs against an orchestrator from that tree too, in the same run, so the two are
compared under the same noise.

    .venv/bin/python bench/network.py [-n 40] [--baseline-tree /tmp/base] [--quick]
"""

from __future__ import annotations

import statistics
import subprocess
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

from orchard.env.client import SandboxClient  # noqa: E402

# TEST-NET-3: allowed, never sent to (the runs only exec `true`).
ALLOW_LIST = ["203.0.113.0/24"]
MODES = (("blocked", True, None), ("networked", False, None),
         ("allow-listed", False, ALLOW_LIST))


def lifecycles(client: SandboxClient, n: int, block_network: bool,
               egress: list[str] | None) -> list[float]:
    took = []
    for _ in range(n):
        t0 = time.perf_counter()
        sb = client.create_sandbox("host", block_network=block_network, egress=egress)
        took.append(time.perf_counter() - t0)
        sb.delete()
    return took


def execs(client: SandboxClient, n: int, block_network: bool,
          egress: list[str] | None) -> dict[str, list[float]]:
    sb = client.create_sandbox("host", block_network=block_network, egress=egress)
    raw, ex = [], []
    try:
        for _ in range(10):
            sb.exec(["true"])
        for _ in range(n):
            t0 = time.perf_counter()
            subprocess.run(["bash", "-c", "true"], check=True)
            raw.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            sb.exec(["true"])
            ex.append(time.perf_counter() - t0)
    finally:
        sb.delete()
    return {"raw": raw, "exec": ex}


def measure(server: BenchServer, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with server, SandboxClient(server.url, timeout=60) as client:
        for mode, blocked, egress in MODES:
            create = lifecycles(client, n, blocked, egress)
            run = execs(client, n, blocked, egress)
            out[mode] = {"create": summarize_ms(create), "exec": summarize_ms(run["exec"]),
                         "raw": summarize_ms(run["raw"]),
                         "exec_ratio": statistics.median(run["exec"])
                         / statistics.median(run["raw"])}
    return out


def report(args: Any, results: dict[str, Any]) -> None:
    rows = []
    for tree, modes in results["trees"].items():
        for mode, r in modes.items():
            rows.append([tree, mode, r["create"]["p50"], r["create"]["p90"], r["exec"]["p50"],
                         r["raw"]["p50"], f"{r['exec_ratio']:.2f}x"])
    print_table(f"create -> ready and exec latency, n={args.n} (ms)",
                ["code", "mode", "create p50", "create p90", "exec p50", "raw spawn p50",
                 "exec / raw"], rows)


def main() -> int:
    parser = base_parser(__doc__ or "")
    parser.add_argument("-n", type=int, default=40)
    parser.add_argument("--baseline-tree", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.n = 8
    results: dict[str, Any] = {"trees": {}}
    servers = [("this", BenchServer())]
    if args.baseline_tree:
        results["baseline_tree"] = str(args.baseline_tree)
        servers.append(("baseline", BenchServer(tree=args.baseline_tree)))
    leaked = False
    for name, server in servers:
        results["trees"][name] = measure(server, args.n)
        results.setdefault("teardowns", {})[name] = server.leaks
        leaked |= bool(server.leaks.get("leaked"))
    return finish("network", args, results, servers[0][1], report) or int(leaked)


if __name__ == "__main__":
    sys.exit(main())
