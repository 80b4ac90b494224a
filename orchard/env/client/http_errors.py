"""httpx's responses and failures, turned into the SDK's exceptions (``errors.py``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

from orchard.env.client import errors

_STATUS_ERRORS: dict[int, type[errors.APIError]] = {
    400: errors.InvalidRequest,
    401: errors.AuthenticationError,
    403: errors.AuthenticationError,
    404: errors.NotFoundError,
    408: errors.WaitTimeout,
    409: errors.ConflictError,
    413: errors.PayloadTooLarge,
    422: errors.InvalidRequest,
}


def error_detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip() or response.reason_phrase
    detail = body.get("detail") if isinstance(body, dict) else body
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):  # FastAPI's validation errors: [{"loc": [...], "msg": ...}]
        return "; ".join(_validation_item(item) for item in detail)
    return json.dumps(body)


def _validation_item(item: object) -> str:
    if not isinstance(item, dict):
        return str(item)
    loc = ".".join(str(part) for part in item.get("loc", ()) if part != "body")
    msg = str(item.get("msg", item))
    return f"{loc}: {msg}" if loc else msg


def retry_after(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds; it may be a number of seconds or an HTTP date."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def error_for_status(
    status: int, detail: str, *, retry_after: float | None = None, not_ready: str | None = None
) -> errors.APIError:
    if status == 409 and not_ready is not None:
        return errors.SandboxNotReady(not_ready, detail)
    if status == 503:
        return errors.Overloaded(status, detail, retry_after)
    cls = _STATUS_ERRORS.get(status) or (errors.ServerError if status >= 500 else errors.APIError)
    return cls(status, detail)


def error_from_response(response: httpx.Response, not_ready: str | None = None) -> errors.APIError:
    return error_for_status(
        response.status_code,
        error_detail(response),
        retry_after=retry_after(response),
        not_ready=not_ready,
    )


def transport_error(exc: httpx.TransportError, what: str) -> errors.TransportError:
    kind = (
        errors.ConnectError
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
        else errors.TransportError
    )
    return kind(f"{what}: {str(exc) or type(exc).__name__}")


@contextmanager
def download_errors(sandbox_id: str, path: str) -> Iterator[None]:
    """A download whose body breaks off is an IncompleteDownload, never a short file."""
    try:
        yield
    except httpx.TransportError as exc:
        raise errors.IncompleteDownload(
            f"the download of {path} from sandbox {sandbox_id} broke off before its end "
            f"({str(exc) or type(exc).__name__}): the server cut it (a file that ran past its "
            "max_download_bytes, or a sandbox agent that failed mid-transfer: the server's log "
            "says which) or the connection dropped; nothing was kept"
        ) from exc


@contextmanager
def wire_errors(what: str) -> Iterator[None]:
    """Maps httpx's errors while a streamed body is read, after ``send`` has returned."""
    try:
        yield
    except httpx.TransportError as exc:
        raise transport_error(exc, what) from exc
