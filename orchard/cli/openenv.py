"""``orchard openenv serve``: a task set as an OpenEnv environment server."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from orchard.cli._common import OrchestratorOption, friendly_errors, open_orchestrator, stderr
from orchard.cli.tasks import _load, _Split, _TaskIds
from orchard.env.client import SandboxClient

app = typer.Typer(no_args_is_help=True, help="Task sets as OpenEnv environments (reset/step/"
                  "state over WebSocket; MCP tools), e.g. for TRL's GRPOTrainer.")


@app.command("serve")
@friendly_errors
def serve_(
    ctx: typer.Context,
    tasks: Annotated[str, typer.Option(help="The task set: a name `orchard tasks list` takes "
                                       "('bundled', 'settings', 'assistant', ...) or a path.")],
    split: _Split = None,
    task: _TaskIds = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    max_sessions: Annotated[int, typer.Option(
        min=1, help="Episodes (WebSocket sessions, each with its sandbox) at once.")] = 8,
    sandbox_ttl: Annotated[float, typer.Option(
        min=1, help="Seconds an episode's sandbox may live at most.")] = 3600,
    command_timeout: Annotated[float, typer.Option(
        min=1, help="Seconds a command may run unless its action says.")] = 120,
    commands: Annotated[bool, typer.Option(
        "--commands", help="Shell commands even for tasks that serve tools (the assistant's): "
        "their services stay reachable inside the sandbox.")] = False,
    record: Annotated[Path | None, typer.Option(
        help="Append every graded episode to this JSONL file.", show_default=False)] = None,
    orchestrator: OrchestratorOption = None,
) -> None:
    """Serve a task set: each episode (reset) is one task in a fresh sandbox; steps run
    commands there (or call the domain's tools over MCP); submit ends it with the task's own
    grade as the reward. The sandbox is deleted when the episode ends."""
    from orchard.openenv import ServedTasks, serve

    domain, loaded = _load(tasks, split, task)
    with contextlib.ExitStack() as stack:
        url, api_key = open_orchestrator(stack, ctx, orchestrator)
        client = stack.enter_context(SandboxClient(url, api_key=api_key))
        served = ServedTasks(tasks, loaded, client, domain.episodes, sandbox_ttl=sandbox_ttl,
                             command_timeout=command_timeout, record=record)
        tools = domain.episodes.mcp is not None and not commands
        kind = "MCP tools" if tools else "commands"
        stderr.print(f"serving {len(loaded)} {domain.name} tasks of {escape(tasks)} ({kind}) "
                     f"on http://{host}:{port} (sessions on ws://{host}:{port}/ws); "
                     "Ctrl-C stops")
        serve(served, host=host, port=port, max_sessions=max_sessions, tools=tools)
