"""Who owns a data dir and what an orchestrator's death leaves behind.

One orchestrator per data dir (a second one refuses to start), a private data dir for every
`SandboxClient.local()`, and nothing left running after an embedded orchestrator is SIGKILLed.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from orchard import SandboxClient
from orchard.env.backends.local.cgroupfs import read_file
from orchard.env.backends.local.host_state import cgroup_group
from orchard.env.backends.local.userns import REGISTRY
from orchard.env.datadir import DataDirInUse
from orchard.env.server import EmbeddedOrchestrator
from tests.conftest import create_ready, free_port, needs_root, run, short_data_dir, wait_until
from tests.test_lifecycle import _start_server, force_remove, short_tmp
from tests.test_sdk_e2e import _processes_mentioning

pytestmark = [needs_root, pytest.mark.root]


def claims_under(path: str) -> list[str]:
    """Uid-range claims (see orchard/env/backends/local/userns.py) held by sandboxes below
    ``path``."""
    return [c for c in (os.readlink(p) for p in REGISTRY.iterdir()) if c.startswith(path)]
__all__ = ["short_tmp"]  # a fixture, used by name


def test_a_second_orchestrator_on_the_same_data_dir_refuses_to_start(
        data_dir: Path, orchestrator: str, tmp_path: Path) -> None:
    del orchestrator  # only for the bundle it built
    with short_data_dir(data_dir) as short, \
            (holder := EmbeddedOrchestrator(data_dir=short, reconcile_interval=0.2)) as url, \
            httpx.Client(base_url=url, timeout=60) as http:
        sid = create_ready(http, {"image": "host"})
        second = EmbeddedOrchestrator(data_dir=short, reconcile_interval=0.2)
        with pytest.raises(DataDirInUse) as err:
            second.start()
        message = str(err.value)
        assert str(short) in message and f"pid {os.getpid()}" in message, message
        assert "--data-dir" in message
        # `orchard serve` says the same and exits, before it touches anything.
        serve = subprocess.run(
            [sys.executable, "-m", "orchard", "serve", "--data-dir", str(short),
             "--port", str(free_port())], capture_output=True, text=True, timeout=60)
        assert serve.returncode != 0
        assert f"data dir {short} is in use by another orchestrator (pid {os.getpid()}" \
            in serve.stderr, serve.stderr
        # The holder's sandboxes live through several reconcile passes of its own.
        for _ in range(3):
            holder.reconcile_once()
        assert run(http, sid, command="echo alive")["stdout"] == "alive\n"
    # Once the holder stopped, the data dir is free again.
    with short_data_dir(data_dir) as short:
        for _ in range(2):
            with EmbeddedOrchestrator(data_dir=short) as url:
                assert httpx.get(f"{url}/health").status_code == 200


def test_local_clients_get_private_data_dirs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORCHARD_URL", raising=False)
    with SandboxClient.local(reconcile_interval=0.2) as a, \
            SandboxClient.local(reconcile_interval=0.2) as b:
        dirs = [c._orchestrator.settings.data_dir for c in (a, b)]  # type: ignore[union-attr]
        assert dirs[0] != dirs[1] and all(d.is_dir() for d in dirs)
        sa, sb = a.create_sandbox("host"), b.create_sandbox("host")
        for _ in range(3):  # several reconcile passes each: neither may take the other's
            for c in (a, b):
                c._orchestrator.reconcile_once()  # type: ignore[union-attr]
        assert sa.exec("echo a").stdout == "a\n"
        assert sb.exec("echo b").stdout == "b\n"
    assert not any(d.exists() for d in dirs), dirs


_KILLED_CLIENT = textwrap.dedent("""
    import sys, time
    from orchard import SandboxClient
    client = SandboxClient.local()
    ids = [client.create_sandbox("host").id for _ in range(2)]
    sb = client.get_sandbox(ids[0])
    sb.exec("setsid sleep 600 > /dev/null 2>&1 &")
    sb.start_process("sleep 600")
    print(client._orchestrator.settings.data_dir, *ids, flush=True)
    time.sleep(600)
""")


def test_sigkilled_local_client_leaves_nothing_running(tmp_path: Path) -> None:
    with open(tmp_path / "client.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", _KILLED_CLIENT], stdout=subprocess.PIPE,
                                stderr=log, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line, (tmp_path / "client.log").read_text()
        private, *ids = line.split()
        local = Path(private) / "local"
        assert len(_processes_mentioning(private)) >= 3  # zygote and two sandboxes
        group = cgroup_group(local)
        assert glob.glob(f"/sys/fs/cgroup/*/{group}/{ids[0]}")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    # Zygote, bwrap and agents, and the commands they ran, end with their lifeline.
    assert wait_until(lambda: not _processes_mentioning(private), interval=0.2), (
        _processes_mentioning(private))
    def procs_of(sid: str) -> list[str]:
        return [p for f in glob.glob(f"/sys/fs/cgroup/*/{group}/{sid}/cgroup.procs")
                for p in (read_file(Path(f)) or "").split()]

    for sid in ids:
        procs = procs_of(sid)
        assert wait_until(lambda s=sid: not procs_of(s), interval=0.2), procs
    # The next local orchestrator removes the dead one's directory and cgroups.
    assert Path(private).is_dir()
    assert claims_under(private)  # the check can fail: the dead sandboxes still hold theirs
    with SandboxClient.local() as client:
        client.health()
    assert not Path(private).exists()
    assert claims_under(private) == []  # their uid ranges are free again
    assert glob.glob(f"/sys/fs/cgroup/*/{group}") == []


def _zygotes(data_dir: Path) -> list[str]:
    """The data dir's zygote, told from the agents it forked (which share its command line)
    by its pid namespace: agents live in their sandbox's."""
    host_ns = os.readlink("/proc/self/ns/pid")
    found = []
    for line in _processes_mentioning(str(data_dir / "local" / "zygote.sock")):
        pid = line.split(":")[0]
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") == host_ns:
                found.append(line)
        except OSError:
            continue
    return found


def test_sigkilled_standalone_orchestrator_leaves_no_zygote(
        short_tmp: Path, tmp_path: Path, data_dir: Path, orchestrator: str) -> None:
    del data_dir, orchestrator  # only for the bundle
    port = free_port()
    proc = _start_server(short_tmp, port, tmp_path / "serve.log")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            sid = create_ready(http, {"image": "host"})
        assert _zygotes(short_tmp)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    try:
        assert wait_until(lambda: not _zygotes(short_tmp), interval=0.1), _zygotes(short_tmp)
        # Its sandboxes live on, for the next orchestrator on this data dir to re-adopt.
        proc = _start_server(short_tmp, port, tmp_path / "serve.log")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            assert run(http, sid, command="echo readopted")["stdout"] == "readopted\n"
            assert http.delete(f"/sandboxes/{sid}").status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)
        force_remove(sid)
