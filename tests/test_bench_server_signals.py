"""A bench stopped by SIGINT or SIGTERM unwinds through BenchServer.stop: its orchestrator
(a child in a session of its own) and its temp dir go with it, even when the bench was
started in the background by a script and so inherited SIGINT ignored."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import alive, needs_root, wait_until

REPO = Path(__file__).resolve().parent.parent
BENCH = f"""
import sys, time
sys.path.insert(0, {str(REPO / "bench")!r})
from common import BenchServer
try:
    with BenchServer() as server:
        print(server.proc.pid, server.tmp, flush=True)
        time.sleep(600)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


@needs_root
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signalled_bench_stops_its_orchestrator_and_removes_its_temp_dir(sig: int) -> None:
    bench = subprocess.Popen(
        [sys.executable, "-c", BENCH], cwd=REPO, stdout=subprocess.PIPE, text=True,
        # As `bench.py &` from a script: SIGINT ignored from the start.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    orchestrator, tmp_dir = 0, Path()
    try:
        assert bench.stdout is not None
        pid, tmp = bench.stdout.readline().split()
        orchestrator, tmp_dir = int(pid), Path(tmp)
        assert alive(orchestrator) and tmp_dir.exists()
        os.kill(bench.pid, sig)
        assert bench.wait(60) == 0
        assert bench.stdout.read().strip() == "interrupted"
        assert wait_until(lambda: not alive(orchestrator))
        assert not tmp_dir.exists()
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        # What a failed stop left: the orchestrator deletes its sandboxes on SIGTERM.
        if orchestrator and alive(orchestrator):
            os.kill(orchestrator, signal.SIGTERM)
            wait_until(lambda: not alive(orchestrator))
        if tmp_dir.name.startswith("orchard-bench-"):
            shutil.rmtree(tmp_dir, ignore_errors=True)
