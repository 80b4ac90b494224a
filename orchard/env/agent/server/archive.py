"""Whole trees in and out as tar streams, and signals to every process: snapshots and pause
where the orchestrator cannot see the sandbox's file system or cgroup (Kubernetes)."""

from __future__ import annotations

import contextlib
import os
import signal
import time

from .common import CHUNK, HTTPError, resolve
from .processes import _processes

# Only type checkers import these: importing typing would cost every sandbox heap.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .connection import Conn
    from .protocol import ArchiveRestored, Signalled

_S_IFMT, _S_IFDIR, _S_IFREG, _S_IFLNK = 0o170000, 0o040000, 0o100000, 0o120000


def _tarfile():
    # Loaded on first use: most sandboxes never take a snapshot, and every one pays the heap.
    import tarfile

    return tarfile


def archive_roots(paths: list[str]) -> list[str]:
    """The absolute, normalised paths asked for; '/' is refused (it holds /proc and /sys)."""
    if not paths:
        raise HTTPError(400, "give at least one 'path' query parameter to archive")
    roots = []
    for p in paths:
        root = resolve(p)
        if root == "/":
            raise HTTPError(400, "refusing to archive '/': name the directories to keep, "
                                 "e.g. path=/workspace&path=/root")
        if root not in roots:
            roots.append(root)
    return roots


def _walk(root):
    """Every path under root, root first and parents before children, without following
    symlinks; entries that vanish meanwhile are skipped."""
    stack = [root]
    while stack:
        path = stack.pop()
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        yield path, st
        if st.st_mode & _S_IFMT == _S_IFDIR:
            try:
                names = sorted(os.listdir(path), reverse=True)
            except (FileNotFoundError, NotADirectoryError):
                continue
            stack.extend(os.path.join(path, n) for n in names)


def files_size(roots: list[str]) -> int:
    return sum(st.st_size for root in roots for _p, st in _walk(root)
               if st.st_mode & _S_IFMT == _S_IFREG)


class _ChunkWriter:
    """A file object for tarfile that sends what it is given as HTTP chunks of about CHUNK."""

    def __init__(self, c: Conn) -> None:
        self.c, self.pending = c, []
        self.size = 0

    def write(self, data):
        self.pending.append(bytes(data))
        self.size += len(data)
        if self.size >= CHUNK:
            self.flush()
        return len(data)

    def flush(self):
        if self.pending:
            self.c.chunk(b"".join(self.pending))
            self.pending, self.size = [], 0


class _Exactly:
    """Reads exactly ``size`` bytes of an open file, padding with NULs if it shrank since it
    was measured: a file written while the snapshot runs must not break the whole archive."""

    def __init__(self, f, size):
        self.f, self.left = f, size

    def read(self, n=-1):
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.f.read(n)
        if len(data) < n:
            data += b"\0" * (n - len(data))
        self.left -= len(data)
        return data


def send_archive(c: Conn, query: dict[str, list[str]]) -> None:
    """GET /archive: a tar stream of the paths (skipping those that do not exist), with
    numeric owners and symlinks as symlinks. With max_bytes, a 413 before anything is sent
    when the regular files add up to more. With freeze=1, the sandbox's running processes are
    stopped until the archive is complete, so that it is one moment's state."""
    roots = archive_roots(query.get("path", []))
    frozen = set()
    if query.get("freeze", [""])[-1] in ("1", "true"):
        frozen = _signal(signal.SIGSTOP, leave_stopped=True)[0]
    try:
        _send_archive(c, query, roots)
    finally:
        _continue(frozen)


def _send_archive(c, query, roots):
    tarfile = _tarfile()
    if "max_bytes" in query:
        try:
            limit = int(query["max_bytes"][-1])
        except ValueError:
            raise HTTPError(400, "max_bytes must be an integer number of bytes") from None
        total = files_size(roots)
        if total > limit:
            raise HTTPError(413, f"the files under {', '.join(roots)} hold {total} bytes, over "
                                 f"the limit {limit} bytes; delete files or raise the limit")
    c.start_chunked("application/x-tar")
    out = _ChunkWriter(c)
    # PAX keeps long names, sub-second mtimes and big ids; numeric owners only, since the
    # names in this sandbox's /etc/passwd mean nothing where the archive is restored.
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT,
                      bufsize=CHUNK) as tar:
        for root in roots:
            for path, _st in _walk(root):
                try:
                    info = tar.gettarinfo(path, path.lstrip("/"))
                except FileNotFoundError:
                    continue
                if info is None:  # a socket: nothing to keep
                    continue
                info.uname = info.gname = ""
                if not info.isreg():
                    tar.addfile(info)
                    continue
                try:
                    with open(path, "rb") as f:
                        tar.addfile(info, _Exactly(f, info.size))
                except FileNotFoundError:
                    # Removed after its header was built but before any byte went out.
                    continue
    out.flush()
    c.end_chunked()


class _BodyReader:
    """A file object over a request body's chunks, for tarfile's stream mode."""

    def __init__(self, chunks):
        self.chunks, self.buf = chunks, b""

    def read(self, n=-1):
        while n < 0 or len(self.buf) < n:
            data = next(self.chunks, None)
            if data is None:
                break
            self.buf += data
        if n < 0:
            data, self.buf = self.buf, b""
        else:
            data, self.buf = self.buf[:n], self.buf[n:]
        return data


def _member_path(name: str) -> str:
    """The absolute path a member goes to; names with '..' are refused, and a leading '/' is
    taken as relative to the sandbox's root (GNU tar strips it the same way)."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise HTTPError(400, f"archive member {name!r} is empty or climbs out with '..'; "
                             "send an archive made by GET /archive")
    return "/" + "/".join(parts)


def _clear(path: str, keep_dir: bool) -> None:
    """Remove what is at path; with keep_dir, a directory's contents only (it may be a mount
    point, such as a pod's emptyDir volume, which cannot be removed)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if st.st_mode & _S_IFMT != _S_IFDIR:
        os.unlink(path)
        return
    for name in os.listdir(path):
        _clear(os.path.join(path, name), keep_dir=False)
    if not keep_dir:
        os.rmdir(path)


def receive_archive(c: Conn, headers: dict[str, str]) -> ArchiveRestored:
    """PUT /archive: each tree in the tar replaces what is at its path, keeping owners, modes
    and mtimes. A member is the root of a tree unless it lies inside a directory the archive
    gave earlier (GET /archive sends each root before its contents)."""
    tarfile = _tarfile()
    roots, dirs, links, seen_dirs, files = [], [], set(), set(), 0
    # Not filter="tar": it clears setuid, setgid and sticky bits and group/other write (so
    # /tmp's 1777 would be lost). Paths are checked here instead; with "/" as the destination,
    # the one way out of a tree is through a symlink the archive itself made, refused below.
    trusted = {"filter": tarfile.fully_trusted_filter} if hasattr(
        tarfile, "fully_trusted_filter") else {}
    chunks = c.body_chunks(headers)
    with tarfile.open(fileobj=_BodyReader(chunks), mode="r|", bufsize=CHUNK) as tar:
        for member in tar:
            path = _member_path(member.name)
            member.name = path.lstrip("/")
            through = next((p for p in (path, *_parents(path)) if p in links), None)
            if through:
                raise HTTPError(400, f"archive member {path} lies at or under {through}, which "
                                     "the archive made a symlink; refusing to write through it")
            if member.islnk():
                member.linkname = _member_path(member.linkname).lstrip("/")
            parent = os.path.dirname(path)
            if parent not in seen_dirs:  # the root of a tree: replace what is there
                roots.append(path)
                _clear(path, keep_dir=member.isdir())
                os.makedirs(parent, exist_ok=True)
            if member.isdir():
                seen_dirs.add(path)
                dirs.append(member)
            elif member.issym():
                links.add(path)
            elif member.isreg():
                files += 1
            tar.extract(member, "/", set_attrs=False, numeric_owner=True, **trusted)
            if not member.isdir():
                _set_attrs(tar, member, path)
        # Directories last, deepest first: their contents were written into them meanwhile
        # (so they had to stay writable), which also changed their mtimes.
        for d in reversed(dirs):
            _set_attrs(tar, d, "/" + d.name)
    for _ in chunks:  # zero blocks after the end marker: the connection must be left in step
        pass
    return {"paths": roots, "files": files}


def _set_attrs(tar, member, path):
    """Owner, then mode (a chown clears setuid bits), then mtime; each on its own, so that a
    sandbox without CAP_CHOWN still gets modes and mtimes right."""
    errors = (_tarfile().ExtractError, OSError)
    with contextlib.suppress(*errors):
        tar.chown(member, path, numeric_owner=True)
    if member.issym():
        return
    with contextlib.suppress(*errors):
        tar.chmod(member, path)
    with contextlib.suppress(*errors):
        tar.utime(member, path)


def _parents(path):
    while True:
        path = os.path.dirname(path)
        if path == "/":
            return
        yield path


_SIGNALS = {"STOP": signal.SIGSTOP, "CONT": signal.SIGCONT}


def _targets():
    """Every process of the sandbox but the agent. As a pod's pid 1 the agent owns the whole
    pid namespace; elsewhere (a local sandbox's init above it, or a test on the host) only its
    descendants are the sandbox's, and none escape them since the agent is a subreaper."""
    me = os.getpid()
    table = [(pid, ppid) for pid, _state, ppid, _pg, _sid in _processes()]
    if me == 1:
        return {pid for pid, _ in table if pid != me}
    children = {}
    for pid, ppid in table:
        children.setdefault(ppid, []).append(pid)
    found, stack = set(), list(children.get(me, ()))
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack.extend(children.get(pid, ()))
    return found


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2 :].split()[0]


def _signal(sig, leave_stopped=False):
    """Send sig to every process of the sandbox but the agent: (signalled, refused) pids.

    A STOP repeats until a pass finds nothing new and everything signalled has stopped, so a
    process forked while the first pass ran is stopped too. With leave_stopped, processes
    already stopped (paused, or by job control) are left out, so that a CONT of what this
    returns lets only those run on that were running."""
    done, signalled, refused = set(), set(), set()
    for _ in range(200):
        new = _targets() - done
        for pid in new:
            if leave_stopped and _state(pid) in (b"T", b"t"):
                continue
            try:
                os.kill(pid, sig)
                signalled.add(pid)
            except ProcessLookupError:
                pass
            except PermissionError:
                refused.add(pid)
        done |= new
        if sig != signal.SIGSTOP:
            break
        if not new and all(_state(pid) in (None, b"T", b"t", b"Z", b"X") for pid in signalled):
            break
        time.sleep(0.005)
    return signalled, refused


def _continue(pids):
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGCONT)


def signal_all(req) -> Signalled:
    """POST /signal: STOP or CONT every process of the sandbox but the agent. Processes the
    agent may not signal (another uid, and no CAP_KILL) are counted in ``not_permitted``."""
    name = req.get("signal")
    if name not in _SIGNALS:
        raise HTTPError(400, f"signal must be one of {', '.join(_SIGNALS)}, got {name!r}")
    signalled, refused = _signal(_SIGNALS[name])
    return {"signalled": len(signalled), "not_permitted": len(refused)}
