"""Live snapshots: a sandbox's processes and memory checkpointed with CRIU, restored in forks.

The agent (the sandbox's pid 1) is never checkpointed: each of its child trees is. The files
go into the snapshot's layer as for any snapshot, and the images beside it, in ``memory/``.
A sandbox created from such a snapshot boots its own agent over those files, and then each
tree is restored under that agent, in the new sandbox's namespaces, cgroups and uid range
(``criu_enter.py`` says how). Processes continue where they were: same pids, memory,
listening sockets, cwd and open files.

CRIU 4 is needed (Debian bookworm's 3.17 cannot read this kernel's vDSO); ``make setup``
builds it into ``.venv/criu``. It runs from a bundle of its own libraries and loader under
the data dir, so it loads nothing from a sandbox.

What cannot be carried: a Unix socket to another tree (or to the agent), a terminal session
(its pty belongs to the agent), devices beyond the sandbox's few, and a paused sandbox (its
tasks cannot be seized frozen). Established TCP connections are restored closed. Pipes to the
agent (a started process's stdout and stderr) become a file in the fork,
``/tmp/orchard-restored-<pid>.log``; the browser's protocol pipe is handed to the fork's agent.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from orchard.env.agent.bundle import _ldd
from orchard.env.backends.base import CheckpointFailed, MemoryUnsupported
from orchard.env.backends.local.criu_images import ImageFormatError, adopt_user_namespace
from orchard.env.filelock import exclusive_lock

__all__ = ["Checkpoints", "MemoryImage", "find_criu"]

ENTER = Path(__file__).with_name("criu_enter.py")
CRIU_ENV = "ORCHARD_CRIU"
MIN_VERSION = (4, 0)
META = "meta.json"
OUTPUT_LOG = "/tmp/orchard-restored-{pid}.log"
# CRIU's failures are lines like "Error (criu/sk-inet.c:188): inet: Connected TCP socket ...".
_ERROR = re.compile(r"^(?:pie: )?\s*(?:\d+: )?Error \([^)]*\): (.*)$", re.M)


@dataclass(frozen=True)
class MemoryImage:
    processes: list[dict[str, object]]  # {"pid": in-sandbox pid, "command": ...} per tree root
    bytes: int
    seconds: float
    stopped: list[int]  # host pids left stopped by the dump, to continue after the files


def find_criu() -> Path | None:
    """$ORCHARD_CRIU, the one ``make setup`` builds, or one on PATH: whichever is CRIU >= 4."""
    for candidate in (os.environ.get(CRIU_ENV), Path(sys.prefix) / "criu" / "criu",
                      shutil.which("criu")):
        if (candidate and os.access(candidate, os.X_OK)
                and _version(Path(candidate)) >= MIN_VERSION):
            return Path(candidate)
    return None


def _version(criu: Path) -> tuple[int, ...]:
    try:
        out = subprocess.run([str(criu), "--version"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    found = re.search(r"Version: (\d+)\.(\d+)", out)
    return tuple(int(g) for g in found.groups()) if found else ()


def _bundle(cache: Path, criu: Path) -> Path:
    """cache/<key>: the binary, its library closure and the loader, built once per binary."""
    st = criu.stat()
    key = hashlib.sha256(f"{criu}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    final = cache / f"criu-{key}"
    if final.is_dir():
        return final
    cache.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(cache / f".criu-{key}.lock"):
        if final.is_dir():
            return final
        partial = cache / f".criu-{key}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        (partial / "lib").mkdir(parents=True)
        shutil.copy2(criu, partial / "criu")
        libs = _ldd([criu])[criu]
        missing = [name for name, path in libs.items() if path is None]
        if missing:
            raise MemoryUnsupported(f"CRIU at {criu} lacks libraries {missing}; reinstall it")
        loader = Path("/lib64/ld-linux-x86-64.so.2")
        for path in [*libs.values(), loader]:
            assert path is not None
            shutil.copy2(path.resolve(), partial / "lib" / path.name)
        partial.chmod(0o755)
        partial.rename(final)
    return final


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for task in tasks:
        with contextlib.suppress(OSError):
            kids += map(int, Path(f"/proc/{pid}/task/{task}/children").read_text().split())
    return sorted(set(kids))


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += _children(p)
    return out


def _ns_pid(pid: int | str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    raise OSError(f"no NSpid for {pid}")


def _last_tid(pids: list[int]) -> int:
    """The highest in-sandbox thread id of these processes."""
    last = 1
    for pid in pids:
        with contextlib.suppress(OSError):
            last = max([last, *(_ns_pid(int(t)) for t in os.listdir(f"/proc/{pid}/task"))])
    return last


def last_pid(images: Path) -> int:
    """The pids a restore of ``images`` needs are all at most this."""
    return int(json.loads((images / META).read_text())["last_pid"])


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:200] or "?"


def _pipes(pids: list[int]) -> set[str]:
    found = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with_link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if with_link.startswith("pipe:["):
                    found.add(with_link)
        except OSError:
            continue
    return found


def _devtools(pid: int) -> dict[str, str]:
    """The agent's browser reads commands on fd 3 and answers on fd 4 (devtools.py): the pipes
    a fork's agent takes over."""
    try:
        if b"--remote-debugging-pipe" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return {}
        return {"commands": os.readlink(f"/proc/{pid}/fd/3"),
                "answers": os.readlink(f"/proc/{pid}/fd/4")}
    except OSError:
        return {}


def _errors(log: Path) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "no log"
    # CRIU logs harmless complaints as errors too (rlimits it may not raise, no tun device).
    noise = ("RLIMIT_NOFILE", "Unable to create tun", "cgroupd: recv req error")
    found = [e.strip().rstrip(".") for e in _ERROR.findall(text)
             if not any(n in e for n in noise)]
    if found:
        return "; ".join(dict.fromkeys(found))
    lines = text.strip().splitlines()
    return lines[-1] if lines else "no log"


def _du(top: Path) -> int:
    return sum(f.stat().st_size for f in top.rglob("*") if f.is_file())


class Checkpoints:
    """CRIU for one orchestrator; ``cache`` holds its bundle."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache

    def bundle(self) -> Path:
        criu = find_criu()
        if criu is None:
            raise MemoryUnsupported(
                "memory snapshots need CRIU 4 or newer, and none was found (not $ORCHARD_CRIU, "
                f"{Path(sys.prefix) / 'criu' / 'criu'}, nor on PATH); run `make setup`, which "
                "builds it, or take a files-only snapshot (memory: false)")
        return _bundle(self.cache, criu)

    def _enter(self, req: dict[str, object], timeout: float) -> int:
        """Runs criu_enter.py; its own failures (before CRIU ran) are added to the log."""
        done = subprocess.run([sys.executable, "-I", "-S", str(ENTER), json.dumps(req)],
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0 and done.stderr.strip():
            with open(str(req["log"]), "a") as log:
                log.write(f"Error (criu_enter): {done.stderr.strip()}\n")
        return done.returncode

    def dump(self, sandbox_id: str, agent: int, dest: Path, timeout: float = 300) -> MemoryImage:
        """Checkpoint every tree under the agent into dest, leaving them stopped (the caller
        continues them with ``cont`` once the files are copied too)."""
        bundle = self.bundle()
        t0 = time.perf_counter()
        shutil.rmtree(dest, ignore_errors=True)  # a crashed orchestrator's
        dest.mkdir(mode=0o755, parents=True)
        agent_pipes = _pipes([agent])
        trees, stopped = [], []
        try:
            for n, root in enumerate(_children(agent)):
                pids = _descendants(root)
                pid, command = _ns_pid(root), _command(root)
                images = dest / f"tree-{n}"
                images.mkdir(mode=0o755)
                code = self._enter({
                    "mode": "dump", "agent": agent, "criu": str(bundle), "images": str(images),
                    "log": str(dest / f"dump-{n}.log"),
                    "args": ["dump", "-t", str(pid), "-D", "{images}", "--leave-stopped",
                             "--file-locks", "--tcp-close"]},
                    timeout)
                if code != 0:
                    raise CheckpointFailed(
                        f"cannot checkpoint process {pid} ({command}) of sandbox {sandbox_id}: "
                        f"CRIU says: {_errors(dest / f'dump-{n}.log')}. A live snapshot "
                        "cannot carry connections to outside the process tree, terminal "
                        "sessions or devices; end that process, or take a files-only "
                        "snapshot (memory: false)")
                stopped += pids
                try:
                    adopt_user_namespace(images, pid)
                except (OSError, ImageFormatError) as e:
                    raise CheckpointFailed(f"CRIU's images of process {pid} ({command}) "
                                           f"are not as expected: {e}; is CRIU 4 installed?"
                                           ) from None
                devtools = _devtools(root)
                trees.append({"pid": pid, "command": command, "images": images.name,
                              "outputs": sorted(_pipes(pids) & agent_pipes
                                                - set(devtools.values())),
                              "devtools": devtools and {**devtools, "pid": pid}})
        except BaseException:
            self.cont(stopped)
            shutil.rmtree(dest, ignore_errors=True)
            raise
        for path in dest.rglob("*"):  # the fork's root, not host root, reads them
            path.chmod(0o755 if path.is_dir() else 0o644)
        (dest / META).write_text(json.dumps({"trees": trees, "last_pid": _last_tid(stopped)}))
        return MemoryImage(processes=[{"pid": t["pid"], "command": t["command"]} for t in trees],
                           bytes=_du(dest), seconds=time.perf_counter() - t0, stopped=stopped)

    @staticmethod
    def cont(pids: list[int]) -> None:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                continue

    def restore(self, sandbox_id: str, agent: int, images: Path, cgroups: list[Path],
                logs: Path, timeout: float = 300) -> list[int]:
        """Restore every tree of ``images`` under the agent of sandbox_id; returns their
        in-sandbox pids."""
        bundle = self.bundle()
        meta = json.loads((images / META).read_text())
        restored = []
        for n, tree in enumerate(meta["trees"]):
            log = logs / f"restore-{n}.log"
            code = self._enter({
                "mode": "restore", "agent": agent, "criu": str(bundle),
                "images": str(images / tree["images"]), "log": str(log),
                "cgroups": [str(c) for c in cgroups],
                "outputs": dict.fromkeys(tree["outputs"], OUTPUT_LOG.format(pid=tree["pid"])),
                "devtools": tree.get("devtools"),
                "args": ["restore", "-D", "{images}", "--restore-detached", "--unprivileged",
                         "--file-locks", "--tcp-close",
                         "--manage-cgroups=ignore"]}, timeout)
            if code != 0:
                raise CheckpointFailed(
                    f"cannot restore process {tree['pid']} ({tree['command']}) in sandbox "
                    f"{sandbox_id}: CRIU says: {_errors(log)}. Its pid may be taken in the new "
                    "sandbox, or it needs what the new sandbox lacks (e.g. its memory limit)")
            restored.append(int(tree["pid"]))
        return restored
