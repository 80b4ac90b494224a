"""Running the orchestrator: `orchard serve`, and an embedded one for notebooks and tests."""

from __future__ import annotations

from orchard.extras import require

# Before any third-party import: a missing one is then a one-line error naming its extra.
require("server")

import contextlib
import ipaddress
import logging
import os
import resource
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import uvicorn
import yaml
from fastapi import FastAPI
from pydantic import ValidationError

from orchard.env.api import create_app
from orchard.env.backends.base import Backend
from orchard.env.config import Settings, default_data_dir
from orchard.env.datadir import (
    DataDirInUse,
    DataDirLock,
    private_data_dir,
    remove_private_data_dir,
    stale_private_data_dirs,
)
from orchard.env.service import SandboxService
from orchard.env.state import open_store
from orchard.serving import ThreadedServer


def make_backend(settings: Settings, embedded: bool = False) -> Backend:
    if settings.backend == "local":
        from orchard.env.backends.local.backend import LocalBackend

        return LocalBackend(settings.data_dir / "local", die_with_orchestrator=embedded,
                            model_proxy=settings.model_proxy, cache_dir=settings.cache_dir,
                            egress_refresh=settings.egress_refresh,
                            allow_io_uring=settings.allow_io_uring,
                            image_dir=settings.image_dir(),
                            image_paths=settings.images.allowed_paths,
                            private_dirs=[settings.data_dir], images=settings.images,
                            docker_config=settings.docker_config())
    if settings.backend == "kubernetes":
        from orchard.env.backends.kubernetes import KubernetesBackend

        return KubernetesBackend(settings.kubernetes, model_proxy=settings.model_proxy,
                                 agent_limits=settings.agent_limits())
    raise ValueError(f"unknown backend {settings.backend!r}; choose local or kubernetes")


def build_app(settings: Settings, delete_on_shutdown: bool = False) -> FastAPI:
    """The ASGI app; the service starts (re-adopting sandboxes) with the app's lifespan.

    Raises DataDirInUse if another orchestrator holds the data dir; the app holds the lock
    until its lifespan ends.
    """
    lock = DataDirLock(settings.data_dir).acquire()
    try:
        return _build_locked_app(settings, lock, delete_on_shutdown)
    except BaseException:
        lock.release()
        raise


def _build_locked_app(settings: Settings, lock: DataDirLock, delete_on_shutdown: bool) -> FastAPI:
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
            try:
                await service.stop(delete_all=delete_on_shutdown)
                await backend.close()
                await store.close()
            finally:
                lock.release()

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
          log_level: str = "info", extend: Callable[[FastAPI, Settings], None] | None = None,
          **overrides: Any) -> None:
    """Run the orchestrator until interrupted. Sandboxes outlive it and are re-adopted.
    ``extend`` adds to the app before it serves (the CLI mounts the console with it)."""
    settings = load_settings(config, **overrides)
    if not _is_loopback(host) and not settings.api_keys:
        raise SystemExit(f"refusing to listen on {host} without API keys: pass --api-key KEY "
                         "(or set ORCHARD_API_KEYS), or listen on 127.0.0.1")
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per agent call otherwise
    try:
        app = build_app(settings)
    except DataDirInUse as e:
        raise SystemExit(str(e)) from None
    if extend is not None:
        extend(app, settings)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False,
                timeout_graceful_shutdown=10)


class EmbeddedOrchestrator(ThreadedServer):
    """An orchestrator on 127.0.0.1 in a background thread, for the life of a client.

    It deletes every sandbox it made when stopped, so a notebook or a test needs no set-up
    and leaves nothing behind. Without a ``data_dir`` it makes a private one (removed when
    it stops) that shares only the caches (agent bundle, unpacked images) and the image dir
    with the default data dir, so it never meets an ``orchard serve`` or another embedded
    orchestrator.
    """

    def __init__(self, data_dir: Path | None = None,
                 extend: Callable[[FastAPI, Settings], None] | None = None,
                 **settings: Any) -> None:
        """``extend`` adds to the app before it serves, as for :func:`serve`."""
        self._private: Path | None = None
        self._extend = extend
        if data_dir is None:
            settings.setdefault("cache_dir", default_data_dir() / "local")
        else:
            settings["data_dir"] = data_dir
        self._settings = settings
        super().__init__(None, name="orchard-embedded")

    def start(self, timeout: float = 60.0) -> str:
        settings = dict(self._settings)
        if "data_dir" not in settings:
            _remove_stale_private_dirs()
            self._private = settings["data_dir"] = private_data_dir()
        self.settings = Settings(**settings)
        if self._private is not None and self.settings.images.dir is None:
            # Like the caches, images come from the default data dir: a private one is empty.
            self.settings.images.dir = default_data_dir() / "images"
        try:
            self.app = build_app(self.settings, delete_on_shutdown=True)
            if self._extend is not None:
                self._extend(self.app, self.settings)
            return super().start(timeout)
        except BaseException:
            self._remove_private()
            raise

    def stop(self) -> None:
        super().stop()
        self._remove_private()

    def reconcile_once(self) -> None:
        """One pass of every reconcile loop now, instead of at their next period (tests,
        notebooks)."""
        self.call(self.app.state.service.reconcile_once())

    def _remove_private(self) -> None:
        if self._private is not None:
            remove_private_data_dir(self._private)
            self._private = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _remove_stale_private_dirs() -> None:
    """What embedded orchestrators killed before they could clean up left behind.

    Their sandboxes died with them (the holders' lifeline closed); their cgroups and
    directories remain until someone removes them.
    """
    from orchard.env.backends.local.host_state import remove_leftovers

    for d in stale_private_data_dirs():
        remove_leftovers(d / "local")
        remove_private_data_dir(d)
