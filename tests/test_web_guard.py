"""The orchestrator's Host and Origin guard (orchard/http_guard.py): its settings, on a real
orchestrator over real HTTP and WebSocket; the attacks it stops are in
tests/attacks/test_web_origin.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from pydantic import ValidationError
from typer.testing import CliRunner
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

import orchard.env.server as server_module
from orchard.cli import app as cli
from orchard.env.config import Settings
from tests.conftest import dedicated_orchestrator, needs_root


@pytest.fixture(scope="module")
def configured(orchestrator: str, data_dir: Path) -> Iterator[str]:
    with dedicated_orchestrator(data_dir, allowed_hosts=["127.0.0.1", "*.internal"],
                                allowed_origins=["http://ui.internal:3000"]) as url:
        yield url


def _host(url: str, name: str) -> str:
    return f"{name}:{urlsplit(url).port}"


@needs_root
def test_only_the_configured_host_names_are_answered(configured: str) -> None:
    with httpx.Client(base_url=configured, timeout=30) as http:
        for name in ("127.0.0.1", "api.internal", "API.Internal"):
            r = http.get("/sandboxes", headers={"Host": _host(configured, name)})
            assert r.status_code == 200, (name, r.text)
        # The loopback names are the default only: a list replaces them.
        for name in ("localhost", "internal", "api.internal.evil.test"):
            r = http.get("/sandboxes", headers={"Host": _host(configured, name)})
            assert r.status_code == 403, (name, r.text)
            detail = r.json()["detail"]
            assert repr(name) in detail and "allowed_hosts" in detail and "*.internal" in detail
        r = http.get("/sandboxes", headers={"Host": "evil.test:80@127.0.0.1"})
        assert r.status_code == 400 and "names no host" in r.json()["detail"], r.text


@needs_root
def test_a_listed_origin_and_the_servers_own_pages_may_call_it(configured: str) -> None:
    with httpx.Client(base_url=configured, timeout=30) as http:
        for origin in ("http://ui.internal:3000", "http://UI.internal:3000/", configured):
            r = http.get("/sandboxes", headers={"Origin": origin})
            assert r.status_code == 200, (origin, r.text)
        # The same site on another port or scheme is another origin.
        for origin in ("http://ui.internal:3001", "https://ui.internal:3000", "null",
                       "http://localhost:" + str(urlsplit(configured).port)):
            r = http.post("/sandboxes", json={"image": "host"}, headers={"Origin": origin})
            assert r.status_code == 403, (origin, r.text)
            assert "allowed_origins" in r.json()["detail"] and origin in r.json()["detail"]


@needs_root
def test_a_listed_origin_may_open_the_pty_websocket(configured: str) -> None:
    """The guard lets it through to the route, which then answers for the sandbox (none
    here: closed with 1008 after the handshake, not refused at it)."""
    url = f"{configured.replace('http://', 'ws://')}/sandboxes/sb-none/exec/pty?command=sh"
    with (pytest.raises(ConnectionClosed) as closed,
          connect(url, origin="http://ui.internal:3000", open_timeout=30) as ws):
        ws.recv(timeout=20)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    assert "sb-none" in closed.value.rcvd.reason
    with pytest.raises(InvalidStatus) as refused, connect(url, origin="http://ui.internal:3001",
                                                          open_timeout=30):
        pass
    assert refused.value.response.status_code == 403
    assert "allowed_origins" in json.loads(refused.value.response.body)["detail"]


def test_default_hosts_are_loopback_without_keys_and_any_with_keys() -> None:
    assert Settings().hosts() == ["127.0.0.1", "localhost", "::1"]
    assert Settings(api_keys=["k"]).hosts() == ["*"]
    assert Settings(api_keys=["k"], allowed_hosts=["[::1]", "Orchard.Svc"]).hosts() == [
        "::1", "orchard.svc"]
    assert Settings().allowed_origins == []


@pytest.mark.parametrize(("field", "value", "message"), [
    ("allowed_hosts", "localhost:8000", "not a host pattern"),
    ("allowed_hosts", "a*.example.com", "not a host pattern"),
    ("allowed_origins", "ui.internal:3000", "not an origin"),
    ("allowed_origins", "http://ui.internal/app", "not an origin"),
])
def test_a_bad_pattern_is_refused_with_what_to_give(field: str, value: str,
                                                    message: str) -> None:
    with pytest.raises(ValidationError, match=message) as info:
        Settings(**{field: [value]})
    assert repr(value) in str(info.value)


def test_serve_options_and_the_config_file_set_them(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    seen: list[Settings] = []

    def capture(settings: Settings, delete_on_shutdown: bool = False) -> None:
        seen.append(settings)
        raise SystemExit(0)  # before anything is built or bound

    monkeypatch.setattr(server_module, "build_app", capture)
    monkeypatch.delenv("ORCHARD_API_KEYS", raising=False)
    r = CliRunner().invoke(cli, ["serve", "--allowed-host", "orchard.test", "--allowed-host",
                                 "*.svc", "--allowed-origin", "http://ui.test:3000"])
    assert r.exit_code == 0, r.output
    assert seen[-1].hosts() == ["orchard.test", "*.svc"]
    assert seen[-1].allowed_origins == ["http://ui.test:3000"]
    config = tmp_path / "orchard.yaml"
    config.write_text("allowed_hosts: [orchard.test]\nallowed_origins: ['*']\n")
    settings = server_module.load_settings(config)
    assert settings.hosts() == ["orchard.test"] and settings.allowed_origins == ["*"]
    r = CliRunner().invoke(cli, ["serve", "--allowed-host", "localhost:8000"])
    assert r.exit_code == 1 and "not a host pattern" in str(r.exception), r.output
