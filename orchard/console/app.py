"""Mounting the console on the orchestrator's app: /ui, its login, and its static files."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from orchard.console import resources, sandboxes
from orchard.console.pages import (
    HERE,
    Console,
    ConsoleError,
    LoginRequired,
    error_page,
    form_fields,
    render,
    to_login,
)
from orchard.env.auth import KEY_COOKIE, AuthError, check_key
from orchard.extras import MissingExtra

# The login form's body is one short field; anything longer is not a key.
MAX_LOGIN_BODY = 4096


def mount_console(app: FastAPI, api_keys: list[str],
                  runs_dirs: Sequence[Path] | None = None) -> None:
    """Serve the console at /ui on ``app``, as a client of the app's own REST API. Its run
    pages read run directories under ``runs_dirs`` only (default: the working directory)."""
    app.state.console = Console(app, api_keys, list(runs_dirs or [Path.cwd()]))
    app.add_exception_handler(ConsoleError, error_page)
    app.add_exception_handler(LoginRequired, to_login)
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="console-static")
    for router in (_login_router(), sandboxes.router(), resources.router(), _runs_router()):
        app.include_router(router, include_in_schema=False)


def _runs_router() -> APIRouter:
    """The run pages, which read traces and reports with the rollout and eval layers; an
    orchestrator installed with [server] alone answers them with what to install."""
    try:
        from orchard.console import runs
    except MissingExtra as e:
        missing = str(e)
        ui = APIRouter(prefix="/ui/runs")

        @ui.get("")
        @ui.get("/{page}")
        async def not_installed(request: Request) -> Response:
            request.app.state.console.check(request)
            raise ConsoleError(501, f"the run pages cannot be shown: {missing}")

        return ui
    return runs.router()


def _login_router() -> APIRouter:
    ui = APIRouter(prefix="/ui")

    @ui.get("")
    @ui.get("/")
    async def home() -> Response:
        return RedirectResponse("/ui/sandboxes", status_code=303)

    @ui.get("/login")
    async def login_form(request: Request, next: str = "/ui/sandboxes") -> Response:
        return render(request, "login.html", next=_local(next))

    @ui.post("/login")
    async def login(request: Request) -> Response:
        form = await form_fields(request, MAX_LOGIN_BODY)
        key, target = form.get("key", ""), _local(form.get("next", "/ui/sandboxes"))
        try:
            check_key(request.app.state.console.api_keys, key)
        except AuthError as e:
            return render(request, "login.html", status=e.status, next=target,
                          error=f"{e.detail.split(':')[0]}: check the key and try again")
        answer = RedirectResponse(target, status_code=303)
        # HttpOnly: page scripts never see it. Strict: no other site's page sends it.
        answer.set_cookie(KEY_COOKIE, key, httponly=True, samesite="strict",
                          secure=request.url.scheme == "https", path="/")
        return answer

    @ui.post("/logout")
    async def logout() -> Response:
        answer = RedirectResponse("/ui/login", status_code=303)
        answer.delete_cookie(KEY_COOKIE, path="/")
        return answer

    return ui


def _local(target: str) -> str:
    """Only a path of this console: a login link must not send anyone to another site."""
    return target if target.startswith("/ui") and not target.startswith("//") else "/ui/sandboxes"
