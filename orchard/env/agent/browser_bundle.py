"""Chromium, carried into sandboxes whose image has none.

Like the interpreter bundle (see ``bundle.py``), it is built from what the orchestrator's host
has: Debian's Chromium directory (the binary, its paks, locales, ICU and V8 data, GL and Vulkan
shims), the glibc loader, the shared-library closure of all of it, the NSS modules it opens at
run time, and fonts with a fontconfig file naming them. The cache directory holding the builds
is bind-mounted read-only at ``BROWSER_MOUNT`` in every sandbox; the in-sandbox browser server
uses ``BROWSER_MOUNT/current`` when it is there and a Chromium on the image's PATH otherwise.

Layout (relative to the cache directory, which is ``BROWSER_MOUNT`` inside the sandbox)::

    <key>/chromium        PT_INTERP -> BROWSER_MOUNT/<key>/lib/<loader>, RPATH $ORIGIN/lib
    <key>/*.pak, ...      the rest of the host's Chromium directory, as it is
    <key>/lib/            the loader and the closure
    <key>/fonts/          the host's default sans, serif and monospace families
    <key>/fonts.conf      for FONTCONFIG_FILE: those fonts, a cache under /tmp
    current -> <key>      the newest build

The executable's DT_RPATH also serves every library and dlopen() that has no path of its own,
so only the executables and the few libraries that name a path are rewritten. Builds are made
on first use (about 5 s: the rewritten binary is a 297 MB copy, the rest hard links), not at
start, and never deleted: a running sandbox may use an older one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path

from orchard.env.agent.bundle import BundleError, _copy_elf, _ldd, _patchelf, _run
from orchard.env.filelock import exclusive_lock

__all__ = ["BROWSER_MOUNT", "ensure_browser_bundle", "host_chromium"]

log = logging.getLogger(__name__)

BROWSER_MOUNT = "/.orchard/browser"
# Bump whenever the layout or build recipe changes so that stale builds are not reused.
BROWSER_FORMAT = 2
# Debian's /usr/bin/chromium is a shell script that runs this binary.
HOST_CHROMIUM_DIRS = (Path("/usr/lib/chromium"), Path("/usr/lib/chromium-browser"))
EXECUTABLES = ("chromium", "chromium-browser", "chrome_crashpad_handler")
# NSS opens its crypto modules by name at run time; ldd cannot see them.
NSS_MODULES = ("libsoftokn3.so", "libfreebl3.so", "libfreeblpriv3.so", "libnssckbi.so")
FONT_FAMILIES = ("sans-serif", "serif", "monospace")


def host_chromium() -> Path | None:
    """The host's Chromium binary (not a wrapper script), or None."""
    for directory in HOST_CHROMIUM_DIRS:
        for name in EXECUTABLES[:2]:
            if (directory / name).is_file():
                return directory / name
    return None


def browser_key(chromium: Path) -> str:
    st = chromium.stat()
    ident = f"{BROWSER_FORMAT}:{chromium}:{st.st_size}:{st.st_mtime_ns}"
    return "chromium-" + hashlib.sha256(ident.encode()).hexdigest()[:16]


def ensure_browser_bundle(cache_dir: Path) -> Path | None:
    """cache_dir/<key> for the host's Chromium, built first if needed; None without one.

    Safe to call from several threads and processes at once, as ``ensure_bundle`` is.
    """
    chromium = host_chromium()
    if chromium is None:
        return None
    key = browser_key(chromium)
    final = cache_dir / key
    if not final.is_dir():
        cache_dir.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(cache_dir / f".{key}.lock"):
            if not final.is_dir():
                for stale in cache_dir.glob(f".{key}.tmp-*"):
                    shutil.rmtree(stale, ignore_errors=True)
                tmp = Path(tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=cache_dir))
                try:
                    _build(tmp, chromium, key)
                    os.rename(tmp, final)
                except BaseException:
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise
                log.info("built the browser bundle %s from %s", final, chromium)
    current = cache_dir / "current"
    if not current.is_symlink() or os.readlink(current) != key:
        # Swapped by rename, so a sandbox never sees the link missing.
        # Named by thread too: two threads of one process may get here at once.
        link = cache_dir / f".current-{os.getpid()}-{threading.get_ident()}"
        link.unlink(missing_ok=True)
        link.symlink_to(key)
        os.replace(link, current)
    return final


def _build(root: Path, chromium: Path, key: str) -> None:
    patchelf = _patchelf()
    # Linked where it can be, since only the executables change: the rest is 50 MB.
    shutil.copytree(chromium.parent, root, symlinks=True, dirs_exist_ok=True,
                    copy_function=_link_or_copy)
    executables = [root / name for name in EXECUTABLES if (root / name).is_file()]
    for exe in executables:  # patchelf rewrites in place: never through a link to the host
        exe.unlink()
        _copy_elf(chromium.parent / exe.name, exe)
    shared = [p for p in root.rglob("*.so*") if p.is_file() and not p.name.endswith(".TOC")]
    closure = _ldd([*executables, *shared])
    nss3 = next((deps["libnss3.so"] for deps in closure.values() if deps.get("libnss3.so")),
                None)
    nss = [nss3.parent / name for name in NSS_MODULES
           if nss3 is not None and (nss3.parent / name).is_file()]
    if nss:
        closure.update(_ldd(nss))
    missing = sorted({name for deps in closure.values() for name, path in deps.items()
                      if path is None})
    if missing:
        raise BundleError(f"{chromium} needs libraries that ldd cannot find: {missing}")

    interp = Path(_run([patchelf, "--print-interpreter", str(executables[0])]).strip())
    lib = root / "lib"
    lib.mkdir()
    _copy_elf(interp, lib / interp.name)
    libs = {name: path for deps in closure.values() for name, path in deps.items() if path}
    libs.update({p.name: p for p in nss})
    for name, path in libs.items():
        if not (root / name).exists():  # Chromium's own copy (libvulkan.so.1) comes first
            _copy_elf(path, lib / name)
            # A library's own RUNPATH (libpulse's names the host's pulseaudio dir) would
            # hide the executable's RPATH from its dependencies.
            if _run([patchelf, "--print-rpath", str(lib / name)]).strip():
                _run([patchelf, "--set-rpath", "$ORIGIN", str(lib / name)])
    for exe in executables:
        _run([patchelf, "--set-interpreter", f"{BROWSER_MOUNT}/{key}/lib/{interp.name}",
              "--force-rpath", "--set-rpath", "$ORIGIN/lib:$ORIGIN", str(exe)])
    _fonts(root, key)
    # The sandbox's uid is not the builder's: everything must be world-readable.
    for p in [root, *root.rglob("*")]:
        if not p.is_symlink() and p.stat().st_nlink == 1 or p.is_dir():
            p.chmod(p.stat().st_mode | 0o444 | (0o111 if p.is_dir() else 0))


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _fonts(root: Path, key: str) -> None:
    """The directories of the host's default families, and a fontconfig file for them."""
    fonts = root / "fonts"
    fonts.mkdir()
    fc_match = shutil.which("fc-match")
    directories = set()
    for family in FONT_FAMILIES if fc_match else ():
        found = _run([fc_match, "-f", "%{file}", family]).strip()
        if found:
            directories.add(Path(found).parent)
    for directory in sorted(directories):
        shutil.copytree(directory, fonts / directory.name, dirs_exist_ok=True)
    if not directories:
        log.warning("browser bundle: no fonts found (fc-match missing or empty); pages in "
                    "images without fonts render without text in screenshots")
    (root / "fonts.conf").write_text(
        '<?xml version="1.0"?>\n<!DOCTYPE fontconfig SYSTEM "fonts.dtd">\n<fontconfig>\n'
        f"  <dir>{BROWSER_MOUNT}/{key}/fonts</dir>\n"
        "  <cachedir>/tmp/.orchard-fontconfig</cachedir>\n</fontconfig>\n")
