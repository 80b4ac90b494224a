"""``orchard image ...``: the orchestrator's image cache (local backend): list, pull, remove,
prune."""

from __future__ import annotations

import sys
from datetime import datetime
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from orchard.cli._common import friendly_errors, stderr
from orchard.env.image_schema import ImageInfo, ImagesRemoved

app = typer.Typer(no_args_is_help=True, help="List, pull and remove the server's images.")


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return str(n)


def _when(at: datetime | None) -> str:
    return at.astimezone().strftime("%Y-%m-%d %H:%M:%S") if at else "-"


def _row(info: ImageInfo) -> list[str]:
    return [", ".join(info.refs) or "-", info.digest[:19], _size(info.size_bytes),
            _when(info.last_used), ", ".join(info.sandboxes) or "-"]


@app.command("ls")
@friendly_errors
def ls(ctx: typer.Context) -> None:
    """List images: names, digest, size on disk, last use, the sandboxes on each."""
    with ctx.obj.client() as client:
        listing = client.list_images()
    rows = [_row(info) for info in listing.images]
    table = Table(box=None)
    for i, column in enumerate(("IMAGE", "DIGEST", "SIZE", "LAST USED", "SANDBOXES")):
        # Names and ids are what the other commands take: never cut, however narrow.
        longest = max((len(row[i]) for row in rows), default=0) if i in (0, 4) else None
        table.add_column(column, no_wrap=True, min_width=longest)
    for row in rows:
        table.add_row(*row)
    # Piped, rows are as wide as they need to be: a script reads whole names.
    width = sum(max((len(r[i]) for r in rows), default=9) + 2 for i in range(5))
    Console(width=None if sys.stdout.isatty() else max(width, 80)).print(table)
    cap = f" of {_size(listing.max_bytes)} (images.max_cache_bytes)" if listing.max_bytes else ""
    stderr.print(f"{len(listing.images)} images, {_size(listing.total_bytes)}{cap}")


@app.command("pull")
@friendly_errors
def pull(
    ctx: typer.Context,
    images: Annotated[list[str], typer.Argument(help="Registry references.")],
) -> None:
    """Pull images now (asking the registry again for a tag already pulled)."""
    with ctx.obj.client() as client:
        for image in images:
            with stderr.status(f"pulling {image}"):
                info = client.pull_image(image)
            typer.echo(f"{image} {info.digest} {_size(info.size_bytes)}")


def _report(removed: ImagesRemoved) -> None:
    for digest in removed.removed:
        typer.echo(digest)
    stderr.print(f"removed {len(removed.removed)} images, freed {_size(removed.freed_bytes)}")


@app.command("rm")
@friendly_errors
def rm(
    ctx: typer.Context,
    names: Annotated[list[str], typer.Argument(help="Names (as pulled) or digests.")],
) -> None:
    """Remove images no sandbox runs on."""
    with ctx.obj.client() as client:
        for name in names:
            _report(client.remove_image(name))


@app.command("prune")
@friendly_errors
def prune(ctx: typer.Context) -> None:
    """Remove every image no sandbox runs on."""
    with ctx.obj.client() as client:
        _report(client.prune_images())
