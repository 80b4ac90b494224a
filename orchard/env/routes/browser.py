"""The sandbox's browser: one action, then the page after it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from orchard.env.browser_schema import BrowserAction, BrowserObservation
from orchard.env.routes.common import ERRORS
from orchard.env.service import SandboxOps


def router(ops: SandboxOps, secured: list[Any]) -> APIRouter:
    api = APIRouter(dependencies=secured, responses=ERRORS)

    @api.post("/sandboxes/{sid}/browser", response_model=BrowserObservation)
    async def browser(sid: str, action: BrowserAction) -> BrowserObservation:
        """Do one action in the sandbox's headless Chromium (started on first use) and observe
        the page: its accessibility tree with element ids, and a screenshot if asked. An
        action that could not happen (a stale id, a page still loading) is said in `error`,
        with a 200: the caller is a model that should see it."""
        return BrowserObservation.model_validate(await ops.browser(sid, action))

    return api
