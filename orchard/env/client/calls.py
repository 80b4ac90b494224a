"""Every REST endpoint described once, as a :class:`Call`, without I/O.

The twins (``async_client.py`` and ``async_sandbox.py``, and the blocking ones generated from
them) send a call, retry it as :class:`~orchard.env.client.base.BaseClient` says, and hand
the response to ``call.parse``.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Generic, TypedDict, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from orchard.env import browser_schema, http_schema, image_schema, schema, snapshot_schema
from orchard.env.client import errors
from orchard.env.client.results import ExecEvent, ExecResult, ProcessOutputResult

# Long-poll and blocking-exec calls get a read timeout of the server-side wait plus this much,
# so the server's own answer (a result or a clean 408) arrives before the client gives up.
WAIT_MARGIN = 30.0

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


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
    return _validated(cls.model_validate_json)


def _validated(validate: Callable[[bytes], T]) -> Callable[[httpx.Response], T]:
    def parse(response: httpx.Response) -> T:
        try:
            return validate(response.content)
        except ValidationError as exc:
            raise errors.OrchardError(
                f"{response.request.method} {response.request.url.path}: "
                f"unexpected response from the server: {exc}"
            ) from None

    return parse


# GET /pools answers a bare list, not a model holding one: a TypeAdapter reads it.
_POOLS = TypeAdapter(list[schema.PoolInfo])


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
    def pools() -> Call[list[schema.PoolInfo]]:
        return Call("GET", "/pools", _validated(_POOLS.validate_json))

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
            if info.status == schema.SandboxStatus.failed and info.image_error is not None:
                raise errors.ImagePullFailed(
                    sandbox_id, f"sandbox {sandbox_id} is failed: {info.error}",
                    image=info.image, cause=info.image_error)
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
    def usage(sandbox_id: str) -> Call[schema.SandboxUsage]:
        return Call("GET", f"/sandboxes/{_seg(sandbox_id)}/usage", _model(schema.SandboxUsage))

    @staticmethod
    def snapshot(sandbox_id: str, request: snapshot_schema.SnapshotRequest
                 ) -> Call[snapshot_schema.SnapshotInfo]:
        # Copying a big sandbox takes a while; with an id, a resent one finds the first.
        retry = Retry.IDEMPOTENT if request.snapshot_id else Retry.OVERLOAD
        return Call("POST", f"/sandboxes/{_seg(sandbox_id)}/snapshot",
                    _model(snapshot_schema.SnapshotInfo), json=_body(request), retry=retry,
                    timeout=_long(600))

    @staticmethod
    def fork(sandbox_id: str, request: snapshot_schema.ForkRequest
             ) -> Call[snapshot_schema.ForkResponse]:
        return Call("POST", f"/sandboxes/{_seg(sandbox_id)}/fork",
                    _model(snapshot_schema.ForkResponse), json=_body(request),
                    retry=Retry.OVERLOAD, timeout=_long(600))

    @staticmethod
    def browser(sandbox_id: str, action: browser_schema.BrowserAction
                ) -> Call[browser_schema.BrowserObservation]:
        # An action twice is not an action once; an observation is.
        retry = Retry.IDEMPOTENT if action.action == "observe" else Retry.OVERLOAD
        return Call("POST", f"/sandboxes/{_seg(sandbox_id)}/browser",
                    _model(browser_schema.BrowserObservation), json=_body(action), retry=retry,
                    timeout=_long(2 * action.timeout))

    @staticmethod
    def http(sandbox_id: str, request: http_schema.ServiceRequest
             ) -> Call[http_schema.ServiceResponse]:
        # Only a GET or HEAD may be sent twice: a POST to a tool may act twice.
        retry = Retry.IDEMPOTENT if request.method in ("GET", "HEAD") else Retry.OVERLOAD
        return Call("POST", f"/sandboxes/{_seg(sandbox_id)}/http",
                    _model(http_schema.ServiceResponse), json=_body(request), retry=retry,
                    timeout=_long(request.timeout))

    @staticmethod
    def pause(sandbox_id: str) -> Call[schema.SandboxInfo]:
        return Call("POST", f"/sandboxes/{_seg(sandbox_id)}/pause", _model(schema.SandboxInfo))

    @staticmethod
    def resume(sandbox_id: str) -> Call[schema.SandboxInfo]:
        return Call("POST", f"/sandboxes/{_seg(sandbox_id)}/resume", _model(schema.SandboxInfo))

    @staticmethod
    def get_snapshot(snapshot_id: str) -> Call[snapshot_schema.SnapshotInfo]:
        return Call("GET", f"/snapshots/{_seg(snapshot_id)}", _model(snapshot_schema.SnapshotInfo))

    @staticmethod
    def list_snapshots(labels: Mapping[str, str] | None) -> Call[snapshot_schema.SnapshotList]:
        params = [("label", f"{k}={v}") for k, v in (labels or {}).items()]
        return Call("GET", "/snapshots", _model(snapshot_schema.SnapshotList), params=params)

    @staticmethod
    def update_snapshot(snapshot_id: str, request: snapshot_schema.SnapshotUpdate
                        ) -> Call[snapshot_schema.SnapshotInfo]:
        # Setting labels twice sets them once.
        return Call("PATCH", f"/snapshots/{_seg(snapshot_id)}",
                    _model(snapshot_schema.SnapshotInfo), json=_body(request),
                    retry=Retry.IDEMPOTENT)

    @staticmethod
    def delete_snapshot(snapshot_id: str) -> Call[snapshot_schema.SnapshotDeleted]:
        return Call("DELETE", f"/snapshots/{_seg(snapshot_id)}",
                    _model(snapshot_schema.SnapshotDeleted))

    @staticmethod
    def list_images() -> Call[image_schema.ImageList]:
        return Call("GET", "/images", _model(image_schema.ImageList))

    @staticmethod
    def pull_image(image: str) -> Call[image_schema.ImageInfo]:
        # Answers once the image is unpacked, which may take minutes for a big one.
        return Call("POST", "/images/pull", _model(image_schema.ImageInfo),
                    json=_body(image_schema.PullImageRequest(image=image)), timeout=_long(3600))

    @staticmethod
    def remove_image(name: str) -> Call[image_schema.ImagesRemoved]:
        return Call("DELETE", f"/images/{_seg(name)}", _model(image_schema.ImagesRemoved))

    @staticmethod
    def prune_images() -> Call[image_schema.ImagesRemoved]:
        return Call("POST", "/images/prune", _model(image_schema.ImagesRemoved),
                    timeout=_long(600))

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
