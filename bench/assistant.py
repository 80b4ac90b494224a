"""The assistant domain: tool round trips (HTTP API, MCP) and the 200-task eval's wall time.

One orchestrator, one run, "host" sandboxes with the assistant's services started on a
hand-written task's world.

* round trip: ``--calls`` read-only tool calls (``contacts_search``) through the orchestrator's
  service requests, over the plain HTTP API and over MCP (the mcp SDK's client session), next
  to a bare exec of ``true`` in the same sandbox (the baseline);
* eval: ``orchard eval`` of the 200 generated tasks with the scripted assistant teacher
  (solving everything), 2 at a time: wall time and rollouts per minute.

    .venv/bin/python bench/assistant.py [--calls 50] [--quick]
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import BenchServer, base_parser, finish, print_table, summarize_ms  # noqa: E402

from orchard.env.client import AsyncSandboxClient, SandboxClient  # noqa: E402
from orchard.tasks.assistant import (  # noqa: E402
    call_tool,
    generate,
    load_assistant_tasks,
    start_services,
)


def round_trips(client: SandboxClient, url: str, n: int) -> dict[str, Any]:
    from orchard.tasks.assistant.mcp_client import mcp_session

    sb = client.create_sandbox()
    try:
        start_services(sb, load_assistant_tasks("assistant-hand")[0])
        http, execs = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            assert call_tool(sb, "contacts_search", {"query": "dana"})[0]
            http.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            sb.exec(["true"])
            execs.append(time.perf_counter() - t0)

        async def over_mcp() -> list[float]:
            times = []
            async with AsyncSandboxClient(url) as aclient, \
                    mcp_session(await aclient.get_sandbox(sb.id)) as session:
                for _ in range(n):
                    t0 = time.perf_counter()
                    result = await session.call_tool("contacts_search", {"query": "dana"})
                    assert not result.is_error
                    times.append(time.perf_counter() - t0)
            return times

        mcp = asyncio.run(over_mcp())
    finally:
        sb.delete()
    return {"http": summarize_ms(http), "mcp": summarize_ms(mcp), "exec": summarize_ms(execs)}


def teacher_eval(client: SandboxClient, quick: bool) -> dict[str, Any]:
    from orchard.eval import RunConfig, evaluate, make_harness

    tasks = generate(20 if quick else 200)
    with tempfile.TemporaryDirectory(prefix="orchard-bench-assistant-") as tmp:
        out = Path(tmp)
        t0 = time.perf_counter()
        summary = evaluate(tasks, make_harness("assistant-teacher", tasks), out, client,
                           config=RunConfig(out=out, concurrency=2))
        wall = time.perf_counter() - t0
    overall = summary["overall"]
    return {"tasks": len(tasks), "wall_s": wall, "resolved_rate": overall["resolved_rate"],
            "rollouts_per_minute": overall.get("rollouts_per_minute"),
            "failures": overall.get("failures", {})}


def report(args: Any, r: dict[str, Any]) -> None:
    t, e = r["round_trip"], r["eval"]
    rows = [
        ["tool call over the HTTP API (p50)", f"{t['http']['p50']:.1f} ms",
         f"{t['http']['p50'] / t['exec']['p50']:.1f}x an exec"],
        ["tool call over MCP, the mcp SDK's session (p50)", f"{t['mcp']['p50']:.1f} ms",
         f"{t['mcp']['p50'] / t['exec']['p50']:.1f}x an exec"],
        ["exec of true, same sandbox (baseline, p50)", f"{t['exec']['p50']:.1f} ms", ""],
        [f"eval of {e['tasks']} generated tasks, assistant teacher, 2 at a time",
         f"{e['wall_s']:.1f} s", f"resolved {e['resolved_rate']:.0%}, "
         f"{e['rollouts_per_minute']:.1f} rollouts/min"],
    ]
    print_table("the assistant domain (one run)", ["what", "measured", "vs"], rows)


def main() -> int:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    if args.quick:
        args.calls = 5
    server = BenchServer()
    results: dict[str, Any] = {}
    with server, SandboxClient(server.url, timeout=300) as client:
        results["round_trip"] = round_trips(client, server.url, args.calls)
        results["eval"] = teacher_eval(client, args.quick)
    return finish("assistant", args, results, server, report)


if __name__ == "__main__":
    sys.exit(main())
