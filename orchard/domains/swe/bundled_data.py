"""The bundled task set, shipped as one archive and unpacked into a cache on first use.

Its 33 repositories are Python libraries with deliberate bugs. Kept as plain files in the
package, linters, type checkers, coverage and test collectors would all read them as our code.
As package data in an archive, nothing sees them but the loader.

To edit a bundled task:

    python -m orchard.domains.swe.bundled_data unpack /tmp/bundled   # a directory per task
    ... edit /tmp/bundled/<task>/ ...
    python -m orchard.domains.swe.bundled_data pack /tmp/bundled     # rewrites the archive

Packing is deterministic (sorted members, no times or owners), so an unchanged set packs to
the same bytes and a changed one shows up in git as one changed file.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

ARCHIVE = "bundled.tar.gz"


def archive_bytes() -> bytes:
    """The archive inside the installed package."""
    return resources.files("orchard.domains.swe").joinpath("data", ARCHIVE).read_bytes()


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "orchard"


def bundled_dir() -> Path:
    """The unpacked set: one directory per task, in a cache keyed by the archive's content,
    so a changed archive is never served from a stale copy."""
    data = archive_bytes()
    target = cache_root() / "bundled-tasks" / hashlib.sha256(data).hexdigest()[:16]
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Unpacked beside the target and renamed into place: a reader never sees half a set,
    # and two processes unpacking at once both end with the same complete directory.
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=target.parent))
    try:
        unpack(data, tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def unpack(data: bytes, into: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(into, filter="data")


def pack(source: Path) -> bytes:
    """The task directories under ``source`` as a deterministic gzipped tar."""
    tasks = sorted(p.parent for p in source.glob("*/task.yaml"))
    if not tasks:
        raise SystemExit(f"no task directories (*/task.yaml) under {source}")
    buf = io.BytesIO()
    # mtime=0 in the gzip header too: otherwise every pack differs.
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for task in tasks:
            for path in [task, *sorted(task.rglob("*"))]:
                if "__pycache__" in path.parts:
                    continue
                info = tar.gettarinfo(path, str(path.relative_to(source)))
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                info.mode = 0o755 if path.is_dir() or info.mode & 0o111 else 0o644
                if path.is_file():
                    with path.open("rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    return buf.getvalue()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m orchard.domains.swe.bundled_data",
                                     description="Unpack or repack the bundled task set.")
    parser.add_argument("action", choices=("unpack", "pack"))
    parser.add_argument("dir", type=Path, help="a directory with one directory per task")
    args = parser.parse_args(argv)
    here = Path(__file__).parent / "data" / ARCHIVE  # the source tree's copy, not a cache
    if args.action == "unpack":
        args.dir.mkdir(parents=True, exist_ok=True)
        unpack(here.read_bytes(), args.dir)
        print(f"unpacked {here} into {args.dir}")
    else:
        here.write_bytes(pack(args.dir))
        print(f"packed {args.dir} into {here}")


if __name__ == "__main__":
    main()
