"""The web console's sandbox pages over real HTTP, against an orchestrator with an API key and
real sandboxes (the browser-driven tests are in test_console_browser.py)."""

from __future__ import annotations

import html as html_module
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchard import SandboxClient
from orchard.console import mount_console
from tests.conftest import dedicated_orchestrator, needs_root, wait_until

KEY = "console-test-key"
FORM = {"content-type": "application/x-www-form-urlencoded"}
HX = {**FORM, "hx-request": "true"}


def with_console(app, settings) -> None:
    mount_console(app, settings.api_keys)


@pytest.fixture(scope="module")
def console_url(data_dir: Path, orchestrator: str) -> Iterator[str]:
    # After the session's orchestrator, whose interpreter bundle this one reuses.
    with dedicated_orchestrator(data_dir, api_keys=[KEY], extend=with_console) as url:
        yield url


@pytest.fixture()
def web(console_url: str) -> Iterator[httpx.Client]:
    """A visitor who has logged in: the cookie the login form set carries the key."""
    with httpx.Client(base_url=console_url, timeout=60) as c:
        answer = c.post("/ui/login", content="key=" + KEY, headers=FORM)
        assert answer.status_code == 303 and "orchard_key" in c.cookies
        yield c


@pytest.fixture()
def sdk(console_url: str) -> Iterator[SandboxClient]:
    with SandboxClient(console_url, api_key=KEY) as client:
        yield client


def text_of(html: str) -> str:
    return html_module.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)))


@needs_root
def test_login_sets_a_cookie_that_the_pages_and_the_api_take(console_url: str) -> None:
    with httpx.Client(base_url=console_url) as c:
        first = c.get("/ui/sandboxes?label=a=b")
        assert first.status_code == 303
        assert first.headers["location"] == "/ui/login?next=/ui/sandboxes%3Flabel%3Da%3Db"
        assert c.get("/sandboxes").status_code == 401  # no key, no cookie
        wrong = c.post("/ui/login", content="key=nope&next=/ui/images", headers=FORM)
        assert wrong.status_code == 403 and "check the key and try again" in wrong.text
        assert "orchard_key" not in c.cookies
        right = c.post("/ui/login", content=f"key={KEY}&next=/ui/images", headers=FORM)
        assert right.status_code == 303 and right.headers["location"] == "/ui/images"
        cookie = right.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        assert c.get("/ui/images").status_code == 200
        assert c.get("/sandboxes").status_code == 200  # the API takes the cookie too
        # htmx asks for fragments: without a login it is told where to go, not sent a page.
        c.post("/ui/logout")
        fragment = c.get("/ui/sandboxes/rows", headers={"hx-request": "true"})
        assert fragment.status_code == 401 and fragment.headers["hx-redirect"].startswith(
            "/ui/login?next=")


@needs_root
def test_login_only_sends_back_to_console_pages(console_url: str) -> None:
    with httpx.Client(base_url=console_url) as c:
        for target in ("//elsewhere/ui", "/docs", "javascript:alert(1)"):
            answer = c.post("/ui/login", content=f"key={KEY}&next={target}", headers=FORM)
            assert answer.headers["location"] == "/ui/sandboxes", target


@needs_root
def test_the_list_shows_use_and_filters(web: httpx.Client, sdk: SandboxClient) -> None:
    a = sdk.create_sandbox("host", labels={"team": "red"}, session="roll-1")
    b = sdk.create_sandbox("host", labels={"team": "blue"})
    try:
        a.exec("head -c 3000000 /dev/urandom > /workspace/blob")
        page = text_of(web.get("/ui/sandboxes").text)
        assert a.id in page and b.id in page and "team=red" in page and "roll-1" in page
        row = text_of(web.get("/ui/sandboxes/rows", params={"label": "team=red"}).text)
        assert a.id in row and b.id not in row
        # Its use is read from its cgroups and its writable layer.
        assert re.search(r"running host \S+ s \S+ \S+ [\d.]+ s [\d.]+ [KM]iB 2\.\d MiB", row), row
        assert b.id in text_of(web.get("/ui/sandboxes", params={"label": "team=blue"}).text)
        by_session = text_of(web.get("/ui/sandboxes", params={"session": "roll-1"}).text)
        assert a.id in by_session and b.id not in by_session
        bad = web.get("/ui/sandboxes", params={"label": "team"})
        assert bad.status_code == 400 and "has no '='" in text_of(bad.text)
    finally:
        a.delete()
        b.delete()


@needs_root
def test_actions_on_a_sandbox(web: httpx.Client, sdk: SandboxClient) -> None:
    sb = sdk.create_sandbox("host", labels={"who": "console"})
    base = f"/ui/sandboxes/{sb.id}"
    ran = web.post(f"{base}/exec", content="command=echo+from-the-console+%26%26+exit+3",
                   headers=HX)
    assert "from-the-console" in ran.text and "exit 3" in ran.text
    assert "type a command" in web.post(f"{base}/exec", content="command=", headers=HX).text
    page = text_of(web.get(base).text)
    assert "echo from-the-console && exit 3 → exit 3" in page  # the exec is in its events
    shot = web.post(f"{base}/snapshot", content="", headers=HX).text
    snapshot_id = re.search(r"Snapshot <span class=\"mono\">(\S+)</span> taken", shot)[1]
    assert snapshot_id in web.get("/ui/snapshots").text
    forked = web.post(f"{base}/fork", content="count=2", headers=HX).text
    forks = re.findall(r'href="/ui/sandboxes/(sb-[0-9a-f]+)"', forked)
    assert len(forks) == 2 and all(sdk.get_sandbox(f).info.labels["who"] == "console"
                                   for f in forks)
    too_many = web.post(f"{base}/fork", content="count=99", headers=HX).text
    assert "give a whole number from 1 to 16" in too_many
    paused = web.post(f"{base}/pause", headers=HX)
    assert paused.headers["hx-refresh"] == "true" and sdk.get_sandbox(sb.id).info.status == "paused"
    assert "Resume" in web.get(base).text
    web.post(f"{base}/resume", headers=HX)
    assert sdk.get_sandbox(sb.id).info.status == "running"
    gone = web.post(f"{base}/delete", headers=HX)
    assert gone.headers["hx-redirect"] == "/ui/sandboxes"
    wait_until(lambda: sdk.get_sandbox(sb.id).info.status == "deleted")
    dead = web.get(base)  # a dead sandbox still has a page: no actions, its events
    assert dead.status_code == 200 and "deleted" in dead.text and "Run</button>" not in dead.text
    again = web.post(f"{base}/exec", content="command=true", headers=HX)
    assert 'role="alert"' in again.text and sb.id in again.text
    for f in forks:
        sdk.delete_sandbox(f)
    web.post(f"/ui/snapshots/{snapshot_id}/delete", headers=HX)
    assert snapshot_id not in web.get("/ui/snapshots").text


@needs_root
def test_the_files_browser(web: httpx.Client, sdk: SandboxClient) -> None:
    sb = sdk.create_sandbox("host")
    try:
        sb.exec("mkdir -p /workspace/src && echo 'print(1)' > /workspace/src/a.py && "
                "head -c 400000 /dev/zero | tr '\\0' x > /workspace/big.txt && "
                "printf 'a\\0b' > /workspace/bin")
        base = f"/ui/sandboxes/{sb.id}"
        top = text_of(web.get(f"{base}/files", params={"path": "/workspace"}).text)
        assert "src/" in top and "big.txt" in top and "390.6 KiB" in top
        inner = web.get(f"{base}/files", params={"path": "/workspace/src"}).text
        assert "a.py" in inner and "Up to /workspace" in inner
        assert "print(1)" in web.get(f"{base}/file", params={"path": "/workspace/src/a.py"}).text
        big = text_of(web.get(f"{base}/file", params={"path": "/workspace/big.txt"}).text)
        assert "only the first 256 KiB are shown" in big
        assert "A binary file" in web.get(f"{base}/file", params={"path": "/workspace/bin"}).text
        missing = web.get(f"{base}/files", params={"path": "/workspace/nope"})
        assert missing.status_code == 404 and "nope" in missing.text
    finally:
        sb.delete()


@needs_root
def test_unknown_ids_get_a_page_that_says_so(web: httpx.Client) -> None:
    page = web.get("/ui/sandboxes/sb-000000000000")
    assert page.status_code == 404 and "no sandbox" in page.text and "Traceback" not in page.text
    assert web.post("/ui/sandboxes/sb-000000000000/frobnicate", headers=HX).text.count("alert")
    for path in ("/ui/snapshots", "/ui/pools", "/ui/images", "/ui/metrics"):
        assert web.get(path).status_code == 200, path


@needs_root
def test_usage_counts_what_a_sandbox_uses(sdk: SandboxClient) -> None:
    sb = sdk.create_sandbox("host")
    try:
        before = sb.usage()
        assert before.memory_bytes and before.pids and before.cpu_seconds is not None
        sb.exec("head -c 8000000 /dev/urandom > /workspace/f; "
                "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done")
        after = sb.usage()
        assert after.disk_bytes - before.disk_bytes >= 8_000_000
        assert after.cpu_seconds > before.cpu_seconds + 0.05
    finally:
        sb.delete()
    with pytest.raises(Exception, match="only a running or paused sandbox"):
        sb.usage()


@needs_root
def test_the_console_is_off_unless_mounted(orchestrator: str) -> None:
    assert httpx.get(f"{orchestrator}/ui/sandboxes").status_code == 404
