"""``orchard trace ...``: a rollout's model calls and sandbox events, shown, exported and
replayed."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchard.cli._common import friendly_errors, stderr
from orchard.env.client import SandboxClient

if TYPE_CHECKING:
    from orchard.rollout.traces.trace import Trace

app = typer.Typer(no_args_is_help=True,
                  help="Rollout traces: show, export (JSONL, Parquet, SWE rows), replay.")

_TraceOrchestrator = Annotated[str | None, typer.Option(
    "--orchestrator", help="Orchestrator URL (default: --url / ORCHARD_URL).",
    show_default=False)]
_TraceApiKey = Annotated[str | None, typer.Option(
    "--api-key", envvar="ORCHARD_API_KEY", help="Orchestrator API key.", show_default=False)]
_TraceProxy = Annotated[str | None, typer.Option(
    "--proxy", help="The recording proxy: its URL (http://HOST:PORT) or its --store directory. "
    "Without it the trace has no model calls.", show_default=False)]
_TraceProxyKey = Annotated[str | None, typer.Option(
    "--proxy-key", envvar="ORCHARD_PROXY_KEY", help="The proxy's admin key (its --admin-key), "
    "when --proxy is a URL.", show_default=False)]


TraceFormat = Literal["jsonl", "parquet", "swe-jsonl"]


def _trace_client(ctx: typer.Context, orchestrator: str | None,
                  api_key: str | None) -> SandboxClient:
    # cleanup_on_close=False: `replay --keep` hands its sandboxes to the user.
    return SandboxClient(orchestrator or ctx.obj.url,
                         api_key=api_key if api_key is not None else ctx.obj.api_key,
                         cleanup_on_close=False)


@contextlib.contextmanager
def _trace_errors() -> Iterator[None]:
    """A proxy that cannot be read, or a trace that cannot be used: one line, exit 1."""
    import httpx

    try:
        yield
    except httpx.HTTPError as exc:
        stderr.print(f"[red]error:[/] reading the recording proxy: {escape(str(exc))}; check "
                     "--proxy (a URL of `orchard proxy`, or its --store directory)")
        raise typer.Exit(1) from None
    except (ValueError, PermissionError) as exc:  # PermissionError: the proxy wants its key
        stderr.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(1) from None


def _collect_trace(client: SandboxClient, rollout: str, proxy: str | None,
                   proxy_key: str | None) -> Trace:
    from orchard.rollout.traces.trace import collect_trace

    source: str | Path | None = proxy
    if proxy is not None and not re.match(r"^https?://", proxy):
        source = Path(proxy)
        if not source.is_dir():
            raise typer.BadParameter(f"{proxy} is neither an http(s) URL nor a directory",
                                     param_hint="--proxy")
    trace = collect_trace(rollout, client, source, proxy_key=proxy_key)
    if not trace.timeline:
        stderr.print(f"[yellow]warning:[/] rollout {escape(rollout)}: no model calls and no "
                     "sandbox events (is the id right? events are kept for the orchestrator's "
                     "event_retention)")
    return trace


@app.command("show")
@friendly_errors
def trace_show(
    ctx: typer.Context,
    rollout: Annotated[str, typer.Argument(help="The rollout id (proxy session = sandbox "
                                           "session).")],
    orchestrator: _TraceOrchestrator = None,
    proxy: _TraceProxy = None,
    proxy_key: _TraceProxyKey = None,
    api_key: _TraceApiKey = None,
) -> None:
    """Print a rollout's timeline: model calls and sandbox actions in the order they began."""
    with _trace_errors(), _trace_client(ctx, orchestrator, api_key) as client:
        trace = _collect_trace(client, rollout, proxy, proxy_key)
    table = Table(box=None, title=f"rollout {escape(rollout)}")
    for column in ("T+S", "SOURCE", "SEQ", "WHAT"):
        table.add_column(column, no_wrap=column != "WHAT")
    start = trace.started_at or 0.0
    for step in trace.timeline:
        seq = str(trace.sandbox_events[step.index].seq) if step.source == "sandbox" else ""
        table.add_row(f"{step.time - start:.3f}", step.source, seq, escape(step.summary))
    console = Console()
    console.print(table)
    span = (trace.ended_at - start) if trace.ended_at is not None else 0.0
    console.print(f"{len(trace.model_calls)} model call(s), {len(trace.sandbox_events)} "
                  f"sandbox event(s) ({len(trace.execs())} exec(s)) over {span:.1f}s")


@app.command("export")
@friendly_errors
def trace_export(
    ctx: typer.Context,
    rollouts: Annotated[list[str], typer.Argument(help="Rollout ids.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="File to write.")],
    format_: Annotated[TraceFormat, typer.Option(
        "--format", help="jsonl: one full trace per line (replayable); parquet / swe-jsonl: "
        "Orchard SWE rows (tools, messages, metadata).")] = "jsonl",
    orchestrator: _TraceOrchestrator = None,
    proxy: _TraceProxy = None,
    proxy_key: _TraceProxyKey = None,
    api_key: _TraceApiKey = None,
) -> None:
    """Export rollouts' traces to a file."""
    from orchard.rollout.traces import export

    with _trace_errors(), _trace_client(ctx, orchestrator, api_key) as client:
        if format_ == "jsonl":
            # A generator: each trace is written as soon as it is collected.
            n = export.write_jsonl((_collect_trace(client, r, proxy, proxy_key)
                                      for r in rollouts), output)
        else:
            traces = []
            for rollout in rollouts:
                trace = _collect_trace(client, rollout, proxy, proxy_key)
                try:
                    export.last_chat_call(trace)
                except ValueError as exc:
                    stderr.print(f"[yellow]warning:[/] skipped: {escape(str(exc))}")
                    continue
                traces.append(trace)
            if not traces:
                raise ValueError("no rollout had a conversation to export; nothing written")
            write = (export.write_parquet if format_ == "parquet"
                     else export.write_swe_jsonl)
            n = write(traces, output)
    what = "trace(s)" if format_ == "jsonl" else "row(s)"
    stderr.print(f"{n} {what} -> {escape(str(output))}")


@app.command("replay")
@friendly_errors
def trace_replay(
    ctx: typer.Context,
    trace_file: Annotated[Path, typer.Argument(
        help="A JSONL file of traces (`orchard trace export --format jsonl`).", exists=True,
        dir_okay=False)],
    rollout: Annotated[str | None, typer.Option(
        help="Replay only this rollout of the file (default: all of them).")] = None,
    sandbox: Annotated[str | None, typer.Option(
        help="Replay only this original sandbox's events.")] = None,
    until: Annotated[int | None, typer.Option(help="Stop after the event with this seq.")] = None,
    image: Annotated[str | None, typer.Option(
        help="Use this image instead of the original's.")] = None,
    keep: Annotated[bool, typer.Option(
        help="Leave the replay's sandboxes running and print their ids.")] = False,
    orchestrator: _TraceOrchestrator = None,
    api_key: _TraceApiKey = None,
) -> None:
    """Redo rollouts' sandbox actions in fresh sandboxes; exit 1 if an outcome differs."""
    from orchard.rollout.traces.export import iter_jsonl
    from orchard.rollout.traces.replay import replay

    diverged = False
    found = False
    console = Console()
    with _trace_errors(), _trace_client(ctx, orchestrator, api_key) as client:
        for trace in iter_jsonl(trace_file):
            if rollout is not None and trace.rollout_id != rollout:
                continue
            found = True
            report = replay(trace, client, image=image, sandbox_id=sandbox, until=until,
                            keep=keep)
            table = Table(box=None, title=f"replay of rollout {escape(trace.rollout_id)}")
            for column in ("SEQ", "SANDBOX", "KIND", "RESULT", "DETAIL"):
                table.add_column(column, no_wrap=column != "DETAIL")
            colour = {"matched": "green", "diverged": "red", "skipped": "yellow"}
            for step in report.steps:
                table.add_row(str(step.seq), step.sandbox_id, step.kind.value,
                              f"[{colour[step.status]}]{step.status}[/]", escape(step.detail))
            console.print(table)
            console.print(f"{report.matched} matched, {report.diverged} diverged, "
                          f"{report.skipped} skipped")
            if keep:
                for original, new in report.sandbox_ids.items():
                    console.print(f"kept {new} (replays {original})")
            diverged = diverged or report.diverged > 0
        if not found:
            raise ValueError(f"{trace_file} has no trace" + (
                f" of rollout {rollout!r}" if rollout is not None else ""))
    if diverged:
        raise typer.Exit(1)
