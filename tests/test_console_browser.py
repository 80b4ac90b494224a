"""The web console in a real browser: Chromium (under Playwright) logs in, opens real
sandboxes, runs a command, types in the terminal, forks and deletes, and every page passes
an accessibility check. Screenshots are saved as test artifacts."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from orchard import SandboxClient
from orchard.console import mount_console
from tests.browser_harness import check_accessibility, check_keyboard, save_screenshot
from tests.conftest import dedicated_orchestrator, needs_browser, needs_root, wait_until

KEY = "browser-test-key"


@pytest.fixture(scope="module")
def console_url(data_dir: Path, orchestrator: str) -> Iterator[str]:
    # After the session's orchestrator, whose interpreter bundle this one reuses.
    with dedicated_orchestrator(
            data_dir, api_keys=[KEY],
            extend=lambda app, settings: mount_console(app, settings.api_keys)) as url:
        yield url


@pytest.fixture()
def sdk(console_url: str) -> Iterator[SandboxClient]:
    with SandboxClient(console_url, api_key=KEY) as client:
        yield client


def log_in(page: Page, url: str, then: str = "/ui/sandboxes") -> None:
    page.goto(f"{url}{then}")
    expect(page).to_have_url(re.compile(r"/ui/login\?next="))
    check_accessibility(page)
    page.get_by_label("API key").fill(KEY)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(f"{url}{then}")


@needs_root
@needs_browser
def test_a_wrong_key_is_told_and_the_right_one_lets_in(browser_page: Page,
                                                       console_url: str) -> None:
    page = browser_page
    page.goto(f"{console_url}/ui/login")
    page.get_by_label("API key").fill("wrong")
    page.get_by_label("API key").press("Enter")
    expect(page.get_by_role("alert")).to_contain_text("invalid API key")
    save_screenshot(page, "console-login-refused")
    check_accessibility(page)
    log_in(page, console_url, "/ui/snapshots")
    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(f"{console_url}/ui/login")


@needs_root
@needs_browser
def test_sandboxes_list_and_a_sandbox_page(browser_page: Page, console_url: str,
                                           sdk: SandboxClient) -> None:
    page = browser_page
    sb = sdk.create_sandbox("host", labels={"run": "browser-test"}, session="rollout-7")
    other = sdk.create_sandbox("host", labels={"run": "other"})
    try:
        sb.exec("mkdir -p /workspace/src && printf 'def add(a, b):\\n    return a + b\\n' "
                "> /workspace/src/calc.py && head -c 1500000 /dev/urandom > /workspace/data")
        log_in(page, console_url)
        rows = page.locator("#sandbox-rows tr")
        expect(rows.filter(has_text=sb.id)).to_contain_text("run=browser-test")
        expect(rows.filter(has_text=sb.id)).to_contain_text("rollout-7")
        save_screenshot(page, "console-sandboxes")
        check_accessibility(page)
        check_keyboard(page, ["#f-label", "#f-session", f'a[href="/ui/sandboxes/{sb.id}"]'])
        # The filter narrows the list to one sandbox.
        page.get_by_label("Label (key=value)").fill("run=browser-test")
        page.get_by_role("button", name="Filter").click()
        expect(page.locator("#sandbox-rows")).to_contain_text(sb.id)
        expect(page.locator("#sandbox-rows")).not_to_contain_text(other.id)

        page.get_by_role("link", name=sb.id).click()
        expect(page.get_by_role("heading", level=1)).to_contain_text(sb.id)
        expect(page.locator("#files")).to_contain_text("src/")
        check_accessibility(page)
        check_keyboard(page, ["#command", "#open-terminal", "#count"])

        # A command through the form: its output, then its event in the log.
        page.get_by_label("Command").fill("python3 -c 'print(6*7)'")
        page.get_by_role("button", name="Run").click()
        expect(page.locator("#action-result")).to_contain_text("exit 0")
        expect(page.locator("#action-result pre")).to_have_text("42\n")

        # The files browser: into a folder, then a file.
        page.locator("#files").get_by_role("link", name="src/").click()
        page.locator("#files").get_by_role("link", name="calc.py").click()
        expect(page.locator("pre")).to_contain_text("return a + b")
        check_accessibility(page)
        page.go_back()

        # The terminal: a real shell over the PTY WebSocket, authenticated by the cookie.
        page.get_by_role("button", name="Open terminal").click()
        expect(page.locator("#terminal-status")).to_have_text("Connected.")
        page.keyboard.type("echo $((6*7))-from-the-terminal\n")
        expect(page.locator("#terminal .xterm-rows")).to_contain_text("42-from-the-terminal")
        save_screenshot(page, "console-sandbox")
        page.keyboard.type("exit\n")
        expect(page.locator("#terminal-status")).to_contain_text("exited with code 0")
    finally:
        sb.delete()
        other.delete()


@needs_root
@needs_browser
def test_fork_snapshot_and_delete_with_confirmation(browser_page: Page, console_url: str,
                                                    sdk: SandboxClient) -> None:
    page = browser_page
    sb = sdk.create_sandbox("host", labels={"run": "fork-test"})
    asked: list[str] = []

    def answer(dialog) -> None:  # the confirmation each action asks for
        asked.append(dialog.message)
        dialog.dismiss() if "Pause" in dialog.message else dialog.accept()

    page.on("dialog", answer)
    log_in(page, console_url, f"/ui/sandboxes/{sb.id}")
    page.get_by_label("Forks").fill("2")
    page.get_by_role("button", name="Fork").click()
    forks = page.locator("#action-result li a")
    expect(forks).to_have_count(2)
    fork_ids = forks.all_inner_texts()
    assert all(sdk.get_sandbox(f).info.labels["orchard.dev/fork-of"] == sb.id for f in fork_ids)
    page.get_by_role("button", name="Snapshot").click()
    expect(page.locator("#action-result")).to_contain_text("taken")
    # A dismissed confirmation does nothing.
    page.get_by_role("button", name="Pause").click()
    expect(page.get_by_role("button", name="Pause")).to_be_visible()
    assert sdk.get_sandbox(sb.id).info.status == "running"
    page.get_by_role("button", name="Delete").click()
    expect(page).to_have_url(f"{console_url}/ui/sandboxes")
    wait_until(lambda: sdk.get_sandbox(sb.id).info.status == "deleted")
    assert asked == [f"Fork {sb.id}?", f"Take a snapshot of {sb.id}?",
                     f"Pause {sb.id}? Its processes freeze until resumed.",
                     f"Delete {sb.id}? Its processes and files are gone for good."]
    page.goto(f"{console_url}/ui/snapshots")
    expect(page.locator("tbody")).to_contain_text(sb.id)
    check_accessibility(page)
    check_keyboard(page, ["tbody button.danger"])
    save_screenshot(page, "console-snapshots")
    for f in fork_ids:
        sdk.delete_sandbox(f)
    for s in sdk.list_snapshots():
        if s.sandbox_id == sb.id:
            sdk.delete_snapshot(s.snapshot_id)


@needs_root
@needs_browser
def test_the_other_pages_and_a_bad_id(browser_page: Page, console_url: str,
                                      sdk: SandboxClient) -> None:
    page = browser_page
    log_in(page, console_url, "/ui/metrics")
    with sdk.create_sandbox("host") as sb:
        sb.exec("true")
        # The charts sample /metrics in the page: a value appears once two samples are in.
        live = page.locator('figure[data-series="live"] .value')
        expect(live).not_to_have_text("-", timeout=15_000)
        expect(page.locator('figure[data-series="execs"] .value')).not_to_have_text(
            "-", timeout=15_000)
        save_screenshot(page, "console-metrics")
        check_accessibility(page)
    for path in ("/ui/pools", "/ui/images"):
        page.goto(f"{console_url}{path}")
        expect(page.get_by_role("heading", level=1)).to_be_visible()
        check_accessibility(page)
        check_keyboard(page, ['nav a[href="/ui/runs"]', "header button"])
    page.goto(f"{console_url}/ui/sandboxes/sb-000000000000")
    expect(page.get_by_role("alert")).to_contain_text("no sandbox 'sb-000000000000'")
    check_accessibility(page)
