"""``orchard image build``: a Dockerfile built on the orchestrator (orchard.env.build).

Each step's output goes to stderr as it comes; stdout gets the image's name alone, so a script
can take it (``img=$(orchard image build -t app .)``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from orchard.cli._common import friendly_errors, stderr


@friendly_errors
def build(
    ctx: typer.Context,
    context: Annotated[Path, typer.Argument(help="The build context: a directory.")],
    tag: Annotated[str | None, typer.Option(
        "--tag", "-t", help="Name the image (NAME[:TAG]); sandboxes take it as their image.",
        show_default=False)] = None,
    file: Annotated[Path | None, typer.Option(
        "--file", "-f", help="The Dockerfile (default: CONTEXT/Dockerfile).",
        show_default=False)] = None,
    build_arg: Annotated[list[str] | None, typer.Option(
        "--build-arg", help="KEY=VALUE for an ARG (repeatable).")] = None,
    network: Annotated[bool, typer.Option(
        "--network/--no-network", help="Let RUN reach the public internet (default: no "
        "network, as sandboxes).")] = False,
    egress: Annotated[list[str] | None, typer.Option(
        help="Let RUN reach only this host, address or network (repeatable; implies "
        "--network).")] = None,
    no_cache: Annotated[bool, typer.Option(
        "--no-cache", help="Run every step, even those built before.")] = False,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="Print only the image name.")] = False,
) -> None:
    """Build a Dockerfile: each step runs in a sandbox and is kept as a snapshot layer; steps
    built before are reused (Docker's cache rules)."""
    from orchard.env.build import StepFailed, build_image

    args = {}
    for item in build_arg or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"--build-arg {item!r} must look like KEY=VALUE")
        args[key] = value

    def progress(line: str) -> None:
        if not quiet:
            stderr.print(escape(line), highlight=False)

    with ctx.obj.client() as client:
        try:
            image = build_image(client, context, dockerfile=file.resolve() if file else
                                "Dockerfile", tag=tag, build_args=args, network=network,
                                egress=egress, no_cache=no_cache, progress=progress)
        except StepFailed as e:
            # Its output was shown as it ran (unless --quiet): the error is one line.
            shown = "" if quiet else " (its output is above)"
            how = "timed out" if e.exit_code is None else f"exited with code {e.exit_code}"
            stderr.print(f"[red]error:[/] Dockerfile {escape(e.step.where())} {how}{shown}")
            if quiet:
                stderr.print(escape(e.output.rstrip()), highlight=False)
            raise typer.Exit(1) from None
    progress(f"built {image.name} ({image.snapshot_id}): {len(image.steps)} steps, "
             f"{image.cached_steps} cached, in {image.seconds:.1f}s")
    typer.echo(image.name)
