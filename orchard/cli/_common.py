"""What the command groups share: the connection options, one-line errors, the orchestrator."""

from __future__ import annotations

import contextlib
import functools
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ParamSpec, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from orchard.env.client import OrchardError, SandboxClient

# soft_wrap: an error stays on one line however narrow the terminal (or a pipe, 80 columns).
stderr = Console(stderr=True, soft_wrap=True)
P = ParamSpec("P")
R = TypeVar("R")

OrchestratorOption = Annotated[str | None, typer.Option(
    help="Orchestrator URL (default: --url / ORCHARD_URL; with neither, an embedded one is "
         "started, which needs root).", show_default=False)]


@dataclass
class Connection:
    """The global --url and --api-key, kept on the typer context for the commands."""

    url: str | None
    api_key: str | None

    def client(self) -> SandboxClient:
        # Sandboxes made from the command line must outlive the command that made them.
        return SandboxClient(self.url, api_key=self.api_key, cleanup_on_close=False)


def friendly_errors(fn: Callable[P, R]) -> Callable[P, R]:
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


def delete_each(ids: list[str], delete: Callable[[str], bool], what: str, listing: str) -> None:
    """Delete each id (``delete`` returns whether it existed), printing the ones deleted; one
    error line for each failure, and exit 1 if any failed."""
    failed = False
    for item in ids:
        try:
            found = delete(item)
        except OrchardError as exc:
            stderr.print(f"[red]error:[/] {escape(item)}: {escape(str(exc))}")
            failed = True
            continue
        if found:
            typer.echo(item)
        else:
            stderr.print(f"[red]error:[/] {escape(item)}: no such {what} (see `{listing}`)")
            failed = True
    if failed:
        raise typer.Exit(1)


def parse_labels(pairs: list[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--label")
        labels[key] = value
    return labels


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def open_orchestrator(stack: contextlib.ExitStack, ctx: typer.Context,
                      orchestrator: str | None) -> tuple[str, str | None]:
    """The orchestrator to use (URL, API key): --orchestrator, else --url / ORCHARD_URL, else
    an embedded one started on ``stack`` (its sandboxes and data deleted when it closes)."""
    url = orchestrator or ctx.obj.url
    if url is not None:
        return url, ctx.obj.api_key
    from orchard.env.server import EmbeddedOrchestrator

    stderr.print("no --orchestrator or ORCHARD_URL: starting an embedded orchestrator")
    if threading.current_thread() is threading.main_thread():
        # A TERM (kill, a CI job's timeout) unwinds like Ctrl-C, so the embedded orchestrator's
        # sandboxes and data dir go too; Python's default would end the process on the spot.
        previous = signal.signal(signal.SIGTERM, _exit_on_term)
        stack.callback(signal.signal, signal.SIGTERM, previous)
    data = Path(tempfile.mkdtemp(prefix="orchard-embedded-"))
    stack.callback(shutil.rmtree, data, ignore_errors=True)
    embedded = EmbeddedOrchestrator(data_dir=data)
    url = stack.enter_context(embedded)
    return url, getattr(embedded, "api_key", None)
