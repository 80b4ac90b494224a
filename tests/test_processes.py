"""Background processes through the real REST API: start, list, poll output, reach, kill."""

from __future__ import annotations

import base64
import time

import httpx

from tests.conftest import needs_root, run, wait_until

pytestmark = needs_root


def start(http: httpx.Client, sid: str, **body: object) -> dict:
    info = run(http, sid, background=True, **body)
    assert info["running"] is True, info
    assert info["sandbox_id"] == sid
    return info


def get(http: httpx.Client, sid: str, pid: str) -> dict:
    r = http.get(f"/sandboxes/{sid}/processes/{pid}")
    assert r.status_code == 200, r.text
    return r.json()


def alive_args(http: httpx.Client, sid: str) -> list[str]:
    """Command lines of the live (non-zombie) processes in the sandbox."""
    out = run(http, sid, argv=["ps", "-eo", "stat=,args="])["stdout"]
    return [line.split(None, 1)[1] for line in out.splitlines()
            if len(line.split(None, 1)) == 2 and not line.lstrip().startswith("Z")]


def test_http_server_in_background(http: httpx.Client, sandbox: str) -> None:
    # A child of the server's shell too, to prove DELETE kills the whole tree.
    cmd = "sleep 2001 & exec python3 -m http.server 8080 --bind 127.0.0.1"
    info = start(http, sandbox, command=cmd)
    pid = info["process_id"]
    assert info["command"] == cmd
    assert info["pid"] > 1 and info["exit_code"] is None
    listing = http.get(f"/sandboxes/{sandbox}/processes").json()["processes"]
    assert [p["process_id"] for p in listing] == [pid]
    assert listing[0]["running"] is True

    fetch = ("import urllib.request; "
             "print(urllib.request.urlopen('http://127.0.0.1:8080/', timeout=2).status)")

    def reachable() -> bool:
        job = run(http, sandbox, argv=["python3", "-c", fetch])
        return job["exit_code"] == 0 and job["stdout"] == "200\n"

    assert wait_until(reachable, timeout=15, interval=0.2), "server never answered in-sandbox"
    curl = run(http, sandbox, command="curl -s -o /dev/null -w '%{http_code}' "
                                      "http://127.0.0.1:8080/")
    assert curl["stdout"] == "200"
    # The server logs requests on stderr: visible through the output endpoint.
    out = http.get(f"/sandboxes/{sandbox}/processes/{pid}/output").json()
    assert b"GET / HTTP/1.1" in base64.b64decode(out["stderr_b64"])
    assert any(a.startswith("sleep 2001") for a in alive_args(http, sandbox))

    r = http.delete(f"/sandboxes/{sandbox}/processes/{pid}")
    assert r.status_code == 200, r.text
    assert r.json()["process_id"] == pid
    assert wait_until(lambda: get(http, sandbox, pid)["running"] is False, timeout=10)
    final = get(http, sandbox, pid)
    assert final["exit_code"] == 137, final  # SIGKILL
    args = alive_args(http, sandbox)
    assert not any("http.server" in a or a.startswith("sleep 2001") for a in args), args
    assert not reachable()
    listing = http.get(f"/sandboxes/{sandbox}/processes").json()["processes"]
    assert [(p["process_id"], p["running"]) for p in listing] == [(pid, False)]


def test_output_polling_by_offset(http: httpx.Client, sandbox: str) -> None:
    info = start(http, sandbox, command="for i in 1 2 3 4 5 6; do echo line$i; "
                                        "echo err$i >&2; sleep 0.2; done; exit 4")
    pid = info["process_id"]
    url = f"/sandboxes/{sandbox}/processes/{pid}/output"
    seen, errs = b"", b""
    offsets = {"stdout_offset": 0, "stderr_offset": 0}
    polls = 0
    while True:
        out = http.get(url, params=offsets).json()
        chunk = base64.b64decode(out["stdout_b64"])
        # New bytes only: each poll starts exactly where the previous one ended.
        assert out["stdout_offset"] == offsets["stdout_offset"] + len(chunk)
        assert out["stdout_dropped"] == 0
        seen += chunk
        errs += base64.b64decode(out["stderr_b64"])
        offsets = {"stdout_offset": out["stdout_offset"], "stderr_offset": out["stderr_offset"]}
        polls += 1
        if not out["running"]:
            break
        assert polls < 600, "still running after a minute of polls"
        time.sleep(0.1)
    assert seen == b"".join(b"line%d\n" % i for i in range(1, 7))
    assert errs == b"".join(b"err%d\n" % i for i in range(1, 7))
    assert out["exit_code"] == 4
    # Re-reading from 0 gives everything again; past the end gives nothing.
    again = http.get(url).json()
    assert base64.b64decode(again["stdout_b64"]) == seen
    tail = http.get(url, params={"stdout_offset": len(seen)}).json()
    assert tail["stdout_b64"] == "" and tail["stdout_offset"] == len(seen)
    middle = http.get(url, params={"stdout_offset": 6}).json()
    assert base64.b64decode(middle["stdout_b64"]) == seen[6:]


def test_killing_one_process_spares_the_others(http: httpx.Client, sandbox: str) -> None:
    """Process ids share a prefix ('p2-1' vs 'p2-10'): a kill must match the exact id."""
    first = start(http, sandbox, command="sleep 3001")
    other = None
    for _ in range(200):
        info = start(http, sandbox, command="sleep 3002")
        if info["process_id"].startswith(first["process_id"]):
            other = info
            break
        http.delete(f"/sandboxes/{sandbox}/processes/{info['process_id']}")
    assert other is not None, "never got an id that extends the first one"
    r = http.delete(f"/sandboxes/{sandbox}/processes/{first['process_id']}")
    assert r.status_code == 200
    assert wait_until(lambda: not get(http, sandbox, first["process_id"])["running"], timeout=10)
    assert get(http, sandbox, other["process_id"])["running"] is True
    assert "sleep 3002" in alive_args(http, sandbox)


def test_process_exit_is_reported(http: httpx.Client, sandbox: str) -> None:
    # It may already have exited when the start call returns: no `running` check here.
    pid = run(http, sandbox, background=True, argv=["sh", "-c", "echo bye; exit 9"])["process_id"]
    assert wait_until(lambda: not get(http, sandbox, pid)["running"], timeout=10)
    assert get(http, sandbox, pid)["exit_code"] == 9
    out = http.get(f"/sandboxes/{sandbox}/processes/{pid}/output").json()
    assert base64.b64decode(out["stdout_b64"]) == b"bye\n"
    assert (out["running"], out["exit_code"]) == (False, 9)


def test_background_start_errors(http: httpx.Client, sandbox: str) -> None:
    r = http.post(f"/sandboxes/{sandbox}/exec",
                  json={"argv": ["no-such-daemon-xyz"], "background": True})
    assert r.status_code == 400
    assert "no-such-daemon-xyz" in r.json()["detail"]
    r = http.post(f"/sandboxes/{sandbox}/exec",
                  json={"command": "true", "background": True, "cwd": "/missing/dir"})
    assert r.status_code == 400
    assert "/missing/dir" in r.json()["detail"]


def test_unknown_process_is_404(http: httpx.Client, sandbox: str) -> None:
    for method, suffix in (("GET", ""), ("GET", "/output"), ("DELETE", "")):
        r = http.request(method, f"/sandboxes/{sandbox}/processes/p-nope{suffix}")
        assert r.status_code == 404, (method, suffix, r.text)
        assert "p-nope" in r.json()["detail"]
    r = http.get("/sandboxes/no-such-sandbox/processes")
    assert r.status_code == 404
