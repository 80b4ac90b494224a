"""``orchard image ...``: images for sandboxes (``build`` from a Dockerfile)."""

from __future__ import annotations

import typer

from orchard.cli import image_build

app = typer.Typer(no_args_is_help=True, help="Images: build them from Dockerfiles.")
app.command("build")(image_build.build)
