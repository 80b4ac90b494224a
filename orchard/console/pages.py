"""What every console page shares: the templates, the login check, and the REST API the
pages are built on, called in-process with the visitor's own key."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

import httpx
from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from markupsafe import escape
from starlette.types import ASGIApp

from orchard.env.auth import AuthError, check_key, given_key

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")


class ConsoleError(Exception):
    """A page that cannot be shown: the API's answer, or bad input, said in the page."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


class LoginRequired(Exception):
    pass


class Console:
    """The console's view of the app it is mounted on."""

    def __init__(self, app: ASGIApp, api_keys: list[str], runs_roots: list[Path]) -> None:
        self.api_keys = api_keys
        # The run pages read only below these (resolved, so a symlink cannot lead out).
        self.runs_roots = [r.resolve() for r in runs_roots]
        # The API is called through the app itself, so its auth, limits and errors apply.
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                      base_url="http://console", timeout=60)

    def check(self, request: Request) -> None:
        """LoginRequired unless the visitor carries a valid key (or none is needed)."""
        try:
            check_key(self.api_keys, given_key(request))
        except AuthError:
            raise LoginRequired from None

    async def call(self, request: Request, method: str, path: str, **kwargs: Any) -> Any:
        """The API's JSON answer to ``method path``, else ConsoleError with its detail."""
        self.check(request)
        headers = {"host": request.headers.get("host", "127.0.0.1")}
        if key := given_key(request):
            headers["x-api-key"] = key
        response = await self.http.request(method, path, headers=headers, **kwargs)
        if response.status_code >= 400:
            raise ConsoleError(response.status_code, _detail(response))
        return response.json() if response.content else None


async def form_fields(request: Request, limit: int = 65536) -> dict[str, str]:
    """A posted form's fields, first value each; past ``limit`` bytes the body is not read
    (the console's forms are a few short fields)."""
    body = (await request.body())[:limit].decode(errors="replace")
    return {k: v[0] for k, v in parse_qs(body, keep_blank_values=True).items()}


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    if isinstance(detail, list):  # FastAPI's validation errors
        detail = "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}"
                           for d in detail)
    return str(detail or response.text[:500] or response.reason_phrase)


def render(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
    console: Console = request.app.state.console
    return templates.TemplateResponse(request, name, {"logins": bool(console.api_keys),
                                                      **context}, status_code=status)


def error_page(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ConsoleError)
    if request.headers.get("hx-request"):  # a fragment: said where the action was
        return HTMLResponse(f'<p class="error" role="alert">{escape(exc.detail)}</p>')
    return render(request, "error.html", status=exc.status, code=exc.status, detail=exc.detail)


def to_login(request: Request, _: Exception) -> Response:
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    target = f"/ui/login?next={quote(here)}"
    if request.headers.get("hx-request"):
        return Response(status_code=401, headers={"HX-Redirect": target})
    return RedirectResponse(target, status_code=303)


# Template filters: numbers and times as a person reads them.

def age(value: str | None) -> str:
    if not value:
        return "-"
    seconds = time.time() - datetime.fromisoformat(value).timestamp()
    return duration(seconds)


def left(value: str | None) -> str:
    if not value:
        return "none"
    seconds = datetime.fromisoformat(value).timestamp() - time.time()
    return "expired" if seconds <= 0 else duration(seconds)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def size(value: float | None) -> str:
    if value is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return "-"


def clock(value: float | None) -> str:
    return "-" if value is None else datetime.fromtimestamp(value).strftime("%H:%M:%S")


templates.env.filters.update(age=age, left=left, duration=duration, size=size, clock=clock,
                             tojson_pretty=lambda v: json.dumps(v, indent=2, default=str))
