"""``orchard tour`` (`make tour`): the sandbox service doing real work, with nothing to set up.

Starts a private orchestrator (``SandboxClient.local()``), then shows exec, files, a patch,
streaming, a timeout that kills a whole process tree, background processes and isolation,
timing each step, and ends with an evaluation run (a harness on the bundled test tasks, graded
in fresh sandboxes). Everything it creates is deleted when it ends.
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from orchard import SandboxClient

app = typer.Typer()

PATCH = """\
--- a/hello.py
+++ b/hello.py
@@ -1 +1 @@
-print("hello")
+print("hello, patched")
"""


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _eval(client: SandboxClient, out: Path, rows: list[tuple[str, str, str]]) -> list[Table]:
    """The rollout pipeline end to end: mini-swe-agent driven by the scripted teacher model
    (which solves half the tasks) through the recording proxy, on the bundled test split,
    each patch graded in a fresh sandbox."""
    from orchard.domains.swe import load_tasks
    from orchard.domains.swe.harness import TeacherHarness
    from orchard.eval import RunConfig, evaluate, run_table

    tasks = load_tasks("bundled", split="test")
    harness = TeacherHarness(tasks, solve=0.5)
    t = time.perf_counter()
    summary = evaluate(tasks, harness, out, client, config=RunConfig(out=out, concurrency=2))
    took = time.perf_counter() - t
    rate, intended = summary["overall"]["resolved_rate"], len(harness.solved) / len(tasks)
    rows.append((f"eval: teacher via mini-swe-agent, {len(tasks)} bundled test tasks",
                 "[green]ok[/]" if rate == intended else "[red]FAILED[/]",
                 f"resolved {rate:.0%} (script solves {intended:.0%}), graded in fresh "
                 f"sandboxes  ({_ms(took)})"))
    return run_table({"run": {"run_id": out.name, "harness": "teacher"}, **summary},
                     per_task=False)


@app.command("tour")
def main() -> None:
    """A tour of the sandbox service on a private embedded orchestrator (needs root)."""
    console = Console()
    rows: list[tuple[str, str, str]] = []

    def step(name: str, fn, check) -> object:  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        value = fn()
        took = time.perf_counter() - t0
        ok, shown = check(value)
        rows.append((name, "[green]ok[/]" if ok else "[red]FAILED[/]", f"{shown}  ({_ms(took)})"))
        return value

    with tempfile.TemporaryDirectory(prefix="orchard-demo-") as data:
        t0 = time.perf_counter()
        with SandboxClient.local(data_dir=Path(data)) as client:
            console.print(f"embedded orchestrator up in {_ms(time.perf_counter() - t0)} "
                          f"(first run builds the agent bundle once)")
            sb = step("create 'host' sandbox", lambda: client.create_sandbox("host"),
                      lambda s: (s.info.status == "running", s.id))
            step("exec python3", lambda: sb.exec("python3 -c 'print(6*7)'"),
                 lambda r: (r.stdout == "42\n" and r.exit_code == 0, repr(r.stdout)))
            step("exec argv (no shell quoting)", lambda: sb.exec(["echo", "a b; $HOME"]),
                 lambda r: (r.stdout == "a b; $HOME\n", repr(r.stdout)))
            step("bare `cat` returns (stdin closed)", lambda: sb.exec("cat"),
                 lambda r: (r.exit_code == 0, f"exit {r.exit_code}"))
            step("upload + download", lambda: (
                sb.upload_content(b'print("hello")\n', "/workspace/hello.py"),
                sb.download_content("/workspace/hello.py"))[1],
                lambda b: (b == b'print("hello")\n', f"{len(b)} bytes back"))
            step("apply_patch", lambda: sb.apply_patch(PATCH),
                 lambda p: (p.success, f"method: {p.method}"))
            step("run patched file", lambda: sb.exec("python3 /workspace/hello.py"),
                 lambda r: (r.stdout == "hello, patched\n", repr(r.stdout)))
            step("timeout kills the tree", lambda: sb.exec(
                "echo before; (sleep 300 &); setsid sleep 300 & sleep 300", timeout=1),
                lambda r: (r.timed_out and r.exit_code == 124 and r.stdout == "before\n",
                           f"exit {r.exit_code}, kept {r.stdout!r}"))
            step("...and nothing survives", lambda: sb.exec("ps -eo args | grep -c '^sleep'"),
                 lambda r: (r.stdout.strip() == "0", f"{r.stdout.strip()} sleeps left"))
            step("stream output", lambda: [e.type for e in sb.stream("echo a; sleep 0.3; echo b")],
                 lambda types: (types[-1] == "exit" and types.count("stdout") >= 1,
                                f"{len(types)} events"))
            step("background server", lambda: (
                sb.start_process("python3 -m http.server 8080 --bind 127.0.0.1"),
                sb.exec("for i in $(seq 50); do python3 -c \"import urllib.request as u;"
                        "u.urlopen('http://127.0.0.1:8080')\" 2>/dev/null && break;"
                        " sleep 0.1; done; echo $?"))[1],
                lambda r: (r.stdout.strip() == "0", "served inside the sandbox"))
            step("no network by default", lambda: sb.exec(
                "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), 2)\""),
                lambda r: (r.exit_code != 0, "outbound connect refused"))
            step("host secrets invisible", lambda: sb.exec(
                'test -z "$(ls -A /root)$(ls -A /home)" && ! cat /etc/shadow 2>/dev/null'),
                lambda r: (r.exit_code == 0, "empty /root and /home, no shadow"))

            latencies = []
            for _ in range(200):
                t = time.perf_counter()
                sb.exec(["true"])
                latencies.append(time.perf_counter() - t)
            raw = []
            for _ in range(200):
                t = time.perf_counter()
                subprocess.run(["bash", "-c", "true"], check=True)
                raw.append(time.perf_counter() - t)
            p50, raw50 = statistics.median(latencies), statistics.median(raw)
            rows.append(("exec `true` p50 (200 runs)", "[cyan]info[/]",
                         f"{_ms(p50)} vs raw bash spawn {_ms(raw50)} = {p50 / raw50:.2f}x"))

            t = time.perf_counter()
            sandboxes = [client.create_sandbox("host", wait=False) for _ in range(20)]
            for s in sandboxes:
                s.wait_ready()
            rows.append(("20 sandboxes create -> ready", "[cyan]info[/]",
                         _ms(time.perf_counter() - t)))
            for s in sandboxes:
                s.delete()
            sb.delete()
            eval_tables = _eval(client, Path(data) / "eval", rows)

    table = Table(title="Orchard Env tour (embedded, local backend)")
    for col in ("step", "result", "detail"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for t in eval_tables:
        console.print(t)
    if any("FAILED" in r[1] for r in rows):
        raise SystemExit(1)
