"""Browser tests for the web console: Playwright driving the host's Debian Chromium.

A pytest plugin (conftest.py loads it) with two fixtures, ``browser`` (one Chromium for the
session) and ``browser_page`` (a fresh context and page per test), and three helpers:
``save_screenshot``, ``check_accessibility`` (axe-core, WCAG 2 A and AA) and ``check_keyboard``.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from orchard.env.agent.browser_bundle import host_chromium

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

REPO = Path(__file__).resolve().parent.parent
AXE = Path(__file__).parent / "assets" / "axe.min.js"
VIEWPORT = {"width": 1280, "height": 900}
# axe's impact levels, mildest first.
IMPACTS = ("minor", "moderate", "serious", "critical")

# One step of the Tab walk: what has focus (inside shadow roots too), which of the wanted
# selectors it matches, whether its focus indicator can be seen, and whether the walk has come
# back to its first stop. Plain data only, so that one evaluate call does the whole step.
FOCUS_JS = """selectors => {
  let el = document.activeElement;
  while (el && el.shadowRoot && el.shadowRoot.activeElement) el = el.shadowRoot.activeElement;
  if (!el || el === document.body || el === document.documentElement) return null;
  const walk = window.__tabWalk;
  if (walk.first === el) return {wrapped: true};
  walk.first = walk.first || el;
  const style = getComputedStyle(el);
  const name = el.getAttribute('aria-label') || (el.labels && el.labels[0]
    && el.labels[0].textContent) || el.textContent || el.title || el.value || '';
  return {
    wrapped: false,
    label: `<${el.tagName.toLowerCase()}${el.id ? '#' + el.id : ''}> `
      + JSON.stringify(name.trim().replace(/\\s+/g, ' ').slice(0, 40)),
    matches: selectors.filter(s => el.matches(s)),
    visible: (style.outlineStyle !== 'none' && parseFloat(style.outlineWidth) > 0)
      || style.boxShadow !== 'none',
  };
}"""


def artifacts_dir() -> Path:
    """Where screenshots go: CI collects ``$ORCHARD_TEST_ARTIFACTS``; locally a gitignored dir."""
    path = Path(os.environ.get("ORCHARD_TEST_ARTIFACTS") or REPO / "test-artifacts" / "console")
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_screenshot(page: Page, name: str) -> Path:
    """Save a full-page PNG of ``page`` as a test artifact and return its path."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "screenshot"
    path = artifacts_dir() / (stem if stem.endswith(".png") else stem + ".png")
    page.screenshot(path=str(path), full_page=True)
    return path


def check_accessibility(page: Page, min_impact: str = "serious") -> None:
    """Fail if axe-core finds WCAG 2 A/AA violations of ``min_impact`` or worse on the page.

    That covers form labels, names of buttons and links, colour contrast, document language
    and title, ARIA use. Run it after each state worth checking (a dialog open, a table full)."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        # Evaluated through DevTools, not added as a <script> tag: a page's Content Security
        # Policy (script-src 'self') blocks inline script tags, but not this.
        page.evaluate(AXE.read_text())
    results = page.evaluate("""() => axe.run(document, {
        runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa']}, resultTypes: ['violations']})""")
    worst = IMPACTS[IMPACTS.index(min_impact):]
    found = [v for v in results["violations"] if v.get("impact") in worst]
    if found:
        lines = [f"  {v['id']} ({v['impact']}): {v['help']}; at "
                 + ", ".join(" ".join(map(str, n["target"])) for n in v["nodes"][:3])
                 + (f" and {len(v['nodes']) - 3} more" if len(v["nodes"]) > 3 else "")
                 for v in found]
        raise AssertionError(f"accessibility violations on {page.url}:\n" + "\n".join(lines))


def check_keyboard(page: Page, must_reach: list[str], max_presses: int = 200,
                   visible_focus: bool = True) -> list[str]:
    """Tab through the page from its top and fail unless every selector in ``must_reach``
    gets focus, and (with ``visible_focus``) every element that got focus showed an outline
    or box-shadow. Returns the focus order, one label per element, for further asserts."""
    for selector in must_reach:
        assert page.locator(selector).count(), f"nothing on {page.url} matches {selector!r}"
    # Start the walk from the top, whatever had focus before: focus a throwaway element
    # placed first in the body, so that the first Tab goes to the page's first stop.
    page.evaluate("""() => { window.__tabWalk = {first: null};
        const s = document.createElement('span'); s.id = '__tab_start'; s.tabIndex = -1;
        document.body.prepend(s); s.focus(); }""")
    order: list[str] = []
    reached: set[str] = set()
    unseen_focus: list[str] = []
    off_page = 0
    try:
        for _ in range(max_presses):
            page.keyboard.press("Tab")
            step = page.evaluate(FOCUS_JS, must_reach)
            if step is None:  # focus went to the browser's own UI; the next Tab comes back
                off_page += 1
                if off_page > 2:
                    break  # nothing on the page takes focus
                continue
            if step["wrapped"]:
                break  # every stop has been seen
            order.append(step["label"])
            reached.update(step["matches"])
            if not step["visible"]:
                unseen_focus.append(step["label"])
    finally:
        page.evaluate("() => { document.getElementById('__tab_start')?.remove();"
                      " delete window.__tabWalk; }")
    missing = [s for s in must_reach if s not in reached]
    problems = [f"  never focused by Tab: {', '.join(missing)}"] if missing else []
    if visible_focus and unseen_focus:
        problems.append(f"  focused without a visible outline: {', '.join(unseen_focus)}")
    assert not problems, (f"keyboard navigation on {page.url}:\n" + "\n".join(problems)
                          + f"\n  Tab order was: {'; '.join(order) or '(nothing took focus)'}")
    return order


@pytest.fixture(scope="session")
def chromium_session() -> Iterator[tuple[Browser, asyncio.AbstractEventLoop]]:
    """The host's Chromium under Playwright, started once and closed at the session's end.

    Playwright's sync API marks its own event loop as the thread's running loop, and while
    that mark stands, async tests and asyncio.run() fail. So the mark is taken off between
    browser tests and put back by ``browser`` for each one (Playwright calls need it)."""
    from playwright.sync_api import Error, sync_playwright

    # ORCHARD_TEST_CHROMIUM names another binary (not a wrapper script) on other systems.
    executable = os.environ.get("ORCHARD_TEST_CHROMIUM") or host_chromium()
    if executable is None:
        pytest.fail("no Chromium: install Debian's chromium package (`make test` does)",
                    pytrace=False)
    playwright = sync_playwright().start()
    loop = asyncio.get_running_loop()
    try:
        # No Chromium sandbox (--no-sandbox): tests run as root, where Chromium refuses it.
        browser = playwright.chromium.launch(executable_path=str(executable),
                                             chromium_sandbox=False)
    except Error as e:
        playwright.stop()
        pytest.fail(f"Chromium at {executable} did not start under Playwright: {e}",
                    pytrace=False)
    asyncio._set_running_loop(None)
    try:
        yield browser, loop
    finally:
        asyncio._set_running_loop(loop)
        browser.close()
        playwright.stop()  # also ends Playwright's node driver, and takes the mark off


@pytest.fixture()
def browser(chromium_session: tuple[Browser, asyncio.AbstractEventLoop]) -> Iterator[Browser]:
    """The session's Chromium, for a (sync) test that makes its own contexts and pages."""
    browser, loop = chromium_session
    asyncio._set_running_loop(loop)
    try:
        yield browser
    finally:
        asyncio._set_running_loop(None)


@pytest.fixture()
def browser_page(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A fresh page (own cookies and storage) in a 1280x900 viewport. A failed test leaves a
    screenshot ``<test name>-failed.png`` among the artifacts."""
    context = browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
    page = context.new_page()
    # Fail in seconds, not Playwright's default 30, when a selector never shows up.
    page.set_default_timeout(10_000)
    try:
        yield page
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed and not page.is_closed():
            save_screenshot(page, f"{request.node.name}-failed")
    finally:
        context.close()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
        item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep the call phase's report on the test item, for ``browser_page`` to see a failure."""
    report = yield
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report
