"""``orchard sandbox ...``: create, list, use and delete sandboxes; only the SDK is needed."""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import signal
import sys
import termios
import threading
import time
import tty
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn
from rich.table import Table

from orchard.cli._common import delete_each, friendly_errors, parse_labels, stderr
from orchard.env.client import OrchardError, PtySession, Sandbox, WaitTimeout
from orchard.env.client.base import DEFAULT_READY_TIMEOUT
from orchard.env.schema import SandboxStatus

app = typer.Typer(no_args_is_help=True, help="Create, use and delete sandboxes.")

# How often a waiting create refreshes its progress display, seconds.
_POLL_S = 0.5
_REMOTE_PATH = re.compile(r"^(?P<id>[a-z0-9][a-z0-9-]{0,62}):(?P<path>.+)$")


@app.command("create")
@friendly_errors
def create(
    ctx: typer.Context,
    image: Annotated[str | None, typer.Argument(
        help="'host' (the default), a registry image (python:3.12-slim), or on the server a "
             "rootfs dir or an image tarball.", show_default=False)
    ] = None,
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
    from_snapshot: Annotated[str | None, typer.Option(
        help="Start from this snapshot's files (its image is the snapshot's).")] = None,
) -> None:
    """Create a sandbox, wait until it is ready (showing its image's pull) and print its id."""
    with ctx.obj.client() as client:
        sandbox = client.create_sandbox(
            image,
            block_network=not network,
            egress=egress,
            cpu=cpu,
            memory=memory,
            pids=pids,
            labels=parse_labels(label or []),
            ttl=ttl,
            timeout=timeout,
            from_snapshot=from_snapshot,
            wait=False,
        )
        try:
            _wait_showing_progress(sandbox, timeout or DEFAULT_READY_TIMEOUT)
        except (OrchardError, KeyboardInterrupt):
            with contextlib.suppress(OrchardError):
                client.delete_sandbox(sandbox.id)
            raise
    typer.echo(sandbox.id)


_MB = re.compile(r"([\d.]+)/([\d.]+) MB")


def _wait_showing_progress(sandbox: Sandbox, timeout: float) -> None:
    """Wait for the sandbox, with its status message (its image's pull: MB and layers) as a
    progress bar on stderr; raises what wait_ready raises."""
    deadline = time.monotonic() + timeout
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn())
    with Progress(*columns, console=stderr, transient=True) as progress:
        task = progress.add_task("starting", total=None)
        while sandbox.info.status == SandboxStatus.pending and time.monotonic() < deadline:
            message = sandbox.info.status_message or "starting"
            sizes = _MB.search(message)
            done, total = (float(sizes[1]), float(sizes[2])) if sizes else (0.0, None)
            progress.update(task, description=escape(message), completed=done, total=total)
            with contextlib.suppress(WaitTimeout):
                sandbox.wait_ready(min(_POLL_S, max(deadline - time.monotonic(), 0.01)))
                return
            sandbox.refresh()
    sandbox.wait_ready(max(deadline - time.monotonic(), 0.01))


@app.command("ls")
@friendly_errors
def ls(
    ctx: typer.Context,
    label: Annotated[
        list[str] | None, typer.Option(help="Only with KEY=VALUE (repeatable).")
    ] = None,
) -> None:
    """List sandboxes."""
    with ctx.obj.client() as client:
        sandboxes = client.list_sandboxes(parse_labels(label or []))
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


@app.command("exec")
@friendly_errors
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


@app.command("shell")
@friendly_errors
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


@app.command("cp")
@friendly_errors
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


@app.command("rm")
@friendly_errors
def rm(ctx: typer.Context, sandbox_ids: list[str]) -> None:
    """Delete sandboxes."""
    with ctx.obj.client() as client:
        delete_each(sandbox_ids, lambda sid: client.delete_sandbox(sid).found, "sandbox",
                    "orchard sandbox ls")


@app.command("snapshot")
@friendly_errors
def snapshot(
    ctx: typer.Context,
    sandbox_id: str,
    label: Annotated[list[str] | None, typer.Option(help="KEY=VALUE (repeatable).")] = None,
    ttl: Annotated[float | None, typer.Option(help="Seconds to keep it.")] = None,
    memory: Annotated[bool, typer.Option(help="Its running processes too (CRIU).")] = False,
) -> None:
    """Keep a sandbox's files (with --memory, its processes too) as a snapshot; print its
    id."""
    with ctx.obj.client() as client:
        info = client.get_sandbox(sandbox_id).snapshot(labels=parse_labels(label or []),
                                                       ttl=ttl, memory=memory)
    live = (f", {info.memory_bytes} bytes of {len(info.processes)} process trees"
            if info.memory_bytes is not None else "")
    stderr.print(f"{info.snapshot_id}: {info.size_bytes} bytes{live}")
    typer.echo(info.snapshot_id)


@app.command("fork")
@friendly_errors
def fork(
    ctx: typer.Context,
    sandbox_id: str,
    count: Annotated[int, typer.Option("--count", "-n", help="How many.")] = 1,
    label: Annotated[list[str] | None, typer.Option(help="KEY=VALUE (repeatable).")] = None,
    memory: Annotated[bool, typer.Option(help="Fork its running processes too.")] = False,
) -> None:
    """Branch sandboxes off a sandbox as it is now; wait for them and print their ids."""
    with ctx.obj.client() as client:
        forks = client.get_sandbox(sandbox_id).fork(count, labels=parse_labels(label or []),
                                                    memory=memory)
    for sandbox in forks:
        typer.echo(sandbox.id)


@app.command("pause")
@friendly_errors
def pause(ctx: typer.Context, sandbox_id: str) -> None:
    """Freeze a sandbox's processes (memory is kept) until `orchard sandbox resume`."""
    with ctx.obj.client() as client:
        typer.echo(client.get_sandbox(sandbox_id).pause().status.value)


@app.command("resume")
@friendly_errors
def resume(ctx: typer.Context, sandbox_id: str) -> None:
    """Let a paused sandbox's processes run on."""
    with ctx.obj.client() as client:
        typer.echo(client.get_sandbox(sandbox_id).resume().status.value)
