"""``orchard pool ls``: the server's warm pools (orchard.yaml's ``pools:``) and how they fare."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from orchard.cli._common import friendly_errors, stderr

app = typer.Typer(no_args_is_help=True, help="Watch the server's warm pools.")


@app.command("ls")
@friendly_errors
def ls(ctx: typer.Context) -> None:
    """List warm pools: the image each keeps, its size, ready and starting sandboxes, and the
    creates it served (hits) or matched without one ready (misses)."""
    with ctx.obj.client() as client:
        pools = client.pools()
    if not pools:
        stderr.print("no warm pools: the server's settings have no `pools:` (docs/guides/pools.md)")
        return
    table = Table(box=None)
    for column in ("POOL", "IMAGE", "SIZE", "READY", "STARTING", "HITS", "MISSES"):
        table.add_column(column, no_wrap=True)
    for pool in pools:
        table.add_row(pool.name, str(pool.entry.get("image", "host")), str(pool.size),
                      str(pool.ready), str(pool.starting), str(pool.hits), str(pool.misses))
    Console().print(table)
