"""Files and patches: upload, download, list, remove, and applying a diff."""

from __future__ import annotations

import os

from .common import DRAIN_LIMIT, WORKDIR, HTTPError, next_id, resolve
from .execution import run_exec

# Only type checkers import these: importing typing would cost every sandbox heap.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .connection import Conn
    from .protocol import DirListing, FileWritten, PatchRequest, PatchResult


def list_dir(path: str) -> DirListing:
    try:
        names = sorted(os.listdir(path))
    except FileNotFoundError:
        raise HTTPError(404, f"no such directory in the sandbox: {path}") from None
    except NotADirectoryError:
        raise HTTPError(400, f"not a directory: {path}; download it instead") from None
    files = []
    for name in names:
        try:
            st = os.lstat(os.path.join(path, name))
        except OSError:
            continue
        kind = ("directory" if _S_ISDIR(st.st_mode) else "file" if _S_ISREG(st.st_mode)
                else "symlink" if _S_ISLNK(st.st_mode) else "other")
        files.append({"name": name, "type": kind, "size": st.st_size, "modified": st.st_mtime})
    return {"path": path, "files": files}


def _S_ISDIR(m):
    return m & 0o170000 == 0o040000


def _S_ISREG(m):
    return m & 0o170000 == 0o100000


def _S_ISLNK(m):
    return m & 0o170000 == 0o120000


def remove_path(path: str, recursive: bool) -> None:
    if path == "/":
        raise HTTPError(400, "refusing to remove '/'")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise HTTPError(404, f"no such file or directory in the sandbox: {path}") from None
    if not _S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    if not recursive:
        try:
            os.rmdir(path)
        except OSError:
            raise HTTPError(409, f"directory {path} is not empty; pass recursive=true") from None
        return
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            os.unlink(os.path.join(root, name))
        for name in dirs:
            full = os.path.join(root, name)
            if os.path.islink(full):
                os.unlink(full)
            else:
                os.rmdir(full)
    os.rmdir(path)


def apply_patch(req: PatchRequest) -> PatchResult:
    cwd = req.get("cwd") or WORKDIR
    if not os.path.isdir(cwd):
        raise HTTPError(400, f"cwd {cwd!r} is not a directory in the sandbox")
    patch_path = f"/tmp/.orchard-patch-{next_id('')}.diff"
    with open(patch_path, "w") as f:
        f.write(req["patch"])
    timeout = float(req.get("timeout", 60))
    methods = [
        ("git apply", ["git", "apply", "--verbose", patch_path]),
        ("git apply --reject", ["git", "apply", "--reject", "--verbose", patch_path]),
        ("patch --fuzz=5", None),
    ]
    attempts = []
    try:
        for name, argv in methods:
            try:
                if argv is None:
                    r = _run_patch(patch_path, cwd, timeout)
                else:
                    r = run_exec({"argv": argv, "cwd": cwd, "timeout": timeout})
            except HTTPError as e:
                attempts.append(f"{name}: {e.detail}")
                continue
            if r["exit_code"] == 0:
                return {"success": True, "method": name, "stdout": r["stdout"],
                        "stderr": r["stderr"], "exit_code": 0, "attempts": attempts}
            attempts.append(f"{name}: exit {r['exit_code']}: {(r['stderr'] or r['stdout'])[-500:]}")
            if name == "git apply --reject":
                # --reject leaves the hunks that did apply: undo them before the next method
                # (only then: a blind -R would revert hunks the tree already had).
                if "applied cleanly" in r["stderr"] + r["stdout"]:
                    run_exec({"argv": ["git", "apply", "-R", "--reject", patch_path],
                              "cwd": cwd, "timeout": timeout})
                run_exec({"argv": ["sh", "-c", "find . -name '*.rej' -newer \"$0\" -delete",
                                   patch_path], "cwd": cwd, "timeout": timeout})
        return {"success": False, "method": None, "stdout": "", "stderr": attempts[-1],
                "exit_code": 1, "attempts": attempts}
    finally:
        os.unlink(patch_path)


# GNU patch, then BusyBox patch (which knows neither --batch nor --fuzz). --forward/-N refuse
# an already-applied patch instead of reversing it.
_PATCH_FLAVOURS = (
    ["patch", "--batch", "--forward", "--fuzz=5", "--no-backup-if-mismatch", "-p1"],
    ["patch", "-N", "-p1"],
)


def _run_patch(patch_path, cwd, timeout):
    """Dry-run first, so a patch that only partly applies leaves the tree untouched."""
    r = None
    for flags in _PATCH_FLAVOURS:
        r = run_exec({"argv": [*flags, "--dry-run", "-i", patch_path], "cwd": cwd,
                      "timeout": timeout})
        if "unrecognized option" in r["stderr"] or "invalid option" in r["stderr"]:
            continue  # another patch implementation: try the next flavour's flags
        if r["exit_code"] != 0:
            return r
        if "ing file " not in r["stdout"]:  # BusyBox exits 0 on input without any diff
            return {**r, "exit_code": 1, "stderr": r["stderr"] + "no diff found in the patch\n"}
        return run_exec({"argv": [*flags, "-i", patch_path], "cwd": cwd, "timeout": timeout})
    return r


def write_file(c: Conn, query: dict[str, str], headers: dict[str, str]) -> FileWritten:
    target = resolve(query.get("path"))
    if os.path.isdir(target):
        raise HTTPError(400, f"{target} is a directory; give a file path")
    parent = os.path.dirname(target)
    try:
        os.makedirs(parent, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise HTTPError(400, f"parent {parent} is not a directory") from None
    tmp = f"{target}.orchard-upload-{next_id('')}"
    size = 0
    try:
        with open(tmp, "wb") as f:
            for data in c.body_chunks(headers):
                f.write(data)
                size += len(data)
        if "mode" in query:
            os.chmod(tmp, int(query["mode"]))
        os.rename(tmp, target)  # atomic: a failed upload never truncates the old file
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return {"path": target, "size": size}


def send_file(c: Conn, target: str) -> None:
    try:
        # O_NONBLOCK: opening a FIFO must not hang the connection waiting for a writer.
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise HTTPError(404, f"no such file in the sandbox: {target}") from None
    except IsADirectoryError:
        raise HTTPError(400, f"{target} is a directory; list it instead") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not _S_ISREG(st.st_mode):
            raise HTTPError(400, f"{target} is not a regular file; read it with exec instead")
        # Files like those in /proc report size 0 yet have content: read those whole.
        data = f.read(DRAIN_LIMIT) if st.st_size == 0 else None
        size = len(data) if data is not None else st.st_size
        c.responded = True
        c.sock.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                       f"Content-Length: {size}\r\n\r\n".encode())
        if data is not None:
            c.sock.sendall(data)
        elif c.sock.sendfile(f, 0, size) != size:
            raise OSError("the file shrank while it was being sent")  # closes the connection
