"""The browser harness itself: it passes an accessible page and fails one with known faults."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from playwright.sync_api import Page

from tests.browser_harness import check_accessibility, check_keyboard, save_screenshot

# A strict Content Security Policy, as the console may send: no inline scripts, yet axe
# must get in.
GOOD = """<!doctype html><html lang="en"><head><title>Sandboxes</title>
<meta http-equiv="Content-Security-Policy" content="script-src 'self'">
<script src="/good.js" defer></script>
<style>:focus-visible { outline: 3px solid #1a56db; outline-offset: 2px; }</style></head>
<body><main><h1>Sandboxes</h1>
<label for="q">Filter</label> <input id="q" name="q">
<button id="refresh">Refresh</button>
<a id="rollouts" href="/bad.html">Rollouts</a>
<p id="out">3 sandboxes</p></main></body></html>"""

# Each fault is one the checks must name: an unlabelled input (label), grey on grey text
# (color-contrast), a button without a name (button-name), a div that only a mouse can use,
# and a button whose focus outline is turned off.
BAD = """<!doctype html><html lang="en"><head><title>Broken</title>
<style>.pale { color: #999; background: #aaa; } #quiet:focus { outline: none; }</style></head>
<body><main><h1>Broken</h1>
<input id="nolabel" type="text">
<p id="pale" class="pale">hard to read</p>
<button id="noname"></button>
<div id="fake" onclick="this.textContent = 'clicked'">Delete</div>
<button id="quiet">Quiet</button></main></body></html>"""

GOOD_JS = """document.getElementById('refresh').addEventListener('click',
  () => { document.getElementById('out').textContent = 'refreshed'; });"""

PAGES = {"/good.html": GOOD, "/good.js": GOOD_JS, "/bad.html": BAD}


class Pages(BaseHTTPRequestHandler):
    """Serves PAGES from memory: no files to leave behind."""

    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        body = PAGES.get(self.path)
        self.send_response(200 if body else 404)
        kind = "text/javascript" if self.path.endswith(".js") else "text/html"
        self.send_header("Content-Type", f"{kind}; charset=utf-8")
        self.end_headers()
        self.wfile.write((body or "not found").encode())

    def log_message(self, *args: object) -> None:  # keep pytest's output clean
        pass


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    """Base URL of a loopback HTTP server with the two pages."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Pages)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def test_good_page_passes_and_clicks_work(browser_page: Page, site: str) -> None:
    page = browser_page
    page.goto(f"{site}/good.html")
    page.get_by_role("button", name="Refresh").click()
    assert page.locator("#out").text_content() == "refreshed"
    check_accessibility(page)
    order = check_keyboard(page, ["#q", "#refresh", "#rollouts"])
    assert order[0].startswith("<input#q>") and len(order) == 3, order


def test_bad_page_fails_axe_with_the_rule_ids(browser_page: Page, site: str) -> None:
    browser_page.goto(f"{site}/bad.html")
    with pytest.raises(AssertionError) as failed:
        check_accessibility(browser_page)
    message = str(failed.value)
    for rule in ("label", "color-contrast", "button-name"):
        assert f"  {rule} (" in message, message
    assert "#nolabel" in message and "#noname" in message and "#pale" in message, message


def test_bad_page_fails_the_keyboard_check(browser_page: Page, site: str) -> None:
    browser_page.goto(f"{site}/bad.html")
    with pytest.raises(AssertionError) as failed:
        check_keyboard(browser_page, ["#nolabel", "#fake", "#quiet"])
    message = str(failed.value)
    assert "never focused by Tab: #fake" in message, message
    assert 'focused without a visible outline: <button#quiet> "Quiet"' in message, message
    assert "#nolabel" not in message.split("Tab order was")[0], message
    with pytest.raises(AssertionError, match="nothing on .* matches '#absent'"):
        check_keyboard(browser_page, ["#absent"])


def test_save_screenshot_writes_a_png(browser_page: Page, site: str, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHARD_TEST_ARTIFACTS", str(tmp_path))
    browser_page.goto(f"{site}/good.html")
    path = save_screenshot(browser_page, "sandboxes list")
    assert path == tmp_path / "sandboxes_list.png"
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5_000, len(data)
    # The IHDR chunk holds the size: the viewport's width, at least its height (full page).
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width == 1280 and height >= 900, (width, height)


async def test_async_tests_still_run_after_browser_tests() -> None:
    # Playwright's sync API marks its loop as running; the harness must take that off
    # between browser tests, or this test and every asyncio.run() after them would fail.
    await asyncio.sleep(0)
    assert asyncio.run_coroutine_threadsafe is not None


def test_asyncio_run_still_works_after_browser_tests() -> None:
    assert asyncio.run(asyncio.sleep(0, result="ok")) == "ok"
