"""The sandbox's browser: a real headless Chromium, driven through the REST API and the SDK."""

from __future__ import annotations

import base64
import io
import shutil
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from orchard.env.client import InvalidRequest, Sandbox, SandboxClient
from orchard.rollout.traces.replay import replay
from orchard.rollout.traces.trace import build_trace
from tests.conftest import needs_browser, needs_root, wait_until
from tests.fakekube.cluster import FakeCluster
from tests.test_kubernetes_backend import create_ready, kube_orchestrator

pytestmark = [needs_root, needs_browser]

SHOP = """<!doctype html><html><head><title>Shop</title></head><body>
<h1>Shop</h1>
<form action="/search.html" method="get">
  <input name="q" aria-label="Search"><button type="submit">Search</button>
</form>
<input id="qty" aria-label="Quantity">
<button onclick="document.getElementById('out').textContent =
  'added ' + document.getElementById('qty').value">Add to cart</button>
<select aria-label="Size"><option>S</option><option>M</option></select>
<p id="out">cart empty</p>
<a href="/about.html">About us</a>
</body></html>"""
PAGES = {"index.html": SHOP,
         "search.html": "<title>Results</title><p>results page</p>",
         "about.html": "<title>About</title><h2>About us</h2><p>a small shop</p>"}


@pytest.fixture(scope="module")
def client(orchestrator: str) -> Iterator[SandboxClient]:
    with SandboxClient(orchestrator) as c:
        yield c


def wait_listening(sb: Sandbox, port: int) -> None:
    """Wait until something in the sandbox accepts connections on ``port`` (up to 30 s). One
    exec that waits inside: the event log (and so a replay) sees it succeed once."""
    wait = sb.exec("python3 -c \"import socket, time\n"
                   "for _ in range(600):\n"
                   f"    try: socket.create_connection(('127.0.0.1', {port}), 1).close(); break\n"
                   "    except OSError: time.sleep(0.05)\n"
                   "else: raise SystemExit('nothing listens')\"", timeout=60)
    assert wait.ok, f"nothing listened on port {port} in the sandbox: {wait.stderr}"


def serve_site(sb: Sandbox) -> str:
    for name, html in PAGES.items():
        sb.upload_content(html.encode(), f"/workspace/site/{name}")
    sb.start_process("python3 -m http.server 8000 --bind 127.0.0.1 --directory "
                     "/workspace/site")
    wait_listening(sb, 8000)
    return "http://127.0.0.1:8000/index.html"


def ids(tree: str) -> dict[str, int]:
    """'role "name"' -> id, from an observation's tree."""
    out = {}
    for line in tree.splitlines():
        line = line.strip()
        if line.startswith("["):
            number, _, rest = line[1:].partition("] ")
            out[rest.split(" value=")[0]] = int(number)
    return out


@pytest.fixture(scope="module")
def shop(client: SandboxClient) -> Iterator[tuple[Sandbox, str]]:
    session = f"browser-{uuid.uuid4().hex[:8]}"
    sb = client.create_sandbox(session=session, memory="2Gi")
    try:
        yield sb, serve_site(sb)
    finally:
        sb.delete()


def test_actions_change_the_page_and_the_tree_shows_it(shop: tuple[Sandbox, str]) -> None:
    sb, url = shop
    page = sb.browser("goto", url=url)
    assert (page.title, page.url, page.error) == ("Shop", url, None)
    found = ids(page.tree)
    assert {'heading "Shop"', 'textbox "Quantity"', 'button "Add to cart"',
            'combobox "Size"', 'link "About us"'} <= found.keys(), page.tree
    page = sb.browser("type", id=found['textbox "Quantity"'], text="3")
    assert 'textbox "Quantity" value="3"' in page.tree
    page = sb.browser("click", id=ids(page.tree)['button "Add to cart"'])
    assert '"added 3"' in page.tree and '"cart empty"' not in page.tree
    page = sb.browser("select", id=ids(page.tree)['combobox "Size"'], value="M")
    assert 'combobox "Size" value="M"' in page.tree
    # A form submitted with Enter navigates; back returns.
    page = sb.browser("type", id=ids(page.tree)['textbox "Search"'], text="shoes", submit=True)
    assert page.title == "Results" and page.url.endswith("/search.html?q=shoes"), page
    page = sb.browser("back")
    assert page.title == "Shop"


def test_a_stale_id_is_an_observation_not_an_error(shop: tuple[Sandbox, str]) -> None:
    sb, url = shop
    page = sb.browser("goto", url=url)
    page = sb.browser("click", id=ids(page.tree)['link "About us"'])
    assert page.title == "About" and page.error is None
    page = sb.browser("click", id=page.elements + 50)
    assert page.error is not None and "observe again" in page.error
    assert page.title == "About"  # nothing happened
    with pytest.raises(InvalidRequest, match="needs an element 'id'"):
        sb.browser("click")


def test_tabs_and_screenshots_with_marks(shop: tuple[Sandbox, str]) -> None:
    sb, url = shop
    sb.browser("goto", url=url)
    page = sb.browser("tab", op="new", url=url.replace("index", "about"))
    assert [t.title for t in page.tabs] == ["Shop", "About"]
    assert [t.active for t in page.tabs] == [False, True]
    page = sb.browser("tab", op="switch", index=0)
    assert page.title == "Shop"
    page = sb.browser("tab", op="close", index=1)
    assert len(page.tabs) == 1
    plain = sb.browser("observe", screenshot=True, marks=False)
    marked = sb.browser("observe", screenshot=True)
    for shot in (plain, marked):
        png = base64.b64decode(shot.screenshot_png_b64 or "")
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", png[16:24])
        assert width == 1280 and 600 <= height <= 800, (width, height)
    assert marked.screenshot_png_b64 != plain.screenshot_png_b64  # the marks are drawn
    assert sb.browser("observe").screenshot_png_b64 is None


def test_a_page_that_never_loads_times_out_within_the_budget(
        shop: tuple[Sandbox, str]) -> None:
    sb, _ = shop
    # Accepts connections and never answers.
    sb.start_process("python3 -c \"import socket, time; s = socket.socket(); "
                     "s.bind(('127.0.0.1', 8001)); s.listen(); time.sleep(600)\"")
    wait_listening(sb, 8001)
    budget = 3
    t0 = time.monotonic()
    page = sb.browser("goto", url="http://127.0.0.1:8001/", timeout=budget)
    took = time.monotonic() - t0
    assert page.error is not None and "loading" in page.error, page
    # A few budgets at most, not the 600 s the server holds the connection (a load that ignored
    # its budget would hit the client's read timeout of 2 budgets + 30 s instead).
    assert took < 10 * budget, took


def test_the_browser_restarts_after_it_died_and_lives_in_the_sandbox(
        shop: tuple[Sandbox, str]) -> None:
    sb, url = shop
    sb.browser("goto", url=url)

    def browsers() -> int:
        # argv, not a shell: a shell's own command line would match the pattern too.
        return int(sb.exec(["pgrep", "-c", "-f", "chromium.*remote-debugging-pipe"]).stdout)

    assert browsers() >= 1  # in the sandbox's own pid namespace, so in its cgroups
    sb.exec(["pkill", "-9", "-f", "chromium"])
    assert wait_until(lambda: browsers() == 0), "chromium outlived its SIGKILL"
    page = sb.browser("goto", url=url)
    assert page.title == "Shop" and page.error is None


def test_browser_actions_are_events_and_replay(client: SandboxClient) -> None:
    session = f"browse-{uuid.uuid4().hex[:8]}"
    with client.create_sandbox(session=session, memory="2Gi") as sb:
        page = sb.browser("goto", url=serve_site(sb))
        sb.browser("click", id=ids(page.tree)['link "About us"'])
        sb.browser("click", id=999)  # an error is part of what is replayed
        events = client.events(session=session)
    browsing = [e for e in events if e.kind.value == "browser"]
    assert [e.data["action"] for e in browsing] == ["goto", "click", "click"]
    assert browsing[1].data["page_url"].endswith("/about.html")
    assert browsing[2].data["error"] and "tree_sha256" in browsing[2].data
    report = replay(build_trace(session, [], events), client)
    assert report.diverged == 0 and report.skipped == 0, [
        (s.kind.value, s.detail) for s in report.steps if s.status != "matched"]
    assert sum(s.kind.value == "browser" for s in report.steps) == 3


def busybox_rootfs(path: Path) -> str:
    """An image with no libc, no Python and no Chromium: a static busybox."""
    (path / "bin").mkdir(parents=True)
    busybox = shutil.which("busybox")
    assert busybox is not None
    shutil.copy(busybox, path / "bin" / "busybox")
    for tool in ("sh", "ls"):
        (path / "bin" / tool).symlink_to("busybox")
    return str(path)


def test_an_image_without_chromium_gets_the_hosts(client: SandboxClient, tmp_path: Path
                                                  ) -> None:
    html = ("data:text/html;charset=utf-8,<title>Menu</title><h1>Caf%C3%A9 menu</h1>"
            "<a href='%23tea'>Tea</a><input aria-label='Name'>")
    with client.create_sandbox(busybox_rootfs(tmp_path / "rootfs")) as sb:
        assert "No such file" in sb.exec("ls /usr/lib/chromium /lib").stderr
        page = sb.browser("goto", url=html, screenshot=True)
        assert page.error is None and page.title == "Menu", page
        assert '"Café menu"' in page.tree and 'textbox "Name"' in page.tree
        typed = sb.browser("type", id=ids(page.tree)['textbox "Name"'], text="Ada")
        assert 'textbox "Name" value="Ada"' in typed.tree
        # The carried-in fonts drew the heading: without them it has no dark pixels.
        shot = sb.browser("observe", screenshot=True, marks=False).screenshot_png_b64
        heading = Image.open(io.BytesIO(base64.b64decode(shot or ""))).convert("L").crop(
            (0, 0, 400, 60))
        assert sum(heading.histogram()[:100]) > 300  # dark pixels


def test_without_any_chromium_the_error_says_what_to_do(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    from orchard.env.agent.server import devtools
    from orchard.env.agent.server.common import HTTPError

    monkeypatch.setattr(devtools, "INJECTED", str(tmp_path / "absent"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(HTTPError) as caught:
        devtools.find_chromium()
    assert caught.value.status == 400 and "install Debian's chromium" in str(caught.value)


def test_the_browser_on_kubernetes(fake_cluster: FakeCluster) -> None:
    """The same route and observation through the Kubernetes backend: the action goes to the
    pod's agent and its Chromium runs in the pod (the fake kubelet runs each pod as a local
    sandbox; on a real cluster the pod's image brings the Chromium)."""
    with kube_orchestrator(fake_cluster) as http:
        sid = create_ready(http, fake_cluster.api)
        try:
            html = "data:text/html,<title>Pod</title><button>Go</button>"
            r = http.post(f"/sandboxes/{sid}/browser", json={"action": "goto", "url": html})
            assert r.status_code == 200, r.text
            assert r.json()["title"] == "Pod" and 'button "Go"' in r.json()["tree"]
            r = http.post(f"/sandboxes/{sid}/browser", json={"action": "click", "id": 99})
            assert r.status_code == 200 and "99" in r.json()["error"], r.text
            kinds = [e["kind"] for e in http.get(f"/sandboxes/{sid}/events").json()["events"]]
            assert kinds.count("browser") == 2, kinds
        finally:
            http.delete(f"/sandboxes/{sid}")
