"""An assistant task's sandbox: its services started on the seed world, the world read back.

The services (``services/``, standard library only) are uploaded into the sandbox and run there
as one background process of the sandbox's own Python on ``SERVICES_PORT``; the orchestrator
reaches them through the sandbox's service requests (``sb.http``), so every tool call is an
``http`` event in the sandbox's log.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchard.domains.assistant.assistant_agent import call_tool as call_tool_on
from orchard.domains.assistant.model import SERVICES_PORT, AssistantTask
from orchard.env.client import OrchardError, Sandbox
from orchard.tasks.served import wait_serving

SERVICES_DIR = Path(__file__).resolve().parent / "services"
IN_SANDBOX = "/workspace/.orchard-assistant"
STATE = f"{IN_SANDBOX}/world.json"


class ServicesError(RuntimeError):
    """The services did not come up, or their world could not be read; the message says why."""


def start_services(sandbox: Sandbox, task: AssistantTask, timeout: float = 30.0) -> None:
    """Upload the services and the task's seed world, start them, return once they answer."""
    for name in ("tools.py", "server.py"):
        sandbox.upload_content((SERVICES_DIR / name).read_bytes(), f"{IN_SANDBOX}/{name}")
    sandbox.upload_content(json.dumps(task.seed(), indent=1).encode(), STATE)
    sandbox.start_process(f"python3 {IN_SANDBOX}/server.py --port {SERVICES_PORT} "
                          f"--state {STATE}")
    why = wait_serving(sandbox, [f"http://127.0.0.1:{SERVICES_PORT}/tools"], timeout)
    if why:
        raise ServicesError(f"the services of {task.instance_id} did not answer on port "
                            f"{SERVICES_PORT} within {timeout:g}s ({why}); see the processes "
                            f"of sandbox {sandbox.id}")


def world_state(sandbox: Sandbox) -> dict[str, Any]:
    """The world as the services hold it now (what the checks judge)."""
    try:
        answer = sandbox.http(SERVICES_PORT, "/state")
        if answer.status != 200:
            raise ServicesError(f"GET /state answered {answer.status}: {answer.body[:300]}")
        return dict(answer.json())
    except (OrchardError, ValueError) as e:
        raise ServicesError(f"cannot read the world of sandbox {sandbox.id}: {e}") from None


def call_tool(sandbox: Sandbox, name: str, args: dict[str, Any]) -> tuple[bool, Any]:
    """(ok, result or the refusal's message) of one call to the task's services."""
    return call_tool_on(sandbox, SERVICES_PORT, name, args)
