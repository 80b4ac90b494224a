"""``orchard rollout ...``: agent harnesses on Orchard sandboxes."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.markup import escape

from orchard.cli._common import OrchestratorOption, friendly_errors, open_orchestrator, stderr
from orchard.env.client import OrchardError

app = typer.Typer(no_args_is_help=True, help="Run agent harnesses in sandboxes.")


@app.command("mini-swe-agent")
@friendly_errors
def rollout_mini_swe_agent(
    ctx: typer.Context,
    image: Annotated[str, typer.Option(help="'host', a rootfs dir or an image tarball.")],
    model_url: Annotated[str, typer.Option(
        help="OpenAI-compatible base URL, e.g. the recording proxy's http://HOST:PORT/s/ID/v1.")],
    model: Annotated[str, typer.Option(help="Model name the server serves, sent as is.")],
    task: Annotated[str | None, typer.Option(help="The task, as text.")] = None,
    task_file: Annotated[Path | None, typer.Option(
        help="Read the task from this file.", exists=True, dir_okay=False)] = None,
    orchestrator: OrchestratorOption = None,
    session: Annotated[str | None, typer.Option(
        help="Rollout id: the sandbox's session, and sent as X-Orchard-Session.")] = None,
    output: Annotated[Path | None, typer.Option(
        help="Write the full result (messages included) here as JSON.")] = None,
    cwd: Annotated[str, typer.Option(help="Working directory in the sandbox.")] = "/workspace",
    setup: Annotated[str | None, typer.Option(
        help="Shell command run in the sandbox before the agent starts.")] = None,
    eval_: Annotated[str | None, typer.Option(
        "--eval", help="Shell command run in the sandbox after the agent ends.")] = None,
    step_limit: Annotated[int, typer.Option(help="Max model calls (0: no limit).")] = 250,
    token_ids: Annotated[bool, typer.Option(
        help="Ask the server for token ids and log-probs (vLLM's return_token_ids).")] = True,
    model_api_key: Annotated[str | None, typer.Option(
        envvar="OPENAI_API_KEY", help="Model API key.", show_default=False)] = None,
    config: Annotated[list[str] | None, typer.Option(
        "--config", "-c", help="mini-swe-agent config override: a YAML file or KEY=VALUE, e.g. "
                               "agent.step_limit=20 (repeatable).")] = None,
) -> None:
    """Run mini-swe-agent on a task: the agent runs here, its commands in a new sandbox."""
    if (task is None) == (task_file is None):
        raise typer.BadParameter("give exactly one of --task and --task-file")
    if task is None:
        assert task_file is not None
        task = task_file.read_text()
    # Heavy (litellm): only this command needs it.
    from orchard.domains.swe.minisweagent import config_from_specs, run_task

    # Only after that import, which keeps litellm's own import from going online.
    litellm = sys.modules["litellm"]
    litellm.suppress_debug_info = True  # its banners go to stdout, which carries the result
    try:
        overrides = config_from_specs(config or [])
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--config") from None
    with contextlib.ExitStack() as stack:
        url, api_key = open_orchestrator(stack, ctx, orchestrator)
        try:
            result = run_task(
                task, orchestrator_url=url, orchestrator_api_key=api_key, model_base_url=model_url,
                model_name=model, image=image, model_api_key=model_api_key, session=session,
                cwd=cwd, setup_command=setup, eval_command=eval_, step_limit=step_limit,
                token_ids=token_ids, config_overrides=overrides)
        except (OrchardError, ValidationError):
            raise
        except Exception as exc:  # the model, the set-up or the agent failed: one line
            stderr.print(f"[red]error:[/] {escape(str(exc))} ({type(exc).__name__})")
            raise typer.Exit(1) from None
    if output is not None:
        output.write_text(json.dumps(result, indent=2, default=str))
    summary = {k: result[k] for k in ("exit_status", "n_steps", "sandbox_id", "session", "eval")}
    typer.echo(json.dumps({**summary, "submission": result["submission"]}))
    if result["exit_status"] != "Submitted":
        stderr.print(f"the agent did not submit: {escape(str(result['exit_status']))}")
        raise typer.Exit(1)
