"""Long-running services: the orchestrator (``serve``), the recording proxy (``proxy``), and
the agent bundle an injector image mounts (``agent-bundle``)."""

from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from fastapi import FastAPI

    from orchard.env.config import Settings

app = typer.Typer()


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
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(help="Host name the API answers (repeatable; '*.example.com', '*'). "
                     "Default: 127.0.0.1, localhost, ::1 without API keys, any with keys."),
    ] = None,
    allowed_origin: Annotated[
        list[str] | None,
        typer.Option(help="Browser origin whose pages may call the API, e.g. "
                     "http://localhost:3000 (repeatable). Default: none."),
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
    no_console: Annotated[bool, typer.Option(
        "--no-console", help="Serve the API alone, without the web console at /ui "
        "(docs/guides/console.md).")] = False,
    runs_dir: Annotated[list[Path] | None, typer.Option(
        help="A folder whose run directories and proxy stores the console may open "
             "(repeatable). Default: the working directory.")] = None,
    log_level: str = "info",
) -> None:
    """Run the orchestrator (and its web console at /ui)."""
    # The server drags in FastAPI and the backends, which the client commands do not need.
    from orchard.env.server import serve as run_server

    run_server(
        host=host, port=port, config=config, log_level=log_level, backend=backend,
        state=state, api_keys=api_key or None, allowed_hosts=allowed_host or None,
        allowed_origins=allowed_origin or None, data_dir=data_dir, max_sandboxes=max_sandboxes,
        max_concurrent_creates=max_concurrent_creates, reconcile_interval=reconcile_interval,
        model_proxy=model_proxy,
        extend=functools.partial(_mount_console, runs_dirs=runs_dir) if not no_console else None,
    )


def _mount_console(app: FastAPI, settings: Settings, runs_dirs: list[Path] | None) -> None:
    from orchard.console import mount_console

    mount_console(app, settings.api_keys, runs_dirs)


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
    admin_key: Annotated[
        str | None, typer.Option(help="Key that reading sessions over HTTP (GET /sessions...) "
                                 "takes, as X-API-Key; without one they are read from --store "
                                 "only.", envvar="ORCHARD_PROXY_KEY")] = None,
    log_level: str = "info",
) -> None:
    """Run the recording proxy: harnesses use http://HOST:PORT/s/SESSION/v1 as their base URL."""
    import uvicorn

    from orchard.rollout.proxy.app import ProxySettings, create_proxy_app

    app_ = create_proxy_app(ProxySettings(upstreams=upstream, store=store, api_key=api_key,
                                          render_with=render_with, admin_key=admin_key))
    uvicorn.run(app_, host=host, port=port, log_level=log_level, access_log=False)


@app.command("agent-bundle")
def agent_bundle(
    out: Annotated[Path, typer.Argument(help="Directory to write the bundle to (must not exist).")],
) -> None:
    """Build the agent bundle (interpreter + agent) for an agent-injector image."""
    from orchard.env.agent.bundle import BundleError, ensure_bundle

    if out.exists():
        raise typer.BadParameter(f"{out} exists; give a new directory")
    with tempfile.TemporaryDirectory() as cache:
        try:
            built = ensure_bundle(Path(cache))
        except BundleError as e:
            raise typer.BadParameter(f"cannot build the bundle: {e}") from None
        shutil.copytree(built, out, symlinks=True)
    typer.echo(f"agent bundle written to {out} (mount it at /.orchard/bundle)")
