"""Running the orchestrator: `orchard serve`, and an embedded one for notebooks and tests."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import resource
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn
import yaml
from fastapi import FastAPI
from pydantic import ValidationError

from orchard.env.api import create_app
from orchard.env.backends.base import Backend
from orchard.env.config import Settings
from orchard.env.service import SandboxService
from orchard.env.state import open_store
from orchard.serving import ThreadedServer


def make_backend(settings: Settings, embedded: bool = False) -> Backend:
    if settings.backend == "local":
        from orchard.env.backends.local.backend import LocalBackend

        return LocalBackend(settings.data_dir / "local", die_with_orchestrator=embedded,
                            model_proxy=settings.model_proxy)
    if settings.backend == "kubernetes":
        from orchard.env.backends.kubernetes import KubernetesBackend

        return KubernetesBackend(settings.kubernetes, model_proxy=settings.model_proxy)
    raise ValueError(f"unknown backend {settings.backend!r}; choose local or kubernetes")


def build_app(settings: Settings, delete_on_shutdown: bool = False) -> FastAPI:
    """The ASGI app; the service starts (re-adopting sandboxes) with the app's lifespan."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    # Every live sandbox holds a keep-alive connection to its agent: a thousand sandboxes
    # would exhaust the usual soft limit of 1024 descriptors.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    backend = make_backend(settings, embedded=delete_on_shutdown)
    store = open_store(settings.state_url())
    service = SandboxService(backend, store, settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await backend.start()
        await service.start()
        try:
            yield
        finally:
            await service.stop(delete_all=delete_on_shutdown)
            await backend.close()
            await store.close()

    app = create_app(service, lifespan=lifespan)
    app.state.service = service
    return app


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_settings(config: Path | None = None, **overrides: Any) -> Settings:
    """Settings from a YAML file (any Settings field, e.g. a `kubernetes:` section), then the
    environment (ORCHARD_STATE, ORCHARD_API_KEYS: secrets stay out of config files), then
    overrides that are not None."""
    data: dict[str, Any] = {}
    if config is not None:
        try:
            data = yaml.safe_load(config.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise SystemExit(f"cannot read config file {config}: {e}") from None
        if not isinstance(data, dict):
            raise SystemExit(f"config file {config} must hold a mapping of settings")
    if os.environ.get("ORCHARD_STATE"):
        data["state"] = os.environ["ORCHARD_STATE"]
    data.update({k: v for k, v in overrides.items() if v is not None})
    from_env = filter(None, os.environ.get("ORCHARD_API_KEYS", "").split(","))
    data["api_keys"] = list(dict.fromkeys([*data.get("api_keys", []),
                                           *(k.strip() for k in from_env)]))
    try:
        return Settings(**data)
    except ValidationError as e:
        raise SystemExit(f"invalid settings{f' in {config}' if config else ''}: {e}") from None


def serve(host: str = "127.0.0.1", port: int = 8000, config: Path | None = None,
          log_level: str = "info", **overrides: Any) -> None:
    """Run the orchestrator until interrupted. Sandboxes outlive it and are re-adopted."""
    settings = load_settings(config, **overrides)
    if not _is_loopback(host) and not settings.api_keys:
        raise SystemExit(f"refusing to listen on {host} without API keys: pass --api-key KEY "
                         "(or set ORCHARD_API_KEYS), or listen on 127.0.0.1")
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per agent call otherwise
    app = build_app(settings)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False,
                timeout_graceful_shutdown=10)


class EmbeddedOrchestrator(ThreadedServer):
    """An orchestrator on 127.0.0.1 in a background thread, for the life of a client.

    It deletes every sandbox it made when stopped, so a notebook or a test needs no set-up
    and leaves nothing behind.
    """

    def __init__(self, data_dir: Path | None = None, **settings: Any) -> None:
        if data_dir is not None:
            settings["data_dir"] = data_dir
        self.settings = Settings(**settings)
        super().__init__(None, name="orchard-embedded")

    def start(self, timeout: float = 60.0) -> str:
        self.app = build_app(self.settings, delete_on_shutdown=True)
        return super().start(timeout)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
