"""A real redis-server for tests: one per session on loopback, isolated per test by prefix.

Register with ``pytest_plugins = ["tests.redis_server"]``.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import dies_with_the_tests, free_port

_START_TIMEOUT_S = 20.0



def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _start(binary: str, workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Start redis-server on a free port; another process may grab the port between our probe
    and redis binding it, hence a few attempts."""
    log_path = workdir / "redis.log"
    for _ in range(5):
        port = free_port()
        proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(workdir),
                "--save",
                "",
                "--appendonly",
                "no",
                "--logfile",
                str(log_path),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            preexec_fn=dies_with_the_tests,
        )
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            if _answers_ping(port):
                return proc, port
            time.sleep(0.05)
        _stop(proc)
    log = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
    pytest.fail(f"redis-server did not answer PING on 127.0.0.1 after 5 tries; its log:\n{log}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``redis://127.0.0.1:PORT/0`` of a redis-server private to this test session."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail(
            "redis-server is not installed; `make test` installs it "
            "(or run `apt-get install redis-server`)"
        )
    proc, port = _start(binary, tmp_path_factory.mktemp("redis"))
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        _stop(proc)


@pytest.fixture()
def redis_store_url(redis_url: str) -> str:
    """The session's Redis URL with a key prefix no other test uses."""
    return f"{redis_url}?prefix=test-{uuid.uuid4().hex[:12]}"
