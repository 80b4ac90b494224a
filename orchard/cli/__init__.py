"""The ``orchard`` command: run the service (``serve``) and drive sandboxes (``sandbox ...``).

One module per command group. Each command imports the layer it drives (the server, rollout,
tasks, eval, recipes) inside its function, so ``orchard --help`` and the sandbox commands need
only the SDK's dependencies; a command whose layer's extra is missing says so in one line.
"""

from __future__ import annotations

from typing import Annotated, Any

import click
import typer
from typer.core import TyperGroup

from orchard.cli import (
    demo,
    image,
    openenv,
    pool,
    rollout,
    sandbox,
    serve,
    snapshot,
    tasks,
    tour,
    trace,
)
from orchard.cli._common import Connection
from orchard.extras import MissingExtra

__all__ = ["app"]


class _Orchard(TyperGroup):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MissingExtra as exc:
            # Not a bug, an install choice: its message says what to install, and a traceback
            # would only bury it.
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None


app = typer.Typer(cls=_Orchard, no_args_is_help=True, help="Orchard: sandboxes for agents.")


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
    ctx.obj = Connection(url, api_key)


app.add_typer(serve.app)
app.add_typer(sandbox.app, name="sandbox")
app.add_typer(snapshot.app, name="snapshot")
app.add_typer(image.app, name="image")
app.add_typer(pool.app, name="pool")
app.add_typer(rollout.app, name="rollout")
rollout.app.command("run", help="The rollout runner (same as `orchard eval`).")(tasks.eval_)
app.add_typer(trace.app, name="trace")
app.add_typer(tasks.tasks_app, name="tasks")
app.add_typer(tasks.app)
app.add_typer(demo.app)
app.add_typer(tour.app)
app.add_typer(openenv.app, name="openenv")
