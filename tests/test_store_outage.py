"""A Redis outage: requests get a 503 that says so (not a bare 500), and the service recovers."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import httpx

from tests.conftest import create_ready, dedicated_orchestrator, free_port, needs_root, wait_until
from tests.redis_server import _answers_ping


@needs_root
def test_redis_outage_gives_a_clear_503_and_recovers(data_dir: Path, orchestrator: str) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="/tmp/orc-redis-"))
    port = free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
            "--save", "", "--appendonly", "no"]
    redis = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: _answers_ping(port), 10)
        with dedicated_orchestrator(data_dir, state=f"redis://127.0.0.1:{port}/0") as url, \
                httpx.Client(base_url=url, timeout=60) as http:
            sid = create_ready(http, {"image": "host"})
            redis.kill()
            redis.wait()
            r = http.get(f"/sandboxes/{sid}")
            assert r.status_code == 503, r.text
            assert "state store" in r.json()["detail"] and "retry" in r.json()["detail"]
            assert r.headers["Retry-After"]
            # Back, but empty (no persistence here): the sandbox has no record any more, so
            # the reconcile pass removes it as an orphan instead of leaking it.
            redis = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
            assert wait_until(lambda: _answers_ping(port), 10)
            assert wait_until(lambda: http.get("/sandboxes").status_code == 200, 30)
            assert http.get(f"/sandboxes/{sid}").status_code == 404
            assert wait_until(lambda: http.get("/resources").json()["sandboxes"] == 0, 30)
    finally:
        redis.kill()
        redis.wait()
        shutil.rmtree(workdir, ignore_errors=True)

