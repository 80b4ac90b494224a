"""Files through the real REST API: JSON (base64) and raw streaming endpoints, listing, removal."""

from __future__ import annotations

import base64
import hashlib
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import needs_root, run, wait_until

pytestmark = needs_root

MB = 1 << 20


def upload_b64(http: httpx.Client, sid: str, path: str, data: bytes, **extra: object
               ) -> httpx.Response:
    return http.post(f"/sandboxes/{sid}/files",
                     json={"path": path, "content": base64.b64encode(data).decode(), **extra})


def put_raw(http: httpx.Client, sid: str, path: str, data: object, **params: object
            ) -> httpx.Response:
    return http.put(f"/sandboxes/{sid}/files/raw", params={"path": path, **params}, content=data)


def get_raw(http: httpx.Client, sid: str, path: str) -> httpx.Response:
    return http.get(f"/sandboxes/{sid}/files/raw", params={"path": path})


def listing(http: httpx.Client, sid: str, path: str) -> dict[str, dict]:
    r = http.get(f"/sandboxes/{sid}/files/list", params={"path": path})
    assert r.status_code == 200, r.text
    return {f["name"]: f for f in r.json()["files"]}


def test_base64_round_trip(http: httpx.Client, sandbox: str) -> None:
    data = bytes(range(256)) * 40 + "ünï\n".encode()
    r = upload_b64(http, sandbox, "/workspace/b64/data.bin", data)
    assert r.status_code == 200, r.text
    assert r.json() == {"path": "/workspace/b64/data.bin", "size": len(data)}
    r = http.get(f"/sandboxes/{sandbox}/files", params={"path": "/workspace/b64/data.bin"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert base64.b64decode(body["content"]) == data
    assert body["size"] == len(data)
    # And it really is the file the sandbox sees.
    job = run(http, sandbox, command="sha256sum /workspace/b64/data.bin")
    assert job["stdout"].split()[0] == hashlib.sha256(data).hexdigest()
    # Empty files work too.
    assert upload_b64(http, sandbox, "empty", b"").json()["size"] == 0
    r = http.get(f"/sandboxes/{sandbox}/files", params={"path": "empty"})
    assert (r.json()["content"], r.json()["size"]) == ("", 0)


def test_base64_upload_rejects_bad_base64(http: httpx.Client, sandbox: str) -> None:
    r = http.post(f"/sandboxes/{sandbox}/files", json={"path": "x", "content": "@@not b64@@"})
    assert r.status_code == 400
    assert "base64" in r.json()["detail"]


def test_raw_round_trip_binary(http: httpx.Client, sandbox: str) -> None:
    data = random.Random(3).randbytes(3 * MB + 17)
    r = put_raw(http, sandbox, "/workspace/raw.bin", data)
    assert r.status_code == 200, r.text
    assert r.json() == {"path": "/workspace/raw.bin", "size": len(data)}
    r = get_raw(http, sandbox, "/workspace/raw.bin")
    assert r.status_code == 200
    assert r.headers["content-length"] == str(len(data))
    assert r.content == data
    # Overwrite with something shorter: no stale tail.
    assert put_raw(http, sandbox, "/workspace/raw.bin", b"short").status_code == 200
    assert get_raw(http, sandbox, "/workspace/raw.bin").content == b"short"


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


class _RssSampler:
    """Peak RSS of this process (which embeds the orchestrator) while a block runs."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, _rss())

    def __enter__(self) -> _RssSampler:
        self.peak = _rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())


def _make_big_file(path: Path, size_mb: int) -> str:
    block = random.Random(11).randbytes(MB)
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for i in range(size_mb):
            chunk = i.to_bytes(8, "big") + block[8:]
            f.write(chunk)
            digest.update(chunk)
    return digest.hexdigest()


def test_200mb_streams_intact_with_bounded_memory(http: httpx.Client, sandbox: str,
                                                  tmp_path: Path) -> None:
    size_mb = 200
    src, dst = tmp_path / "big.bin", tmp_path / "big.out"
    expected = _make_big_file(src, size_mb)
    baseline = _rss()
    t0 = time.monotonic()
    with _RssSampler() as up:
        with open(src, "rb") as f:
            r = http.put(f"/sandboxes/{sandbox}/files/raw", params={"path": "big/big.bin"},
                         content=f)
        assert r.status_code == 200, r.text
        assert r.json()["size"] == size_mb * MB
    t_up = time.monotonic() - t0
    inside = run(http, sandbox, command="sha256sum big/big.bin")["stdout"].split()[0]
    assert inside == expected
    t1 = time.monotonic()
    got = hashlib.sha256()
    url = f"/sandboxes/{sandbox}/files/raw"
    with (_RssSampler() as down,
          http.stream("GET", url, params={"path": "/workspace/big/big.bin"}) as r,
          open(dst, "wb") as out):
        assert r.status_code == 200
        assert r.headers["content-length"] == str(size_mb * MB)
        for chunk in r.iter_bytes():
            out.write(chunk)
            got.update(chunk)
    t_down = time.monotonic() - t1
    assert dst.stat().st_size == size_mb * MB
    assert got.hexdigest() == expected
    growth_up, growth_down = up.peak - baseline, down.peak - baseline
    print(f"200 MB: upload {t_up:.2f}s, download {t_down:.2f}s; RSS baseline "
          f"{baseline / MB:.0f} MB, peak growth upload {growth_up / MB:.1f} MB, "
          f"download {growth_down / MB:.1f} MB")
    assert growth_up < 64 * MB, f"upload buffered in memory: +{growth_up / MB:.0f} MB"
    assert growth_down < 64 * MB, f"download buffered in memory: +{growth_down / MB:.0f} MB"
    # The JSON endpoint refuses it instead of building a 270 MB base64 string.
    r = http.get(f"/sandboxes/{sandbox}/files", params={"path": "big/big.bin"})
    assert r.status_code == 413
    assert "/files/raw" in r.json()["detail"]


def test_list_types_and_sizes(http: httpx.Client, sandbox: str) -> None:
    run(http, sandbox, command="mkdir -p ls/sub && printf 12345 > ls/five && "
                               "ln -s five ls/link && mkfifo ls/pipe")
    entries = listing(http, sandbox, "/workspace/ls")
    assert set(entries) == {"sub", "five", "link", "pipe"}
    assert entries["five"]["type"] == "file" and entries["five"]["size"] == 5
    assert entries["sub"]["type"] == "directory"
    assert entries["link"]["type"] == "symlink"
    assert entries["pipe"]["type"] == "other"
    assert abs(entries["five"]["modified"] - time.time()) < 300
    r = http.get(f"/sandboxes/{sandbox}/files/list", params={"path": "ls"})
    assert r.json()["path"] == "/workspace/ls"
    default = http.get(f"/sandboxes/{sandbox}/files/list").json()
    assert default["path"] == "/workspace" and "ls" in {f["name"] for f in default["files"]}
    r = http.get(f"/sandboxes/{sandbox}/files/list", params={"path": "/workspace/nope"})
    assert r.status_code == 404
    assert "/workspace/nope" in r.json()["detail"]
    r = http.get(f"/sandboxes/{sandbox}/files/list", params={"path": "/workspace/ls/five"})
    assert r.status_code == 400


def test_mkdir_nested(http: httpx.Client, sandbox: str) -> None:
    r = http.post(f"/sandboxes/{sandbox}/files/mkdir", json={"path": "a/b/c"})
    assert r.status_code == 200, r.text
    assert r.json()["path"] == "/workspace/a/b/c"
    assert listing(http, sandbox, "/workspace/a/b")["c"]["type"] == "directory"
    # Idempotent.
    assert http.post(f"/sandboxes/{sandbox}/files/mkdir", json={"path": "a/b/c"}).status_code == 200
    assert upload_b64(http, sandbox, "a/file", b"x").status_code == 200
    r = http.post(f"/sandboxes/{sandbox}/files/mkdir", json={"path": "a/file"})
    assert r.status_code == 409
    assert "a/file" in r.json()["detail"]


def test_remove_file_and_directories(http: httpx.Client, sandbox: str) -> None:
    run(http, sandbox, command="mkdir -p rm/full/deep rm/empty && echo x > rm/full/deep/f && "
                               "echo y > rm/file && ln -s /etc rm/full/etc-link")
    r = http.delete(f"/sandboxes/{sandbox}/files", params={"path": "rm/file"})
    assert r.status_code == 200, r.text
    assert r.json()["path"] == "/workspace/rm/file"
    assert get_raw(http, sandbox, "rm/file").status_code == 404
    r = http.delete(f"/sandboxes/{sandbox}/files", params={"path": "rm/full"})
    assert r.status_code == 409
    assert "recursive" in r.json()["detail"]
    assert "full" in listing(http, sandbox, "/workspace/rm")
    r = http.delete(f"/sandboxes/{sandbox}/files", params={"path": "rm/empty"})
    assert r.status_code == 200
    r = http.delete(f"/sandboxes/{sandbox}/files", params={"path": "rm/full", "recursive": True})
    assert r.status_code == 200, r.text
    assert listing(http, sandbox, "/workspace/rm") == {}
    # The symlinked directory's target was not followed.
    assert run(http, sandbox, command="test -f /etc/passwd && echo ok")["stdout"] == "ok\n"
    r = http.delete(f"/sandboxes/{sandbox}/files", params={"path": "rm/gone"})
    assert r.status_code == 404
    assert "rm/gone" in r.json()["detail"]


def test_download_missing_and_directory(http: httpx.Client, sandbox: str) -> None:
    for endpoint in ("/files", "/files/raw"):
        r = http.get(f"/sandboxes/{sandbox}{endpoint}", params={"path": "/workspace/missing.txt"})
        assert r.status_code == 404, (endpoint, r.text)
        assert "/workspace/missing.txt" in r.json()["detail"]
        r = http.get(f"/sandboxes/{sandbox}{endpoint}", params={"path": "/workspace"})
        assert r.status_code == 400, (endpoint, r.text)
        assert "directory" in r.json()["detail"]
    r = http.get("/sandboxes/no-such-sandbox/files/raw", params={"path": "x"})
    assert r.status_code == 404


def test_relative_paths_resolve_under_workspace(http: httpx.Client, sandbox: str) -> None:
    r = put_raw(http, sandbox, "rel/dir/../file.txt", b"relative")
    assert r.status_code == 200, r.text
    assert r.json()["path"] == "/workspace/rel/file.txt"
    assert run(http, sandbox, command="cat /workspace/rel/file.txt")["stdout"] == "relative"
    assert get_raw(http, sandbox, "rel/file.txt").content == b"relative"
    assert get_raw(http, sandbox, "/workspace/rel/file.txt").content == b"relative"


def test_upload_creates_parent_dirs(http: httpx.Client, sandbox: str) -> None:
    assert put_raw(http, sandbox, "/workspace/p/q/r/s.txt", b"deep").status_code == 200
    assert listing(http, sandbox, "/workspace/p/q")["r"]["type"] == "directory"
    assert run(http, sandbox, command="cat p/q/r/s.txt")["stdout"] == "deep"
    assert upload_b64(http, sandbox, "/tmp/x/y/z.txt", b"tmp").status_code == 200
    assert run(http, sandbox, command="cat /tmp/x/y/z.txt")["stdout"] == "tmp"
    # A parent that is a file, and a target that is a directory, are refused.
    r = put_raw(http, sandbox, "p/q/r/s.txt/child", b"x")
    assert r.status_code == 400, r.text
    r = put_raw(http, sandbox, "p/q", b"x")
    assert r.status_code == 400
    assert "directory" in r.json()["detail"]


@pytest.mark.parametrize("how", ["raw", "b64"])
def test_upload_with_mode_is_executable(http: httpx.Client, sandbox: str, how: str) -> None:
    script = b"#!/bin/sh\necho \"ran with $1\"\n"
    path = f"bin/tool-{how}.sh"
    r = (put_raw(http, sandbox, path, script, mode=0o755) if how == "raw"
         else upload_b64(http, sandbox, path, script, mode=0o755))
    assert r.status_code == 200, r.text
    assert run(http, sandbox, command=f"stat -c %a {path}")["stdout"] == "755\n"
    job = run(http, sandbox, argv=[f"./{path}", "arg"])
    assert (job["exit_code"], job["stdout"]) == (0, "ran with arg\n")
    r = put_raw(http, sandbox, "plain.sh", script, mode=0o600)
    assert run(http, sandbox, command="stat -c %a plain.sh")["stdout"] == "600\n"
    r = http.post(f"/sandboxes/{sandbox}/exec", json={"argv": ["./plain.sh"]})
    assert r.status_code == 400
    assert "plain.sh" in r.json()["detail"]


def test_aborted_upload_keeps_the_old_file(http: httpx.Client, sandbox: str,
                                           orchestrator: str) -> None:
    assert put_raw(http, sandbox, "keep/me.txt", b"original content").status_code == 200

    class Abort(Exception):
        pass

    def upload_begun(watcher: httpx.Client) -> bool:
        """A temporary file beside me.txt holds some of the upload."""
        files = listing(watcher, sandbox, "/workspace/keep")
        return any(f["size"] > 0 for name, f in files.items() if name != "me.txt")

    def body() -> Iterator[bytes]:
        for _ in range(8):
            yield b"x" * 65536
        # Abort once the first chunks have reached the sandbox (`http` is busy sending this).
        with httpx.Client(base_url=orchestrator, timeout=60) as watcher:
            assert wait_until(lambda: upload_begun(watcher)), "no upload reached the sandbox"
        raise Abort

    with pytest.raises(Abort):
        http.put(f"/sandboxes/{sandbox}/files/raw", params={"path": "keep/me.txt"},
                 content=body(), headers={"content-length": str(10 * MB)})
    assert get_raw(http, sandbox, "keep/me.txt").content == b"original content"
    # No temporary upload files are left behind once the agent notices.
    assert wait_until(lambda: set(listing(http, sandbox, "/workspace/keep")) == {"me.txt"}), \
        listing(http, sandbox, "/workspace/keep")


def test_rejected_uploads_do_not_desync_the_agent(http: httpx.Client, sandbox: str) -> None:
    """An upload refused before its body is read must not poison the next request."""
    run(http, sandbox, command="mkdir -p /workspace/adir && echo f > /workspace/afile")
    for i in range(5):
        r = put_raw(http, sandbox, "adir", b"body that the agent never reads %d" % i)
        assert r.status_code == 400, r.text
        assert "directory" in r.json()["detail"]
        r = put_raw(http, sandbox, "afile/child", b"x" * 1000)
        assert r.status_code == 400, r.text
        assert "not a directory" in r.json()["detail"]
        assert put_raw(http, sandbox, f"ok{i}.txt", b"fine").status_code == 200
        assert get_raw(http, sandbox, f"ok{i}.txt").content == b"fine"
        assert "adir" in listing(http, sandbox, "/workspace")


def test_special_files_download(http: httpx.Client, sandbox: str) -> None:
    """A FIFO is refused at once (opening it must not hang the agent's connection); files
    that report size 0 but have content, like those in /proc, come back whole."""
    run(http, sandbox, command="mkfifo /workspace/pipe")
    r = get_raw(http, sandbox, "/workspace/pipe")
    assert r.status_code == 400 and "not a regular file" in r.json()["detail"]
    version = get_raw(http, sandbox, "/proc/version")
    assert version.status_code == 200 and version.content.startswith(b"Linux version")
    # The connection is still in step: the next request gets its own answer.
    assert put_raw(http, sandbox, "after.txt", b"in step").status_code == 200
    assert get_raw(http, sandbox, "after.txt").content == b"in step"


def test_large_refused_upload_gets_the_agents_answer(http: httpx.Client, sandbox: str) -> None:
    """A streamed upload the agent refuses up front (100-continue is never sent) is not pushed
    through: the client sees the agent's 400, not a broken connection."""
    run(http, sandbox, command="mkdir -p /workspace/bigdir")

    def body() -> Iterator[bytes]:
        for _ in range(40):
            yield b"x" * (1 << 18)  # 10 MiB, far over what the agent would drain

    r = http.put(f"/sandboxes/{sandbox}/files/raw", params={"path": "bigdir"}, content=body())
    assert r.status_code == 400, r.text
    assert "directory" in r.json()["detail"]
    assert put_raw(http, sandbox, "fine.bin", b"ok").status_code == 200
