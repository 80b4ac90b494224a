"""A web task's sandbox: its sites served inside it, their state read back for the checker.

The site code (``sites/``, standard library only) is uploaded into the sandbox and each site
runs there as a background process of the sandbox's own Python on its port of ``SITE_PORTS``,
so nothing needs the internet and every rollout starts from the same seed state.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from orchard.env.client import OrchardError, Sandbox
from orchard.tasks.web.model import SITE_PORTS, WebTask

SITES_DIR = Path(__file__).resolve().parent / "sites"
IN_SANDBOX = "/workspace/.orchard-sites"


class SiteError(RuntimeError):
    """A site did not come up in the sandbox; the message says which and why."""


_WAIT = """
import sys, time, urllib.request
deadline = time.monotonic() + float(sys.argv[1])
for port in sys.argv[2:]:
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)
            break
        except OSError as e:
            if time.monotonic() > deadline:
                sys.exit(f"port {port}: {e}")
            time.sleep(0.05)
"""


def state_path(site: str) -> str:
    return f"{IN_SANDBOX}/{site}.json"


def start_sites(sandbox: Sandbox, task: WebTask, timeout: float = 30.0) -> None:
    """Upload and start the task's sites; return once each answers on its port."""
    if not task.sites:
        return  # a live task's sites are on the internet
    sandbox.upload_content((SITES_DIR / "sitekit.py").read_bytes(), f"{IN_SANDBOX}/sitekit.py")
    for site in task.sites:
        sandbox.upload_content((SITES_DIR / f"{site}.py").read_bytes(),
                               f"{IN_SANDBOX}/{site}.py")
        sandbox.start_process(f"python3 {IN_SANDBOX}/{site}.py --port {SITE_PORTS[site]} "
                              f"--state {state_path(site)}")
    ports = " ".join(str(SITE_PORTS[s]) for s in task.sites)
    # One exec that waits inside: the event log, and so a replay, sees it succeed once.
    waited = sandbox.exec(f"python3 -c {shlex.quote(_WAIT)} {timeout} {ports}",
                          timeout=timeout + 10)
    if not waited.ok:
        raise SiteError(f"the sites {task.sites} of {task.instance_id} did not answer on "
                        f"ports {ports} within {timeout:g}s ({waited.stderr.strip()[-300:]}); "
                        f"see the processes of sandbox {sandbox.id}")


def site_state(sandbox: Sandbox, task: WebTask) -> dict[str, dict[str, Any]]:
    """Each of the task's sites' state as it is now (what the checker judges)."""
    state = {}
    for site in task.sites:
        try:
            state[site] = json.loads(sandbox.download_content(state_path(site)))
        except (OrchardError, ValueError) as e:
            raise SiteError(f"cannot read the state of site {site} in sandbox {sandbox.id}: "
                            f"{e}") from None
    return state
