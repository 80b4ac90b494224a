"""``orchard snapshot ...``: list and delete snapshots (take them with `orchard sandbox
snapshot`, start from them with `orchard sandbox create --from-snapshot`)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from orchard.cli._common import delete_each, friendly_errors, parse_labels

app = typer.Typer(no_args_is_help=True, help="List and delete snapshots.")


@app.command("ls")
@friendly_errors
def ls(
    ctx: typer.Context,
    label: Annotated[
        list[str] | None, typer.Option(help="Only with KEY=VALUE (repeatable).")
    ] = None,
) -> None:
    """List snapshots."""
    with ctx.obj.client() as client:
        snapshots = client.list_snapshots(parse_labels(label or []))
    table = Table(box=None)
    table.add_column("ID", no_wrap=True)
    for column in ("SANDBOX", "IMAGE", "BYTES", "PARENT", "LABELS", "EXPIRES"):
        table.add_column(column)
    for snap in snapshots:
        table.add_row(
            snap.snapshot_id, snap.sandbox_id, snap.image, str(snap.size_bytes),
            snap.parent or "-", ",".join(f"{k}={v}" for k, v in snap.labels.items()),
            snap.expires_at.strftime("%Y-%m-%d %H:%M:%S") if snap.expires_at else "-",
        )
    Console().print(table)


@app.command("rm")
@friendly_errors
def rm(ctx: typer.Context, snapshot_ids: list[str]) -> None:
    """Delete snapshots (sandboxes started from one keep running)."""
    with ctx.obj.client() as client:
        delete_each(snapshot_ids, lambda sid: client.delete_snapshot(sid).found, "snapshot",
                    "orchard snapshot ls")
