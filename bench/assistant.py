"""The assistant domain: tool round trips (HTTP API, MCP) and the 200-task eval's wall time.

One orchestrator, one run, "host" sandboxes with the assistant's services started on a
hand-written task's world.

* round trip: ``--calls`` read-only tool calls (``contacts_search``) through the orchestrator's
  service requests, over the plain HTTP API and over MCP (the mcp SDK's client session), next
  to a bare exec of ``true`` in the same sandbox (the baseline);
* eval: ``orchard eval`` of the 200 generated tasks with the scripted assistant teacher
  (solving everything), 2 at a time: wall time and rollouts per minute;
* judge: the hand-written tasks that have a rubric, ``--judged`` rollouts each, one at a time,
  with and without a scripted judge (the teacher model server answering with scores over real
  HTTP): the judge's time per rollout, from its recorded calls and from the wall times.

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

from orchard.domains.assistant import (  # noqa: E402
    call_tool,
    generate,
    load_assistant_tasks,
    start_services,
)
from orchard.env.client import AsyncSandboxClient, SandboxClient  # noqa: E402


def round_trips(client: SandboxClient, url: str, n: int) -> dict[str, Any]:
    from orchard.domains.assistant.mcp_client import mcp_session

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
    from orchard.domains import make_harness
    from orchard.eval import RunConfig, evaluate

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


def judge_overhead(client: SandboxClient, n: int) -> dict[str, Any]:
    import json
    import re

    from orchard.domains import make_harness
    from orchard.eval import RunConfig, evaluate
    from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
    from orchard.testing.policies import Reply
    from orchard.testing.teacher import FunctionPolicy, TeacherServer

    def scores(messages: list[dict[str, Any]], tools: Any) -> Reply:
        count = len(re.findall(r"^\d+\. ", str(messages[-1]["content"]), re.MULTILINE))
        return Reply(content=json.dumps({"scores": [1.0] * count}))

    tasks = [t for t in load_assistant_tasks("assistant-hand") if t.rubric]
    walls: dict[str, float] = {}
    judged: list[float] = []
    with TeacherServer(FunctionPolicy(scores), load_tokenizer(TEST_TOKENIZER),
                       model_name="judge") as judge, \
            tempfile.TemporaryDirectory(prefix="orchard-bench-judge-") as tmp:
        for name, url in (("plain", None), ("judged", f"{judge.url}/v1")):
            out = Path(tmp) / name
            t0 = time.perf_counter()
            evaluate(tasks, make_harness("assistant-teacher", tasks, judge_url=url), out,
                     client, config=RunConfig(out=out, n=n, concurrency=1))
            walls[name] = time.perf_counter() - t0
            if url:
                for trace in (out / "traces").glob("*.json"):
                    calls = json.loads(trace.read_text())["judge_calls"]
                    judged.append(sum(c["latency_ms"] for c in calls) / 1000)
    rollouts = len(tasks) * n
    return {"rollouts": rollouts, "judge_call": summarize_ms(judged),
            "wall_plain_s": walls["plain"], "wall_judged_s": walls["judged"],
            "per_rollout_ms": (walls["judged"] - walls["plain"]) / rollouts * 1000}


def report(args: Any, r: dict[str, Any]) -> None:
    t, e, j = r["round_trip"], r["eval"], r["judge"]
    rows = [
        ["tool call over the HTTP API (p50)", f"{t['http']['p50']:.1f} ms",
         f"{t['http']['p50'] / t['exec']['p50']:.1f}x an exec"],
        ["tool call over MCP, the mcp SDK's session (p50)", f"{t['mcp']['p50']:.1f} ms",
         f"{t['mcp']['p50'] / t['exec']['p50']:.1f}x an exec"],
        ["exec of true, same sandbox (baseline, p50)", f"{t['exec']['p50']:.1f} ms", ""],
        [f"eval of {e['tasks']} generated tasks, assistant teacher, 2 at a time",
         f"{e['wall_s']:.1f} s", f"resolved {e['resolved_rate']:.0%}, "
         f"{e['rollouts_per_minute']:.1f} rollouts/min"],
        ["judge call per rollout, scripted judge (p50 of its recorded calls)",
         f"{j['judge_call']['p50']:.1f} ms", f"{j['rollouts']} rollouts"],
        ["eval wall time per rollout, judged - not judged",
         f"{j['per_rollout_ms']:.0f} ms", f"{j['wall_judged_s']:.1f} s vs "
         f"{j['wall_plain_s']:.1f} s"],
    ]
    print_table("the assistant domain (one run)", ["what", "measured", "vs"], rows)


def main() -> int:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--judged", type=int, default=5)
    args = parser.parse_args()
    if args.quick:
        args.calls, args.judged = 5, 1
    server = BenchServer()
    results: dict[str, Any] = {}
    with server, SandboxClient(server.url, timeout=300) as client:
        results["round_trip"] = round_trips(client, server.url, args.calls)
        results["eval"] = teacher_eval(client, args.quick)
        results["judge"] = judge_overhead(client, args.judged)
    return finish("assistant", args, results, server, report)


if __name__ == "__main__":
    sys.exit(main())
