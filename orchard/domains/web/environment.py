"""A web task's sandbox: its sites served inside it, their state read back for the checker.

The site code (``sites/``, standard library only) is uploaded into the sandbox and each site
runs there as a background process of the sandbox's own Python on its port of ``SITE_PORTS``,
so nothing needs the internet and every rollout starts from the same seed state.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchard.domains.web.model import SITE_PORTS, WebTask
from orchard.env.client import OrchardError, Sandbox
from orchard.tasks.served import wait_serving

SITES_DIR = Path(__file__).resolve().parent / "sites"
IN_SANDBOX = "/workspace/.orchard-sites"


class SiteError(RuntimeError):
    """A site did not come up in the sandbox; the message says which and why."""


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
    ports = [SITE_PORTS[s] for s in task.sites]
    why = wait_serving(sandbox, [f"http://127.0.0.1:{p}/" for p in ports], timeout)
    if why:
        raise SiteError(f"the sites {task.sites} of {task.instance_id} did not answer on "
                        f"ports {ports} within {timeout:g}s ({why}); see the processes of "
                        f"sandbox {sandbox.id}")


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
