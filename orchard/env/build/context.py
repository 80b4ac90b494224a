"""The build context: which of its files a COPY or ADD takes (``.dockerignore`` respected),
their content hash for the step cache, and the tar that carries them into the sandbox.

``.dockerignore`` patterns are matched with pathspec's gitignore patterns, anchored at the
context's root as Docker anchors them (``*.pyc`` is the root's, ``**/*.pyc`` any), with ``!``
re-including and the last matching pattern winning for each path, as in Docker.
"""

from __future__ import annotations

import glob
import hashlib
import os
import posixpath
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pathspec

from orchard.env.build.dockerfile import DockerfileError, Instruction

_GLOB = set("*?[")


@dataclass(frozen=True)
class Entry:
    """One file, directory or link of the context, and where it lands in the image."""

    source: Path
    dest: str  # absolute path in the image


class BuildContext:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        if not self.root.is_dir():
            raise DockerfileError(f"build context {root} is not a directory")
        ignore = self.root / ".dockerignore"
        lines = ignore.read_text().splitlines() if ignore.is_file() else []
        self._ignore = pathspec.PathSpec.from_lines("gitignore", _anchored(lines))

    def excluded(self, rel: str) -> bool:
        return rel not in ("", ".") and self._ignore.match_file(rel)

    def entries(self, step: Instruction, sources: list[str], dest: str, *, unpack: bool
                ) -> tuple[list[Entry], list[Entry]]:
        """What ``COPY sources dest`` puts where, following Docker's rules: a directory's
        contents (not itself) go into dest; with several sources, or dest ending in '/',
        dest is a directory that each file goes into by its name. With ``unpack`` (ADD), a
        source that is a local tar archive is the second list: unpacked into dest."""
        matched = [m for src in sources for m in self._match(step, src)]
        into_dir = dest.endswith("/") or len(matched) > 1
        files: list[Entry] = []
        archives: list[Entry] = []
        for rel in matched:
            path = self.root / rel
            if path.is_dir() and not path.is_symlink():
                files.extend(self._walk(rel, dest))
            elif unpack and is_archive(path):
                archives.append(Entry(path, posixpath.normpath(dest)))
            else:
                target = posixpath.join(dest, posixpath.basename(rel)) if into_dir else dest
                files.append(Entry(path, posixpath.normpath(target)))
        return files, archives

    def _match(self, step: Instruction, src: str) -> list[str]:
        rel = posixpath.normpath(src.lstrip("/")) if src.strip("/") else "."
        if rel == ".." or rel.startswith("../"):
            raise step.error(f"source {src!r} is outside the build context {self.root}")
        if _GLOB & set(rel):
            found = sorted(glob.glob(rel, root_dir=self.root, include_hidden=True))
        else:
            found = [rel] if os.path.lexists(self.root / rel) else []
        found = [f for f in found if not self.excluded(f)]
        if not found:
            raise step.error(f"source {src!r} matches no file in the build context "
                             f"{self.root} (or only ones .dockerignore excludes)")
        return found

    def _walk(self, rel: str, dest: str) -> Iterator[Entry]:
        top = self.root / rel
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for name in [*dirnames, *sorted(filenames)]:
                path = Path(dirpath) / name
                inner = path.relative_to(top).as_posix()
                if not self.excluded(path.relative_to(self.root).as_posix()):
                    yield Entry(path, posixpath.normpath(posixpath.join(dest, inner)))


def content_hash(entries: list[Entry], archives: list[Entry]) -> str:
    """What a COPY or ADD step's cache key needs of its files: names, types, modes and bytes
    (not times or owners, as in Docker)."""
    h = hashlib.sha256()
    for e in [*entries, *archives]:
        st = e.source.lstat()
        h.update(f"{e.dest}\0{stat.S_IFMT(st.st_mode)}\0{stat.S_IMODE(st.st_mode)}\0".encode())
        if stat.S_ISLNK(st.st_mode):
            h.update(os.readlink(e.source).encode())
        elif stat.S_ISREG(st.st_mode):
            with open(e.source, "rb") as f:
                h.update(hashlib.file_digest(f, "sha256").digest())
        h.update(b"\n")
    return h.hexdigest()


def write_tar(out: IO[bytes], entries: list[Entry], archives: list[Entry],
              mode: int | None) -> None:
    """A tar of ``entries`` at their image paths (with ``mode`` if given) and of the members
    of each local archive ADD unpacks, under its dest directory. Every member is root's:
    sandbox commands have no CAP_CHOWN, so root is the one owner they can give a file (and
    the owner every command runs as)."""
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            info = tar.gettarinfo(str(e.source), e.dest.lstrip("/"))
            if info is None:  # a socket or fifo: nothing Docker copies either
                continue
            _own(info, mode)
            if info.isreg():
                with open(e.source, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
        for a in archives:
            _unpack_into(tar, a, mode)


def is_archive(path: Path) -> bool:
    """A local tar (plain, gzip, bzip2 or xz): what ADD unpacks instead of copying."""
    return path.is_file() and not path.is_symlink() and tarfile.is_tarfile(path)


def _unpack_into(tar: tarfile.TarFile, archive: Entry, mode: int | None) -> None:
    with tarfile.open(archive.source) as src:
        for member in src:
            name = posixpath.normpath(member.name.lstrip("/"))
            if name == ".." or name.startswith("../"):
                raise DockerfileError(f"ADD {archive.source.name}: member {member.name!r} "
                                      "climbs out of its directory with '..'")
            member.name = posixpath.join(archive.dest, name).lstrip("/")
            if member.islnk():
                member.linkname = posixpath.join(archive.dest, member.linkname).lstrip("/")
            _own(member, mode)
            tar.addfile(member, src.extractfile(member) if member.isreg() else None)


def _own(info: tarfile.TarInfo, mode: int | None) -> None:
    info.uid, info.gid, info.uname, info.gname = 0, 0, "", ""
    if mode is not None and not info.issym():
        info.mode = mode


def _anchored(lines: list[str]) -> list[str]:
    """.dockerignore lines as gitignore patterns anchored at the root."""
    out = []
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        body = posixpath.normpath(line[1:].strip() if negate else line).lstrip("/")
        if body in ("", "."):
            continue
        out.append(("!" if negate else "") + "/" + body)
    return out
