"""What the sync and async clients share: configuration, requests, responses, retries.

Each endpoint is described once, by a :class:`Call` built in :class:`API`, without I/O; the
twins (``sync_client.py``, ``async_client.py``) only send calls, sleep for as long as
:class:`BaseClient` says, and hand the response to ``call.parse``. The one blocking exception
is the cleanup on SIGINT/SIGTERM (``_signals.py``), which must work from a signal handler.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import random
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import Enum
from pathlib import Path
from typing import Any, Generic, Protocol, Self, TypedDict, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from orchard.env import schema
from orchard.env.client import errors
from orchard.env.client._signals import SignalCleanup, delete_sandboxes

log = logging.getLogger("orchard.client")

DEFAULT_URL = "http://127.0.0.1:8000"
CHUNK_SIZE = 1 << 20
# Long-poll and blocking-exec calls get a read timeout of the server-side wait plus this much,
# so the server's own answer (a result or a clean 408) arrives before the client gives up.
WAIT_MARGIN = 30.0
# How long create_sandbox waits for readiness unless told otherwise.
DEFAULT_READY_TIMEOUT = 120.0

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


def resolve_config(base_url: str | None, api_key: str | None) -> tuple[str, str | None]:
    """Arguments win over ``ORCHARD_URL`` / ``ORCHARD_API_KEY``, then the reference SDK's
    ``SANDBOX_BASE_URL`` / ``SANDBOX_API_KEY``, then defaults."""
    env = os.environ.get
    url = base_url or env("ORCHARD_URL") or env("SANDBOX_BASE_URL") or DEFAULT_URL
    key = api_key if api_key is not None else (
        env("ORCHARD_API_KEY") or env("SANDBOX_API_KEY") or None)
    return url.rstrip("/"), key


def b64decode(data: str | None) -> bytes:
    return base64.b64decode(data) if data else b""


# --- Results: the wire models plus byte accessors -------------------------------------------


class ExecResult(schema.Job):
    """A job. ``stdout``/``stderr`` are text; the ``*_bytes`` properties are exact."""

    @property
    def stdout_bytes(self) -> bytes:
        # The server sets *_b64 only when the output is not UTF-8; then the text is lossy.
        return b64decode(self.stdout_b64) if self.stdout_b64 is not None else self.stdout.encode()

    @property
    def stderr_bytes(self) -> bytes:
        return b64decode(self.stderr_b64) if self.stderr_b64 is not None else self.stderr.encode()

    @property
    def finished(self) -> bool:
        return self.status in (schema.JobStatus.succeeded, schema.JobStatus.failed)

    @property
    def ok(self) -> bool:
        """Finished in time with exit code 0."""
        return self.finished and self.exit_code == 0 and not self.timed_out


class ExecEvent(schema.StreamEvent):
    """One event of a streamed exec: an output chunk, or the final ``exit`` with the job."""

    job: ExecResult | None = None

    @property
    def data(self) -> bytes:
        return b64decode(self.data_b64)


class ProcessOutputResult(schema.ProcessOutput):
    """New output of a background process since the offsets that were asked for."""

    @property
    def stdout_bytes(self) -> bytes:
        return b64decode(self.stdout_b64)

    @property
    def stderr_bytes(self) -> bytes:
        return b64decode(self.stderr_b64)


# --- Errors --------------------------------------------------------------------------------

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
def wire_errors(what: str) -> Iterator[None]:
    """Maps httpx's errors while a streamed body is read, after ``send`` has returned."""
    try:
        yield
    except httpx.TransportError as exc:
        raise transport_error(exc, what) from exc


# --- Calls -----------------------------------------------------------------------------------


class Retry(Enum):
    """When a call may be sent again."""

    #: Sending it twice does what sending it once does: retry lost connections and 503s.
    IDEMPOTENT = "idempotent"
    #: Retry only a 503, which the server sends before doing anything. After a lost
    #: connection the server may have run it, and an exec must never silently run twice.
    OVERLOAD = "overload"
    #: The body is a one-shot stream that cannot be sent again.
    NEVER = "never"


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 3
    backoff: float = 0.5
    max_backoff: float = 8.0
    max_retry_after: float = 60.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        if retry_after is not None:
            # Clients turned away together were all told the same wait: at least that, spread
            # over as much again, or they all return at once and are all turned away again.
            wait = min(retry_after, self.max_retry_after)
            return wait + random.uniform(0, wait)
        # Full jitter: clients that failed together must not all come back together.
        return random.uniform(0, min(self.max_backoff, self.backoff * 2**attempt))


@dataclass(frozen=True)
class Call(Generic[T]):
    """One endpoint invocation: the request to send, how to retry it, how to read the answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: list[tuple[str, str]] = field(default_factory=list)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    retry: Retry = Retry.IDEMPOTENT
    timeout: httpx.Timeout | None = None  # None: the client's default
    stream: bool = False  # hand back the response unread; the caller closes it
    not_ready: str | None = None  # a 409 here means this sandbox failed to start


def _model(cls: type[M]) -> Callable[[httpx.Response], M]:
    def parse(response: httpx.Response) -> M:
        try:
            return cls.model_validate_json(response.content)
        except ValidationError as exc:
            raise errors.OrchardError(
                f"{response.request.method} {response.request.url.path}: "
                f"unexpected response from the server: {exc}"
            ) from None

    return parse


def _ignore(response: httpx.Response) -> None:
    return None


def _response(response: httpx.Response) -> httpx.Response:
    return response


def _seg(value: str | int) -> str:
    return quote(str(value), safe="")


def _long(seconds: float | None) -> httpx.Timeout:
    return httpx.Timeout(
        30.0, connect=10.0, read=None if seconds is None else seconds + WAIT_MARGIN
    )


def _body(model: BaseModel) -> dict[str, Any]:
    # Omitting unset optionals lets the server apply its own defaults.
    return model.model_dump(mode="json", exclude_none=True)


class ExecOptions(TypedDict, total=False):
    """Keyword options of every exec flavour (exec, submit, stream, start_process)."""

    timeout: float | None  # seconds before the command is killed (server default if None)
    cwd: str | None
    env: Mapping[str, str] | None  # added to the sandbox's default env
    stdin: str | bytes | None  # bytes travel as base64; None closes stdin
    max_output_bytes: int | None  # per stream; the middle is dropped beyond it
    login_shell: bool


def exec_request(
    command: str | Sequence[str],
    *,
    timeout: float | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    stdin: str | bytes | None = None,
    max_output_bytes: int | None = None,
    login_shell: bool = False,
) -> schema.ExecRequest:
    """A string runs under ``/bin/sh -c``; a list is an argv run without a shell."""
    program: dict[str, Any] = (
        {"command": command} if isinstance(command, str) else {"argv": list(command)}
    )
    if isinstance(stdin, bytes):
        program["stdin_b64"] = base64.b64encode(stdin).decode()
    elif stdin is not None:
        program["stdin"] = stdin
    if max_output_bytes is not None:
        program["max_output_bytes"] = max_output_bytes
    return schema.ExecRequest(
        timeout_seconds=timeout,
        cwd=cwd,
        env=dict(env or {}),
        login_shell=login_shell,
        **program,
    )


class API:
    """Every REST endpoint as a :class:`Call`."""

    @staticmethod
    def health() -> Call[schema.Health]:
        return Call("GET", "/health", _model(schema.Health))

    @staticmethod
    def resources() -> Call[schema.Resources]:
        return Call("GET", "/resources", _model(schema.Resources))

    @staticmethod
    def create_sandbox(request: schema.CreateSandboxRequest) -> Call[schema.SandboxInfo]:
        # With an id, a resent create finds the first one instead of making a second sandbox.
        retry = Retry.IDEMPOTENT if request.sandbox_id else Retry.OVERLOAD
        return Call(
            "POST", "/sandboxes", _model(schema.SandboxInfo), json=_body(request), retry=retry
        )

    @staticmethod
    def list_sandboxes(labels: Mapping[str, str] | None) -> Call[schema.SandboxList]:
        params = [("label", f"{k}={v}") for k, v in (labels or {}).items()]
        return Call("GET", "/sandboxes", _model(schema.SandboxList), params=params)

    @staticmethod
    def events(session: str | None, sandbox_id: str | None, labels: Mapping[str, str] | None,
               after: int, limit: int) -> Call[schema.EventList]:
        params = [("label", f"{k}={v}") for k, v in (labels or {}).items()]
        params += [("after", str(after)), ("limit", str(limit))]
        if session is not None:
            params.append(("session", session))
        if sandbox_id is not None:
            params.append(("sandbox_id", sandbox_id))
        return Call("GET", "/events", _model(schema.EventList), params=params)

    @staticmethod
    def get_sandbox(sandbox_id: str) -> Call[schema.SandboxInfo]:
        return Call("GET", f"/sandboxes/{_seg(sandbox_id)}", _model(schema.SandboxInfo))

    @staticmethod
    def wait_sandbox(sandbox_id: str, timeout: float) -> Call[schema.SandboxInfo]:
        def ready(response: httpx.Response) -> schema.SandboxInfo:
            info = schema.SandboxInfo.model_validate_json(response.content)
            if info.status in (schema.SandboxStatus.failed, schema.SandboxStatus.deleted):
                raise errors.SandboxNotReady(
                    sandbox_id, f"sandbox {sandbox_id} is {info.status.value}: {info.error}",
                    response.status_code)
            return info

        return Call(
            "GET",
            f"/sandboxes/{_seg(sandbox_id)}/wait",
            ready,
            params=[("timeout", str(timeout))],
            timeout=_long(timeout),
            not_ready=sandbox_id,
        )

    @staticmethod
    def delete_sandbox(sandbox_id: str) -> Call[schema.DeleteResponse]:
        return Call("DELETE", f"/sandboxes/{_seg(sandbox_id)}", _model(schema.DeleteResponse))

    @staticmethod
    def heartbeat(sandbox_id: str) -> Call[schema.SandboxInfo]:
        return Call("POST", f"/sandboxes/{_seg(sandbox_id)}/heartbeat", _model(schema.SandboxInfo))

    @staticmethod
    def _exec(
        sandbox_id: str, request: schema.ExecRequest, parse: Callable[[httpx.Response], T]
    ) -> Call[T]:
        # Only these answer when the command ends, which may be long after the default timeout.
        blocking = (request.wait or request.stream) and not request.background
        return Call(
            "POST",
            f"/sandboxes/{_seg(sandbox_id)}/exec",
            parse,
            json=_body(request),
            retry=Retry.OVERLOAD,
            timeout=_long(request.timeout_seconds) if blocking else None,
            stream=request.stream,
        )

    @staticmethod
    def exec(sandbox_id: str, request: schema.ExecRequest
             ) -> Call[ExecResult | schema.JobAccepted]:
        """The finished job, or (if it outlasted its timeout plus a margin) its id to follow."""
        def parse(response: httpx.Response) -> ExecResult | schema.JobAccepted:
            body = response.json()
            if "sandbox_id" not in body:
                return schema.JobAccepted.model_validate(body)
            return ExecResult.model_validate(body)

        return API._exec(sandbox_id, request, parse)

    @staticmethod
    def submit(sandbox_id: str, request: schema.ExecRequest) -> Call[schema.JobAccepted]:
        return API._exec(
            sandbox_id, request.model_copy(update={"wait": False}), _model(schema.JobAccepted)
        )

    @staticmethod
    def start_process(sandbox_id: str, request: schema.ExecRequest) -> Call[schema.ProcessInfo]:
        return API._exec(
            sandbox_id, request.model_copy(update={"background": True}), _model(schema.ProcessInfo)
        )

    @staticmethod
    def stream(sandbox_id: str, request: schema.ExecRequest) -> Call[httpx.Response]:
        return API._exec(sandbox_id, request.model_copy(update={"stream": True}), _response)

    @staticmethod
    def get_job(job_id: str) -> Call[ExecResult]:
        return Call("GET", f"/jobs/{_seg(job_id)}", _model(ExecResult))

    @staticmethod
    def wait_job(job_id: str, timeout: float) -> Call[ExecResult]:
        return Call(
            "GET",
            f"/jobs/{_seg(job_id)}/wait",
            _model(ExecResult),
            params=[("timeout", str(timeout))],
            timeout=_long(timeout),
        )

    @staticmethod
    def apply_patch(sandbox_id: str, request: schema.PatchRequest) -> Call[schema.PatchResponse]:
        return Call(
            "POST",
            f"/sandboxes/{_seg(sandbox_id)}/apply_patch",
            _model(schema.PatchResponse),
            json=_body(request),
            retry=Retry.OVERLOAD,
            timeout=_long(request.timeout_seconds),
        )

    @staticmethod
    def upload(
        sandbox_id: str, path: str, data: bytes | str, mode: int | None
    ) -> Call[schema.FileWriteResult]:
        raw = data.encode() if isinstance(data, str) else data
        request = schema.FileUpload(path=path, content=base64.b64encode(raw).decode(), mode=mode)
        return Call(
            "POST",
            f"/sandboxes/{_seg(sandbox_id)}/files",
            _model(schema.FileWriteResult),
            json=_body(request),
            retry=Retry.OVERLOAD,
        )

    @staticmethod
    def upload_raw(
        sandbox_id: str, path: str, mode: int | None, replayable: bool
    ) -> Call[schema.FileWriteResult]:
        """The body is passed to the twin's send, as a factory, since only it knows sync/async."""
        params = [("path", path)] + ([("mode", str(mode))] if mode is not None else [])
        return Call(
            "PUT",
            f"/sandboxes/{_seg(sandbox_id)}/files/raw",
            _model(schema.FileWriteResult),
            params=params,
            headers={"Content-Type": "application/octet-stream"},
            retry=Retry.OVERLOAD if replayable else Retry.NEVER,
            timeout=_long(None),  # the server may take its time to flush a large file
        )

    @staticmethod
    def download_raw(sandbox_id: str, path: str) -> Call[httpx.Response]:
        return Call(
            "GET",
            f"/sandboxes/{_seg(sandbox_id)}/files/raw",
            _response,
            params=[("path", path)],
            stream=True,
        )

    @staticmethod
    def list_files(sandbox_id: str, path: str) -> Call[schema.FileList]:
        return Call(
            "GET",
            f"/sandboxes/{_seg(sandbox_id)}/files/list",
            _model(schema.FileList),
            params=[("path", path)],
        )

    @staticmethod
    def mkdir(sandbox_id: str, path: str) -> Call[None]:
        return Call(
            "POST",
            f"/sandboxes/{_seg(sandbox_id)}/files/mkdir",
            _ignore,
            json=_body(schema.PathRequest(path=path)),
            retry=Retry.OVERLOAD,
        )

    @staticmethod
    def remove(sandbox_id: str, path: str, recursive: bool) -> Call[None]:
        return Call(
            "DELETE",
            f"/sandboxes/{_seg(sandbox_id)}/files",
            _ignore,
            params=[("path", path), ("recursive", "true" if recursive else "false")],
        )

    @staticmethod
    def list_processes(sandbox_id: str) -> Call[schema.ProcessList]:
        return Call("GET", f"/sandboxes/{_seg(sandbox_id)}/processes", _model(schema.ProcessList))

    @staticmethod
    def get_process(sandbox_id: str, process_id: str | int) -> Call[schema.ProcessInfo]:
        return Call(
            "GET",
            f"/sandboxes/{_seg(sandbox_id)}/processes/{_seg(process_id)}",
            _model(schema.ProcessInfo),
        )

    @staticmethod
    def process_output(
        sandbox_id: str, process_id: str | int, stdout_offset: int, stderr_offset: int
    ) -> Call[ProcessOutputResult]:
        return Call(
            "GET",
            f"/sandboxes/{_seg(sandbox_id)}/processes/{_seg(process_id)}/output",
            _model(ProcessOutputResult),
            params=[("stdout_offset", str(stdout_offset)), ("stderr_offset", str(stderr_offset))],
        )

    @staticmethod
    def kill_process(sandbox_id: str, process_id: str | int) -> Call[schema.ProcessInfo]:
        return Call(
            "DELETE",
            f"/sandboxes/{_seg(sandbox_id)}/processes/{_seg(process_id)}",
            _model(schema.ProcessInfo),
        )

    @staticmethod
    def pty(
        sandbox_id: str, command: str, cols: int, rows: int
    ) -> tuple[str, dict[str, str | int]]:
        """Path and query of the PTY websocket (it does not go through ``send``)."""
        return (
            f"/sandboxes/{_seg(sandbox_id)}/exec/pty",
            {"command": command, "cols": cols, "rows": rows},
        )


def parse_event(line: str) -> ExecEvent:
    return ExecEvent.model_validate_json(line)


def pty_refused(response: httpx.Response) -> errors.APIError:
    # httpx-ws closes the refused handshake's response unread, so only its status is left.
    return error_for_status(
        response.status_code, f"terminal refused: {response.reason_phrase or 'no reason given'}"
    )


def pty_resize_message(cols: int, rows: int) -> str:
    return json.dumps({"resize": [cols, rows]})


def pty_exit_code(text: str) -> int | None:
    """The exit code carried by the server's last text frame, ``{"exit_code": N}``."""
    try:
        message = json.loads(text)
    except ValueError:
        return None
    code = message.get("exit_code") if isinstance(message, dict) else None
    return code if isinstance(code, int) else None


# --- Client state shared by the twins ---------------------------------------------------------


class _Stoppable(Protocol):
    def stop(self) -> None: ...


class BaseClient:
    """Configuration, retry decisions and the set of sandboxes to delete on close."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        cleanup_on_close: bool = True,
        auto_cleanup: bool | None = None,
        prefix: str | None = None,
    ) -> None:
        """``auto_cleanup`` is the reference SDK's name for ``cleanup_on_close``; ``prefix``
        (or ``SANDBOX_PREFIX``) starts every sandbox id this client makes up or is given."""
        self.base_url, self.api_key = resolve_config(base_url, api_key)
        self.retry_policy = retry or RetryPolicy()
        self.cleanup_on_close = cleanup_on_close if auto_cleanup is None else auto_cleanup
        self.prefix = prefix or os.environ.get("SANDBOX_PREFIX") or None
        self._timeout = httpx.Timeout(timeout, connect=min(timeout, 10.0))
        self._created: dict[str, None] = {}  # an ordered set: delete in creation order
        self._signal_cleanup: SignalCleanup | None = None
        self._orchestrator: _Stoppable | None = None

    @classmethod
    def local(cls, data_dir: Path | None = None, **settings: Any) -> Self:
        """A client of a private orchestrator started in this process, stopped on close."""
        # The server drags in FastAPI and the backends; only this constructor needs them.
        from orchard.env.server import EmbeddedOrchestrator

        orchestrator = EmbeddedOrchestrator(data_dir, **settings)
        url = orchestrator.start()
        try:
            # An orchestrator that made up its own key exposes it; otherwise it needs none.
            client = cls(url, api_key=getattr(orchestrator, "api_key", None))
        except BaseException:
            orchestrator.stop()
            raise
        client._orchestrator = orchestrator
        return client

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"

    def create_request(self, image: str, sandbox_id: str | None, **fields: Any
                       ) -> schema.CreateSandboxRequest:
        if self.prefix and not (sandbox_id or "").startswith(f"{self.prefix}-"):
            sandbox_id = f"{self.prefix}-{sandbox_id or uuid.uuid4().hex[:8]}"
        return schema.CreateSandboxRequest(image=image, sandbox_id=sandbox_id, **fields)

    @property
    def headers(self) -> dict[str, str]:
        headers = {"User-Agent": "orchard-sdk"}
        if self.api_key:
            headers["X-API-Key"] = self.api_key
        return headers

    def _http_options(self) -> dict[str, Any]:
        return {"base_url": self.base_url, "headers": self.headers, "timeout": self._timeout}

    def _request(
        self, http: httpx.Client | httpx.AsyncClient, call: Call[Any], content: Any = None
    ) -> httpx.Request:
        return http.build_request(
            call.method,
            call.path,
            params=tuple(call.params),
            json=call.json,
            content=content,
            headers=call.headers,
            timeout=call.timeout or self._timeout,
        )

    def _delay_after_error(self, call: Call[Any], attempt: int, exc: httpx.TransportError) -> float:
        """Seconds to wait before sending ``call`` again; raises when it must not be."""
        if call.retry is not Retry.IDEMPOTENT or attempt >= self.retry_policy.retries:
            raise transport_error(exc, f"{call.method} {self.base_url}{call.path}") from exc
        return self.retry_policy.delay(attempt)

    def _delay_after_response(
        self, call: Call[Any], attempt: int, response: httpx.Response
    ) -> float:
        """Seconds to wait before retrying an error status (a 503); raises otherwise."""
        error = error_from_response(response, call.not_ready)
        if (
            isinstance(error, errors.Overloaded)
            and call.retry is not Retry.NEVER
            and attempt < self.retry_policy.retries
        ):
            return self.retry_policy.delay(attempt, error.retry_after)
        raise error

    def _remember(self, sandbox_id: str) -> None:
        if not self.cleanup_on_close:
            return
        self._created[sandbox_id] = None
        if self._signal_cleanup is None and SignalCleanup.can_install():
            self._signal_cleanup = SignalCleanup(self._cleanup_on_signal)

    def _forget(self, sandbox_id: str) -> None:
        self._created.pop(sandbox_id, None)

    def _cleanup_on_signal(self) -> None:
        ids = list(self._created)
        self._created.clear()
        delete_sandboxes(self.base_url, self.headers, ids)

    def _release(self) -> None:
        """The I/O-free part of closing, after the twin deleted its sandboxes."""
        if self._signal_cleanup is not None:
            self._signal_cleanup.uninstall()
            self._signal_cleanup = None
        orchestrator, self._orchestrator = self._orchestrator, None
        if orchestrator is not None:
            orchestrator.stop()


class SandboxBase:
    """What both sandbox handles hold: the last known :class:`SandboxInfo`."""

    def __init__(self, info: schema.SandboxInfo) -> None:
        self.info = info

    @property
    def id(self) -> str:
        return self.info.sandbox_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id!r}, status={self.info.status.value!r})"
