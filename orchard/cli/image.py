"""``orchard image ...``: the orchestrator's images: list, pull, remove and prune the cache (local
backend), and build from a Dockerfile (either backend)."""

from __future__ import annotations

import sys
from datetime import datetime
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from orchard.cli import image_build
from orchard.cli._common import friendly_errors, stderr
from orchard.env.build import list_built_images, prune_build_cache, remove_built_image
from orchard.env.client import InvalidRequest
from orchard.env.image_schema import ImageInfo, ImageList, ImagesRemoved

app = typer.Typer(no_args_is_help=True,
                  help="List, pull, build and remove the server's images.")
app.command("build")(image_build.build)


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


def _print_table(columns: tuple[str, ...], rows: list[list[str]], whole: tuple[int, ...]) -> None:
    table = Table(box=None)
    for i, column in enumerate(columns):
        # Names and ids are what the other commands take: never cut, however narrow.
        longest = max((len(row[i]) for row in rows), default=0) if i in whole else None
        table.add_column(column, no_wrap=True, min_width=longest)
    for row in rows:
        table.add_row(*row)
    # Piped, rows are as wide as they need to be: a script reads whole names.
    width = sum(max((len(r[i]) for r in rows), default=9) + 2 for i in range(len(columns)))
    Console(width=None if sys.stdout.isatty() else max(width, 80)).print(table)


@app.command("ls")
@friendly_errors
def ls(ctx: typer.Context) -> None:
    """List images: pulled ones (names, digest, size on disk, last use, the sandboxes on each),
    then the names that Dockerfile builds tagged."""
    with ctx.obj.client() as client:
        try:
            listing: ImageList | None = client.list_images()
        except InvalidRequest as e:  # a backend with no cache (Kubernetes) still has builds
            listing = None
            stderr.print(e.detail)
        built = list_built_images(client)
    if listing is not None:
        _print_table(("IMAGE", "DIGEST", "SIZE", "LAST USED", "SANDBOXES"),
                     [_row(info) for info in listing.images], whole=(0, 4))
        cap = (f" of {_size(listing.max_bytes)} (images.max_cache_bytes)"
               if listing.max_bytes else "")
        stderr.print(f"{len(listing.images)} images, {_size(listing.total_bytes)}{cap}")
    if built:
        _print_table(("BUILT", "SNAPSHOT", "LAYER SIZE", "CREATED"),
                     [[name, snap.snapshot_id, _size(snap.size_bytes), _when(snap.created_at)]
                      for name, snap in sorted(built.items())], whole=(0, 1))
        stderr.print(f"{len(built)} built images")


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
    names: Annotated[list[str], typer.Argument(
        help="Names (as pulled or built) or digests.")],
) -> None:
    """Remove images no sandbox runs on; a built name is untagged (`prune` frees its steps)."""
    with ctx.obj.client() as client:
        for name in names:
            # A built name shadows a registry image of the same name, as at create.
            if remove_built_image(client, name):
                typer.echo(f"untagged {name}")
            else:
                _report(client.remove_image(name))


@app.command("prune")
@friendly_errors
def prune(ctx: typer.Context) -> None:
    """Remove every image no sandbox runs on, and the build steps no built name needs."""
    with ctx.obj.client() as client:
        _report(client.prune_images())
        stderr.print(f"removed {prune_build_cache(client)} build steps")
