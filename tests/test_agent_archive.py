"""The agent's archive and signal endpoints (snapshots and pause on Kubernetes), against a real
agent process on this host: trees out and back in, the size limit, escapes, STOP and CONT."""

from __future__ import annotations

import io
import os
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard.env.agent.client import AgentClient, AgentError
from orchard.env.agent.server import boot as agent_boot
from tests.conftest import free_port, wait_until

TOKEN = "archive-token"


@pytest.fixture()
def agent(tmp_path: Path) -> Iterator[AgentClient]:
    """An agent on TCP with a token, as a pod runs it; its client is made per test."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-B", agent_boot.__file__, "--tcp", f"127.0.0.1:{port}",
         "--token-env", "ORCHARD_AGENT_TOKEN"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "ORCHARD_AGENT_TOKEN": TOKEN},
    )

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return True
        except OSError:
            return False

    assert wait_until(listening), f"the agent never listened on port {port}"
    yield AgentClient(f"tcp:127.0.0.1:{port}", token=TOKEN)
    proc.kill()
    proc.wait()


def tree(root: Path) -> dict[str, tuple]:
    """What a restore must keep of every entry under root: kind, mode, owner, mtime, content."""
    out: dict[str, tuple] = {}
    for path in [root, *sorted(root.rglob("*"))]:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            what: object = os.readlink(path)
        elif stat.S_ISREG(st.st_mode):
            what = (path.read_bytes(), st.st_ino == (root / "data" / "a.txt").lstat().st_ino)
        else:
            what = None
        # Symlink modes and mtimes are not kept by tar (nor settable on Linux): leave them out.
        keep_times = not stat.S_ISLNK(st.st_mode)
        out[str(path.relative_to(root))] = (
            stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode) if keep_times else None,
            # tar keeps mtimes as floats: to the millisecond is what survives a round trip.
            st.st_uid, st.st_gid, st.st_mtime_ns // 1_000_000 if keep_times else None, what)
    return out


def make_tree(root: Path) -> None:
    data = root / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.txt").write_text("alpha\n")
    (data / "a.txt").chmod(0o640)
    os.link(data / "a.txt", data / "hard.txt")
    (data / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (data / "run.sh").chmod(0o4755)  # setuid: a snapshot keeps what tar's filters would drop
    (data / "sub" / "b.bin").write_bytes(bytes(range(256)) * 1000)
    os.chown(data / "sub" / "b.bin", 1234, 2345)
    (data / "empty").mkdir()
    (data / "sticky").mkdir()
    (data / "sticky").chmod(0o1777)
    (data / "link").symlink_to("sub/b.bin")
    (data / "dangling").symlink_to("/nowhere/at/all")
    (data / "gone.txt").write_text("deleted before the snapshot\n")
    (data / "gone.txt").unlink()
    # A read-only directory with contents: its mode must be set after they are written.
    (data / "ro").mkdir()
    (data / "ro" / "inside").write_text("x")
    (data / "ro").chmod(0o555)
    for i, p in enumerate(sorted(data.rglob("*"))):
        if not p.is_symlink():
            os.utime(p, ns=(1_600_000_000_123_456_789 + i, 1_600_000_000_123_456_789 + i))
    os.utime(data, ns=(1_500_000_000_000_000_000, 1_500_000_000_000_000_000))


async def test_archive_round_trip_replaces_the_paths(agent: AgentClient, tmp_path: Path) -> None:
    root = tmp_path / "box"
    make_tree(root)
    before = tree(root)
    tar_path = tmp_path / "snap.tar"
    missing = str(root / "not-there")
    try:
        size = await agent.get_archive([str(root / "data"), missing], tar_path)
        assert size == tar_path.stat().st_size > 256_000
        with tarfile.open(tar_path) as tar:
            names = tar.getnames()
            hard = tar.getmember(str(root / "data" / "hard.txt").lstrip("/"))
            owned = tar.getmember(str(root / "data" / "sub" / "b.bin").lstrip("/"))
        assert names[0] == str(root / "data").lstrip("/")  # the root comes first
        assert not any("not-there" in n for n in names)  # a missing path is skipped
        assert hard.islnk()  # one inode, one copy (a.txt sorts first and carries the data)
        assert (owned.uid, owned.gid, owned.uname, owned.gname) == (1234, 2345, "", "")

        # Change everything a restore must undo: files added, removed, rewritten, chmod-ed.
        (root / "data" / "ro").chmod(0o755)
        (root / "data" / "a.txt").write_text("changed")
        (root / "data" / "sub" / "b.bin").unlink()
        (root / "data" / "empty" / "new.txt").write_text("made after the snapshot")
        (root / "data" / "added").mkdir()
        (root / "data" / "link").unlink()
        (root / "data" / "link").write_text("now a file")
        assert tree(root) != before

        restored = await agent.put_archive(tar_path)
        assert restored["paths"] == [str(root / "data")]
        assert restored["files"] == 4  # a.txt, run.sh, b.bin, ro/inside; hard.txt is a link
        after = tree(root)
        assert after == before
        assert not (root / "data" / "empty" / "new.txt").exists()
        assert not (root / "data" / "added").exists()
        assert not (root / "data" / "gone.txt").exists()
        assert (root / "data" / "hard.txt").stat().st_ino == (root / "data" / "a.txt").stat().st_ino
    finally:
        (root / "data" / "ro").chmod(0o755)
        await agent.close()


async def test_archive_over_max_bytes_is_refused_before_streaming(
        agent: AgentClient, tmp_path: Path) -> None:
    root = tmp_path / "big"
    root.mkdir()
    (root / "one").write_bytes(b"x" * 6000)
    (root / "two").write_bytes(b"y" * 5000)
    (root / "link").symlink_to("/usr/bin/env")  # not followed, so not counted
    dest = tmp_path / "out.tar"
    try:
        with pytest.raises(AgentError) as err:
            await agent.get_archive([str(root)], dest, max_bytes=10_999)
        assert err.value.status == 413
        assert "11000 bytes" in err.value.detail and "10999" in err.value.detail
        assert not dest.exists()
        # At the limit it goes through, and the connection is still in step afterwards.
        assert await agent.get_archive([str(root)], dest, max_bytes=11_000) > 11_000
        assert (await agent.health())["status"] == "ok"
    finally:
        await agent.close()


def tar_bytes(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes | None = None,
           linkname: str = "") -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    if data is not None:
        info.size = len(data)
    return info, data


async def test_archive_members_may_not_escape(agent: AgentClient, tmp_path: Path) -> None:
    base = str(tmp_path / "dest").lstrip("/")
    outside = tmp_path / "outside"
    outside.mkdir()
    cases = {
        "climbs out with '..'": tar_bytes(
            member(base, tarfile.DIRTYPE),
            member(f"{base}/../outside/evil.txt", data=b"evil")),
        "made a symlink": tar_bytes(
            member(base, tarfile.DIRTYPE),
            member(f"{base}/link", tarfile.SYMTYPE, linkname=str(outside)),
            member(f"{base}/link/evil.txt", data=b"evil")),
    }
    try:
        for expected, body in cases.items():
            src = tmp_path / "evil.tar"
            src.write_bytes(body)
            with pytest.raises(AgentError) as err:
                await agent.put_archive(src)
            assert err.value.status == 400 and expected in err.value.detail, err.value.detail
            assert not (outside / "evil.txt").exists()
        assert (await agent.health())["status"] == "ok"
    finally:
        await agent.close()


def proc_state(pid: int) -> str:
    stat_line = Path(f"/proc/{pid}/stat").read_text()
    return stat_line[stat_line.rindex(")") + 2]


def catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for ``signum`` (its SigCgt mask in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def children_of(pid: int) -> set[int]:
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(c) for c in (task / "children").read_text().split()}
    return found


async def test_signal_stops_and_continues_every_process(agent: AgentClient,
                                                        tmp_path: Path) -> None:
    counter, loop_pidfile = tmp_path / "count", tmp_path / "loop.pid"
    # A shell that starts a counting loop in the background: both must stop. The loop writes
    # its own pid. Picking it among the shell's children by name would race with the
    # shell's short-lived forks for each sleep, which carry the shell's name until they exec.
    script = (f"sh -c 'echo $$ > {loop_pidfile}; while :; do echo x >> {counter}; "
              f"sleep 0.02; done' & while :; do sleep 0.05; done")
    info = await agent.start_process({"command": script, "cwd": str(tmp_path)})
    try:
        shell = info["pid"]
        # The loop writes its pid before it counts, so a counter means the pid is there.
        assert wait_until(counter.exists), "the counting loop never started"
        loop_pid = int(loop_pidfile.read_text())
        assert loop_pid in children_of(shell)

        paused = await agent.signal_all("STOP")
        assert paused["signalled"] >= 3 and paused["not_permitted"] == 0  # shell, loop, sleeps
        # A stop lands when the process next leaves the kernel: one in the middle of a write
        # (state D) stops once the write is done.
        assert wait_until(lambda: proc_state(shell) == "T" and proc_state(loop_pid) == "T"), \
            f"not stopped: shell {proc_state(shell)}, loop {proc_state(loop_pid)}"
        size = counter.stat().st_size
        time.sleep(0.3)
        assert counter.stat().st_size == size  # nothing ran meanwhile
        assert (await agent.health())["status"] == "ok"  # the agent itself was not stopped

        resumed = await agent.signal_all("CONT")
        assert resumed["signalled"] >= 3
        assert wait_until(lambda: counter.stat().st_size > size), "the loop never continued"
        assert wait_until(lambda: proc_state(shell) != "T" and proc_state(loop_pid) != "T"), \
            "still stopped"

        with pytest.raises(AgentError) as err:
            await agent.signal_all("KILL")
        assert err.value.status == 400 and "STOP, CONT" in err.value.detail
    finally:
        await agent.signal_all("CONT")
        await agent.process(info["process_id"], "DELETE")  # its whole tree, the loop included
        await agent.close()


async def test_freeze_stops_running_processes_only_while_archiving(
        agent: AgentClient, tmp_path: Path) -> None:
    conts = tmp_path / "conts"
    # Its SIGCONT trap shows it was stopped and continued; the paused one must stay stopped.
    running = await agent.start_process({
        "command": f"trap 'echo cont >> {conts}' CONT; while :; do sleep 0.02; done",
        "cwd": str(tmp_path)})
    paused = await agent.start_process({"command": "while :; do sleep 0.02; done",
                                        "cwd": str(tmp_path)})
    try:
        # The trap is set once bash has read its command.
        assert wait_until(lambda: catches(running["pid"], signal.SIGCONT)), "no CONT trap set"
        os.kill(paused["pid"], signal.SIGSTOP)  # as a user's pause would
        assert wait_until(lambda: proc_state(paused["pid"]) == "T"), "SIGSTOP did not stop it"
        await agent.get_archive([str(tmp_path)], tmp_path.parent / "frozen.tar", freeze=True)
        assert wait_until(lambda: conts.exists() and conts.read_text() == "cont\n"), \
            "the running process was not stopped and continued"
        assert proc_state(running["pid"]) != "T"
        assert proc_state(paused["pid"]) == "T"  # not continued: it was not the archive's
        await agent.get_archive([str(tmp_path)], tmp_path.parent / "plain.tar")
        time.sleep(0.3)
        assert conts.read_text() == "cont\n"  # without freeze, nobody is stopped
    finally:
        os.kill(paused["pid"], signal.SIGCONT)
        for p in (running, paused):
            await agent.process(p["process_id"], "DELETE")
        await agent.close()
