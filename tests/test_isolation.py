"""Isolation of real sandboxes, checked from inside them through the REST API (no mocks)."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.conftest import create_ready, needs_root, run, wait_until
from tests.image_fixtures import make_busybox_rootfs
from tests.test_lifecycle import cgroup_dirs

pytestmark = [needs_root, pytest.mark.root]


def cgroup_file(sid: str, *names: str) -> str:
    """The first of ``names`` found in any of the sandbox's cgroup directories."""
    for name in names:
        for d in cgroup_dirs(sid):
            if Path(d, name).is_file():
                return Path(d, name).read_text()
    raise AssertionError(f"none of {names} in the cgroups of {sid}: {cgroup_dirs(sid)}")


@pytest.fixture(scope="module")
def client(orchestrator: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=orchestrator, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def box(client: httpx.Client) -> Iterator[str]:
    """One blocked-network host sandbox shared by the read-only checks of this module."""
    sid = create_ready(client, {"image": "host", "block_network": True})
    yield sid
    client.delete(f"/sandboxes/{sid}")


@pytest.fixture()
def loopback_server() -> Iterator[int]:
    """A TCP service on the host's 127.0.0.1 that answers b'host-secret' to every client."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"host-secret")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield srv.getsockname()[1]
    stop.set()
    thread.join(2)
    srv.close()


CONNECT = (
    "import socket,sys\n"
    "s=socket.socket(); s.settimeout(3)\n"
    "try:\n"
    "    s.connect(('127.0.0.1', int(sys.argv[1]))); print('CONNECTED', s.recv(64).decode())\n"
    "except OSError as e:\n"
    "    print('REFUSED', e); sys.exit(3)\n"
)


# --- filesystem ---------------------------------------------------------------------------


def test_host_secret_files_invisible(client: httpx.Client, box: str) -> None:
    token = uuid.uuid4().hex
    secrets = [Path(f"/root/orchard-secret-{token}"), Path(f"/tmp/orchard-secret-{token}")]
    try:
        for p in secrets:
            p.write_text(f"TOPSECRET-{token}")
        for p in secrets:
            r = run(client, box, command=f"cat {p}")
            assert r["exit_code"] != 0 and "No such file" in r["stderr"], r
            assert f"TOPSECRET-{token}" not in r["stdout"]
            r = run(client, box, command=f"ls -A {p.parent}")
            assert p.name not in r["stdout"], r
    finally:
        for p in secrets:
            p.unlink(missing_ok=True)


def test_etc_shadow_not_readable(client: httpx.Client, box: str) -> None:
    assert Path("/etc/shadow").read_text().startswith("root:")  # the host has real content
    r = run(client, box, command="cat /etc/shadow /etc/gshadow")
    assert "root:" not in r["stdout"], r


def test_host_home_root_var_and_data_dir_invisible(client: httpx.Client, box: str,
                                                   data_dir: Path) -> None:
    host_var = sorted(p.name for p in Path("/var").iterdir())
    assert host_var, "the host /var should have entries for this test to mean anything"
    r = run(client, box, command="ls -A /home; echo --; ls -A /root; echo --; ls -A /var")
    home, root, var = (part.split() for part in r["stdout"].split("--"))
    assert home == [] and root == [] and var == [], r
    r = run(client, box, command=f"ls -A {data_dir} || echo ABSENT; ls -A /tmp")
    assert "ABSENT" in r["stdout"], r
    assert "state.db" not in r["stdout"] and "local" not in r["stdout"].split()
    assert data_dir.name not in r["stdout"]


def test_other_sandbox_files_and_processes_invisible(client: httpx.Client, box: str) -> None:
    a = create_ready(client, {"image": "host"})
    try:
        r = run(client, a, command="echo from-a > /workspace/x && cat /workspace/x")
        assert r["stdout"] == "from-a\n"
        p = client.post(f"/sandboxes/{a}/exec", json={"command": "sleep 1234",
                                                      "background": True})
        assert p.status_code == 200, p.text
        # the process exists (once the background shell has started it)...
        assert wait_until(lambda: "sleep 1234" in run(client, a, command="ps -eo args")[
            "stdout"]), "sleep 1234 never showed in its own sandbox"
        r = run(client, box, command="ls -A /workspace; cat /workspace/x; ps -eo args")
        assert "from-a" not in r["stdout"] and "x" not in r["stdout"].split()
        assert "sleep 1234" not in r["stdout"], r  # ...but not for the other sandbox
    finally:
        client.delete(f"/sandboxes/{a}")


def test_host_processes_invisible(client: httpx.Client, box: str) -> None:
    r = run(client, box, command="ls /proc | grep -c '^[0-9][0-9]*$'; ps -eo args")
    count = int(r["stdout"].split()[0])
    assert count <= 8, r["stdout"]
    host_pids = sum(1 for p in Path("/proc").iterdir() if p.name.isdigit())
    assert host_pids > count
    assert "-m pytest" not in r["stdout"]  # this very test process is not visible


# --- network ------------------------------------------------------------------------------


def test_blocked_network_cannot_reach_host_loopback(client: httpx.Client, box: str,
                                                   loopback_server: int) -> None:
    with socket.create_connection(("127.0.0.1", loopback_server), 2) as s:  # reachable on host
        assert s.recv(64) == b"host-secret"
    r = run(client, box, argv=["python3", "-c", CONNECT, str(loopback_server)])
    assert r["exit_code"] == 3 and "REFUSED" in r["stdout"], r
    assert "host-secret" not in r["stdout"]
    r = run(client, box, command="tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
    assert r["stdout"].split() == ["lo"], r


def test_open_network_does_not_reach_host_loopback(client: httpx.Client,
                                                   loopback_server: int) -> None:
    """block_network=false used to share the host's network namespace, so services bound to
    127.0.0.1 on the host (this orchestrator's own API among them) were reachable from inside.
    Now a networked sandbox has its own namespace (see tests/test_network.py)."""
    sid = create_ready(client, {"image": "host", "block_network": False})
    try:
        r = run(client, sid, argv=["python3", "-c", CONNECT, str(loopback_server)])
        assert r["exit_code"] == 3 and "REFUSED" in r["stdout"], r
        assert "host-secret" not in r["stdout"]
        ifaces = run(client, sid, command="tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
        assert sorted(ifaces["stdout"].split()) == ["lo", "tap0"], ifaces
    finally:
        client.delete(f"/sandboxes/{sid}")


# --- privileges ---------------------------------------------------------------------------


def test_mount_and_unshare_denied(client: httpx.Client, box: str) -> None:
    r = run(client, box, command="mkdir -p /tmp/m && mount -t tmpfs x /tmp/m")
    assert r["exit_code"] != 0, r
    r = run(client, box, command="grep -c ' /tmp/m ' /proc/self/mounts")
    assert r["stdout"].strip() == "0"
    r = run(client, box, command="unshare -m true")
    assert r["exit_code"] != 0, r
    r = run(client, box, command="unshare -U -r true")
    assert r["exit_code"] != 0, r


def test_no_capabilities_and_seccomp(client: httpx.Client, box: str) -> None:
    status = run(client, box, command="cat /proc/self/status")["stdout"]
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    assert int(fields["CapEff"].strip(), 16) == 0
    assert int(fields["CapPrm"].strip(), 16) == 0
    assert fields["Seccomp"].strip() == "2"
    assert fields["NoNewPrivs"].strip() == "1"


# --- resource limits ----------------------------------------------------------------------


def test_fork_bomb_stopped_by_pids_limit(client: httpx.Client) -> None:
    sid = create_ready(client, {"image": "host", "pids": 64})
    try:
        assert cgroup_file(sid, "pids.max").strip() == "64"
        # It always ends by timeout (the trailing sleep), so the tree killer reaps the sleepers;
        # a bomb that finished early would leave them holding every pid for their 60 s.
        sleepers_s = 60
        bomb = (f"i=0; while [ $i -lt 200 ]; do (sleep {sleepers_s} &) ; i=$((i+1)); done; "
                f"echo spawned; sleep {sleepers_s}")
        r = run(client, sid, command=bomb, timeout_seconds=3)
        assert r["exit_code"] != 0 or "Resource temporarily unavailable" in r["stderr"] \
            or "fork" in r["stderr"].lower(), r
        events = cgroup_file(sid, "pids.events")
        assert int(events.split()[1]) > 0, events  # the kernel refused forks at the limit
        assert int(cgroup_file(sid, "pids.current")) <= 64
        # The tree killer leaves some 60 zombies at once, re-parented to the agent: it must
        # reap them all long before the sleepers' 60 s are up. (Its SIGCHLD handler once
        # deadlocked in such a storm, and the zombies held the pids limit for good.)
        assert wait_until(lambda: int(cgroup_file(sid, "pids.current")) <= 16, sleepers_s / 2,
                          0.2), cgroup_file(sid, "pids.current")
        r = run(client, sid, command="pgrep -c sleep; echo alive")
        assert r["stdout"] == "0\nalive\n", r  # nothing of the bomb survives, and it forks
    finally:
        client.delete(f"/sandboxes/{sid}")


def test_orphans_are_reaped_through_sigchld_storms(client: httpx.Client) -> None:
    """Bursts of 60 orphans exiting at once, re-parented to the agent. Before the agent's
    SIGCHLD handler was made lock-free it deadlocked in about half of such runs, and the
    unreaped zombies soon held every pid of the sandbox."""
    sid = create_ready(client, {"image": "host", "pids": 128})
    try:
        storm = ("for r in $(seq 10); do for i in $(seq 60); do (sleep 0.3 &); done; sleep 0.4; "
                 "done; echo done")
        for _ in range(2):
            r = run(client, sid, command=storm, timeout_seconds=30)
            assert (r["exit_code"], r["stdout"]) == (0, "done\n"), str(r)
        assert wait_until(lambda: int(cgroup_file(sid, "pids.current")) <= 16, interval=0.2), \
            cgroup_file(sid, "pids.current")
    finally:
        client.delete(f"/sandboxes/{sid}")


def test_a_sandbox_at_its_pids_limit_answers_503_not_silence(client: httpx.Client,
                                                             orchestrator: str) -> None:
    """With every pid taken, the agent has no thread for a new connection: each request must
    still get an answer (a retryable 503 saying why), and the sandbox recovers afterwards."""
    sid = create_ready(client, {"image": "host", "pids": 32})
    try:
        hog = run(client, sid, command="while :; do sleep 600 & done", background=True)
        assert wait_until(lambda: cgroup_file(sid, "pids.current").strip() == "32", interval=0.1), \
            "the hog never took every pid"

        def call(i: int) -> httpx.Response:
            # A client of its own each: the orchestrator must open new agent connections.
            with httpx.Client(base_url=orchestrator, timeout=30) as c:
                if i % 2:
                    return c.post(f"/sandboxes/{sid}/exec", json={"command": "true"})
                return c.get(f"/sandboxes/{sid}/files", params={"path": "/etc/hostname"})

        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(call, range(48)))
        odd = [r.text for r in answers if r.status_code not in (200, 503)]
        assert not odd, odd
        # Every route maps the agent's 503 the same way (exec used to turn it into a 400).
        for route in ("/exec", "/files"):
            refused = [r for r in answers
                       if r.status_code == 503 and r.request.url.path.endswith(route)]
            assert refused, (route, [r.status_code for r in answers])
            assert "pids limit" in refused[0].json()["detail"], refused[0].text
            assert refused[0].headers["retry-after"] == "1"

        killed = client.delete(f"/sandboxes/{sid}/processes/{hog['process_id']}")
        assert killed.status_code == 200, killed.text
        assert wait_until(lambda: int(cgroup_file(sid, "pids.current")) <= 16, interval=0.2), \
            cgroup_file(sid, "pids.current")
        assert run(client, sid, command="echo alive")["stdout"] == "alive\n"
    finally:
        client.delete(f"/sandboxes/{sid}")


def test_memory_hog_is_oom_killed(client: httpx.Client) -> None:
    sid = create_ready(client, {"image": "host", "memory": "64Mi"})
    try:
        info = client.get(f"/sandboxes/{sid}").json()
        assert info["limits"]["memory"]["enforced"] is True, info["limits"]
        r = run(client, sid, command="python3 -c 'b = bytearray(256 << 20); print(len(b))'",
                timeout_seconds=30)
        assert r["exit_code"] in (137, -9), r
        assert "268435456" not in r["stdout"]
        oom = dict(line.split() for line in
                   cgroup_file(sid, "memory.oom_control", "memory.events").splitlines())
        assert int(oom["oom_kill"]) >= 1, oom  # the kernel's cgroup OOM killer did it
        after = client.post(f"/sandboxes/{sid}/exec", json={"command": "echo alive"})
        if after.status_code == 200:
            assert after.json()["stdout"] == "alive\n"
        else:  # the agent itself was killed: the record must say so
            assert wait_until(lambda: client.get(f"/sandboxes/{sid}").json()["error"]), \
                "the agent died and the record never said so"
    finally:
        client.delete(f"/sandboxes/{sid}")


def test_cpu_limit_reported_and_enforced(client: httpx.Client) -> None:
    sid = create_ready(client, {"image": "host", "cpu": "200m"})
    try:
        cpu = client.get(f"/sandboxes/{sid}").json()["limits"]["cpu"]
        assert cpu["requested"] == "200m" and cpu["enforced"] is True, cpu
        burn = ("import os, time\nt = time.time()\nwhile time.time() - t < 1.5: pass\n"
                "print(os.times().user + os.times().system)")
        used = float(run(client, sid, argv=["python3", "-c", burn])["stdout"])
        assert used < 0.8, f"{used:.2f}s of CPU in 1.5s under a 0.2-core limit"
    finally:
        client.delete(f"/sandboxes/{sid}")


# --- the image is never modified ----------------------------------------------------------


def test_rootfs_image_never_modified(client: httpx.Client, data_dir: Path,
                                     tmp_path: Path) -> None:
    image = make_busybox_rootfs(tmp_path / "rootfs")
    before = sorted(str(p.relative_to(image)) for p in image.rglob("*"))
    passwd = (image / "etc/passwd").read_text()
    sid = create_ready(client, {"image": str(image)})
    sdir = data_dir / "local" / "sandboxes" / sid
    try:
        r = run(client, sid, command="echo new > /etc/new-file && echo hacked >> /etc/passwd "
                "&& rm /bin/ls && mkdir /opt-new && cat /etc/new-file")
        assert r["exit_code"] == 0 and r["stdout"] == "new\n", r
        assert sorted(str(p.relative_to(image)) for p in image.rglob("*")) == before
        assert (image / "etc/passwd").read_text() == passwd
        assert (image / "bin/ls").is_symlink()
        upper = sdir / "upper"
        assert (upper / "etc/new-file").read_text() == "new\n"
        assert "hacked" in (upper / "etc/passwd").read_text()
    finally:
        assert client.delete(f"/sandboxes/{sid}").status_code == 200
    assert wait_until(lambda: not sdir.exists()), f"{sdir} was never removed"
    assert (image / "etc/passwd").read_text() == passwd
