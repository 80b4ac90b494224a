# Generated from async_client.py by scripts/unasync.py: do not edit by hand.
# Edit async_client.py, then run `python scripts/unasync.py`; the tests fail while
# this file is stale. Its imports keep the source's order, and an `async with` nested
# around a `with` stays nested here.
# ruff: noqa: I001, SIM117
"""The client: :class:`SandboxClient` and its :class:`Sandbox` handles.

Example::

    with SandboxClient() as client:
        with client.create_sandbox() as sb:
            r = sb.exec("python3 -c 'print(6*7)'")
            assert r.stdout == "42\\n" and r.exit_code == 0

``async_client.py`` is the source of both twins: ``scripts/unasync.py`` writes the blocking one,
``sync_client.py``, from it by renaming tokens. Where the two differ, this one calls helpers
of ``_sync_io``; the other module has helpers of the same names.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar, Unpack

import httpx

from orchard.env import browser_schema, http_schema, image_schema, schema, snapshot_schema
from orchard.env.client import errors
from orchard.env.client._sync_io import (
    for_each,
    open_file,
    remove_file,
    replace_file,
    sleep,
)
from orchard.env.client.sync_pty import PtySession
from orchard.env.client.base import (
    CHUNK_SIZE,
    DEFAULT_READY_TIMEOUT,
    BaseClient,
    ClientOptions,
    SandboxBase,
    log,
)
from orchard.env.client.calls import (
    API,
    WAIT_MARGIN,
    Call,
    ExecOptions,
    exec_request,
    parse_event,
)
from orchard.env.client.http_errors import download_errors, wire_errors
from orchard.env.client.results import ExecEvent, ExecResult, ProcessOutputResult

T = TypeVar("T")


class SandboxClient(BaseClient):
    """Talks to an Orchard orchestrator; deletes the sandboxes it created when closed.

    ``base_url`` and ``api_key`` default to ``ORCHARD_URL`` and ``ORCHARD_API_KEY``.
    ``SandboxClient.local()`` starts a private orchestrator in this process instead.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        """``transport`` carries the requests instead of httpx's network transport (e.g.
        ``httpx.MockTransport`` in a test); the cleanup on SIGINT/SIGTERM still uses the
        network. The other options are :class:`BaseClient`'s."""
        super().__init__(base_url, **options)
        self._http = httpx.Client(**self._http_options(), transport=transport)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.cleanup_all()
        finally:
            self._http.close()
            self._release()

    def _send(
        self, call: Call[Any], content: Callable[[], Any] | None = None
    ) -> httpx.Response:
        attempt = 0
        while True:
            try:
                request = self._request(self._http, call, content() if content else None)
                response = self._http.send(request, stream=call.stream)
                if call.stream and response.is_error:
                    response.read()  # a small JSON error body: its detail goes in the error
            except httpx.TransportError as exc:
                delay = self._delay_after_error(call, attempt, exc)
            else:
                if not response.is_error:
                    return response
                delay = self._delay_after_response(call, attempt, response)
            attempt += 1
            sleep(delay)

    def _call(self, call: Call[T], content: Callable[[], Any] | None = None) -> T:
        return call.parse(self._send(call, content))

    # --- sandboxes ---

    def create_sandbox(
        self,
        image: str | None = None,
        *,
        block_network: bool = True,
        egress: Sequence[str] | None = None,
        sandbox_id: str | None = None,
        cpu: str | None = None,
        memory: str | None = None,
        pids: int | None = None,
        ttl: float | None = None,
        disk: str | None = None,
        timeout: float | None = None,
        labels: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        session: str | None = None,
        model_proxy: bool = False,
        from_snapshot: str | None = None,
        workdir: str | None = None,
        wait: bool = True,
    ) -> Sandbox:
        """Create a sandbox and, unless ``wait=False``, wait until it can run commands.

        ``timeout``: seconds it may take to become ready (the server fails it after that;
        default 120 s of waiting here and the server's pending_timeout there). ``ttl``:
        seconds it lives (default: the server's, 2 h). ``image``: "host" unless given, or
        the snapshot's with ``from_snapshot`` (which starts it from that snapshot's files);
        a name that ``orchard image build`` tagged is that build's files, env and workdir.
        ``workdir``: where execs run unless they say (default: the image's, else /workspace).
        """
        request = self.create_request(
            image, sandbox_id, block_network=block_network,
            egress=None if egress is None else list(egress), cpu=cpu, memory=memory,
            pids=pids, disk=disk, ttl=ttl, timeout=timeout, labels=dict(labels or {}),
            env=dict(env or {}), session=session, model_proxy=model_proxy,
            from_snapshot=from_snapshot, workdir=workdir,
        )  # fmt: skip
        sandbox = Sandbox(self, self._call(API.create_sandbox(request)))
        self._remember(sandbox.id)
        if wait:
            try:
                sandbox.wait_ready(timeout or DEFAULT_READY_TIMEOUT)
            except errors.OrchardError:
                self._discard(sandbox.id)  # the caller gets no handle to delete it with
                raise
        return sandbox

    def get_sandbox(self, sandbox_id: str) -> Sandbox:
        return Sandbox(self, self._call(API.get_sandbox(sandbox_id)))

    def list_sandboxes(
        self, labels: Mapping[str, str] | None = None
    ) -> list[schema.SandboxInfo]:
        """All sandboxes, or those carrying every one of ``labels``."""
        return (self._call(API.list_sandboxes(labels))).sandboxes

    def events(
        self,
        *,
        session: str | None = None,
        sandbox_id: str | None = None,
        labels: Mapping[str, str] | None = None,
        after: int = 0,
        page_size: int = 1000,
    ) -> list[schema.SandboxEvent]:
        """Every event (after seq ``after``) of a session, a sandbox and/or with ``labels``,
        oldest first: the sandbox side of a rollout's trace. Deleted sandboxes' too."""
        out: list[schema.SandboxEvent] = []
        while True:
            page = self._call(API.events(session, sandbox_id, labels, after, page_size))
            out += page.events
            if len(page.events) < page_size:
                return out
            after = page.next_after

    def delete_sandbox(self, sandbox_id: str) -> schema.DeleteResponse:
        result = self._call(API.delete_sandbox(sandbox_id))
        self._forget(sandbox_id)
        return result

    def _discard(self, sandbox_id: str) -> None:
        try:
            self.delete_sandbox(sandbox_id)
        except errors.OrchardError as exc:
            log.warning("orchard: could not delete sandbox %s: %s", sandbox_id, exc)

    def cleanup_all(self) -> None:
        """Delete every sandbox this client created and has not deleted yet (best effort)."""
        for_each(self._discard, list(self._created))

    # --- snapshots ---

    def get_snapshot(self, snapshot_id: str) -> snapshot_schema.SnapshotInfo:
        return self._call(API.get_snapshot(snapshot_id))

    def list_snapshots(
        self, labels: Mapping[str, str] | None = None
    ) -> list[snapshot_schema.SnapshotInfo]:
        return (self._call(API.list_snapshots(labels))).snapshots

    def update_snapshot(
        self, snapshot_id: str, *, labels: Mapping[str, str | None]
    ) -> snapshot_schema.SnapshotInfo:
        """Set labels of a snapshot; a ``None`` value removes that label."""
        request = snapshot_schema.SnapshotUpdate(labels=dict(labels))
        return self._call(API.update_snapshot(snapshot_id, request))

    def delete_snapshot(self, snapshot_id: str) -> snapshot_schema.SnapshotDeleted:
        """Its files stay while sandboxes started from it live."""
        return self._call(API.delete_snapshot(snapshot_id))

    # --- images (a local-backend orchestrator's cache) ---

    def list_images(self) -> image_schema.ImageList:
        """The images the server has unpacked: names, size, last use, sandboxes on each."""
        return self._call(API.list_images())

    def pull_image(self, image: str) -> image_schema.ImageInfo:
        """Pull a registry image now (asking the registry again if a tag is cached)."""
        return self._call(API.pull_image(image))

    def remove_image(self, name: str) -> image_schema.ImagesRemoved:
        """Remove an image by name or digest; ConflictError while a sandbox runs on it."""
        return self._call(API.remove_image(name))

    def prune_images(self) -> image_schema.ImagesRemoved:
        """Remove every image no sandbox runs on."""
        return self._call(API.prune_images())

    # --- service ---

    def health(self) -> schema.Health:
        return self._call(API.health())

    def resources(self) -> schema.Resources:
        return self._call(API.resources())

    def get_job(self, job_id: str) -> ExecResult:
        return self._call(API.get_job(job_id))

    def wait_job(self, job_id: str, timeout: float = 60.0) -> ExecResult:
        """The job once finished, or as it is after ``timeout`` (check ``.finished``)."""
        return self._call(API.wait_job(job_id, timeout))


class Sandbox(SandboxBase):
    """A handle on one sandbox; ``with`` deletes the sandbox on exit."""

    def __init__(self, client: SandboxClient, info: schema.SandboxInfo) -> None:
        super().__init__(info)
        self._client = client

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.delete()

    # --- lifecycle ---

    def refresh(self) -> schema.SandboxInfo:
        self.info = self._client._call(API.get_sandbox(self.id))
        return self.info

    def wait_ready(self, timeout: float = DEFAULT_READY_TIMEOUT) -> schema.SandboxInfo:
        """Raises :class:`SandboxNotReady` if it failed, :class:`WaitTimeout` if still pending."""
        self.info = self._client._call(API.wait_sandbox(self.id, timeout))
        return self.info

    def heartbeat(self) -> schema.SandboxInfo:
        """Report liveness: once a sandbox beats, missing beats for heartbeat_timeout reap it."""
        self.info = self._client._call(API.heartbeat(self.id))
        return self.info

    def delete(self) -> None:
        self._client.delete_sandbox(self.id)

    # --- branching ---

    def snapshot(
        self,
        snapshot_id: str | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        ttl: float | None = None,
        keep: bool = False,
    ) -> snapshot_schema.SnapshotInfo:
        """Keep its files (not its processes) as a snapshot to create sandboxes from: for
        ``ttl`` seconds (default: the server's snapshot_ttl), or until deleted with ``keep``."""
        request = snapshot_schema.SnapshotRequest(
            snapshot_id=snapshot_id, labels=dict(labels or {}), ttl=ttl, keep=keep)
        return self._client._call(API.snapshot(self.id, request))

    def fork(
        self,
        count: int = 1,
        *,
        labels: Mapping[str, str] | None = None,
        ttl: float | None = None,
        keep_snapshot: bool = False,
        wait: bool = True,
    ) -> list[Sandbox]:
        """``count`` new sandboxes starting from its files as they are now."""
        request = snapshot_schema.ForkRequest(count=count, labels=dict(labels or {}), ttl=ttl,
                                     keep_snapshot=keep_snapshot)
        made = self._client._call(API.fork(self.id, request))
        forks = [Sandbox(self._client, info) for info in made.sandboxes]
        for sandbox in forks:
            self._client._remember(sandbox.id)
        # They start side by side on the server; waiting in turn costs only the slowest.
        for sandbox in forks if wait else ():
            sandbox.wait_ready()
        return forks

    def browser(
        self, action: browser_schema.BrowserVerb = "observe", **params: Any
    ) -> browser_schema.BrowserObservation:
        """One action in the sandbox's browser (goto url=, click id=, type id= text=, select,
        scroll, press key=, back, tab op=; screenshot=True adds a PNG), and the page after."""
        request = browser_schema.BrowserAction(action=action, **params)
        return self._client._call(API.browser(self.id, request))

    def http(
        self,
        port: int,
        path: str = "/",
        method: http_schema.Method = "GET",
        *,
        json: Any = None,
        body: str = "",
        headers: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> http_schema.ServiceResponse:
        """A request to a service this sandbox serves on its own 127.0.0.1:``port``."""
        request = http_schema.service_request(port, path, method, json, body, headers, timeout)
        return self._client._call(API.http(self.id, request))

    def pause(self) -> schema.SandboxInfo:
        """Freeze its processes (memory is kept); execs are refused until :meth:`resume`."""
        self.info = self._client._call(API.pause(self.id))
        return self.info

    def resume(self) -> schema.SandboxInfo:
        self.info = self._client._call(API.resume(self.id))
        return self.info

    # --- commands ---

    def exec(
        self, command: str | Sequence[str], **options: Unpack[ExecOptions]
    ) -> ExecResult:
        """Run to completion. A string goes through ``/bin/sh -c``; a list is an argv."""
        result = self._client._call(API.exec(self.id, exec_request(command, **options)))
        # The server stopped waiting (a hung agent, a long queue): follow the job instead.
        while not isinstance(result, ExecResult) or not result.finished:
            result = self._client.wait_job(result.job_id, WAIT_MARGIN)
        return result

    def submit(
        self, command: str | Sequence[str], **options: Unpack[ExecOptions]
    ) -> schema.JobAccepted:
        """Start a job and return at once; follow it with :meth:`get_job` / ``wait_job``."""
        return self._client._call(API.submit(self.id, exec_request(command, **options)))

    exec_async_job = submit  # the reference SDK's name

    def stream(
        self, command: str | Sequence[str], **options: Unpack[ExecOptions]
    ) -> Iterator[ExecEvent]:
        """Output chunks as they come, then one ``exit`` event with the job (``for``).

        The command starts when iteration does.
        """
        response = self._client._send(API.stream(self.id, exec_request(command, **options)))
        with contextlib.closing(response):
            with wire_errors(f"streaming from sandbox {self.id}"):
                for line in response.iter_lines():
                    if line:
                        yield parse_event(line)

    def get_job(self, job_id: str) -> ExecResult:
        return self._client.get_job(job_id)

    def start_process(
        self, command: str | Sequence[str], **options: Unpack[ExecOptions]
    ) -> schema.ProcessInfo:
        """Start a long-lived background process (a server, a watcher)."""
        return self._client._call(
            API.start_process(self.id, exec_request(command, **options))
        )

    def list_processes(self) -> list[schema.ProcessInfo]:
        return (self._client._call(API.list_processes(self.id))).processes

    def get_process(self, process_id: str | int) -> schema.ProcessInfo:
        return self._client._call(API.get_process(self.id, process_id))

    def process_output(
        self, process_id: str | int, stdout_offset: int = 0, stderr_offset: int = 0
    ) -> ProcessOutputResult:
        """Output past the given offsets; pass the returned offsets back to read on."""
        return self._client._call(
            API.process_output(self.id, process_id, stdout_offset, stderr_offset)
        )

    def kill_process(self, process_id: str | int) -> schema.ProcessInfo:
        return self._client._call(API.kill_process(self.id, process_id))

    def apply_patch(
        self, patch: str, timeout: float = 60.0, cwd: str | None = None
    ) -> schema.PatchResponse:
        request = schema.PatchRequest(patch=patch, timeout_seconds=timeout, cwd=cwd)
        return self._client._call(API.apply_patch(self.id, request))

    def pty(self, command: str = "bash", cols: int = 80, rows: int = 24) -> PtySession:
        """An open terminal; close it (or use it in ``with``) where it was opened."""
        path, params = API.pty(self.id, command, cols, rows)
        return PtySession.open(self._client._http, path, params)

    # --- files ---

    def upload_content(
        self, data: bytes | str, path: str, mode: int | None = None
    ) -> schema.FileWriteResult:
        """Write a small file in one JSON request; use :meth:`upload_file` for big ones."""
        return self._client._call(API.upload(self.id, path, data, mode))

    def upload_file(
        self,
        source: str | os.PathLike[str] | Iterable[bytes],
        path: str,
        mode: int | None = None,
    ) -> schema.FileWriteResult:
        """Stream a local file (or an ``Iterable`` of byte chunks) to ``path``."""
        if isinstance(source, str | os.PathLike):
            local = Path(source)
            return self._client._call(
                API.upload_raw(self.id, path, mode, replayable=True), lambda: _file_chunks(local)
            )
        chunks = source
        return self._client._call(
            API.upload_raw(self.id, path, mode, replayable=False), lambda: chunks
        )

    def download_content(self, path: str) -> bytes:
        response = self._client._send(API.download_raw(self.id, path))
        with contextlib.closing(response):
            with download_errors(self.id, path):
                return response.read()

    def download_file(self, path: str, local_path: str | os.PathLike[str]) -> int:
        """Stream ``path`` to ``local_path``; returns the byte count.

        The data lands in ``<local_path>.part`` first, so a failed download leaves no
        truncated file under the real name.
        """
        target = Path(local_path)
        partial = target.with_name(target.name + ".part")
        response = self._client._send(API.download_raw(self.id, path))
        size = 0
        try:
            with contextlib.closing(response), open_file(partial, "wb") as out:
                with download_errors(self.id, path):
                    for chunk in response.iter_bytes(CHUNK_SIZE):
                        out.write(chunk)
                        size += len(chunk)
            replace_file(partial, target)
        except BaseException:
            remove_file(partial)
            raise
        return size

    def list_files(self, path: str = ".") -> schema.FileList:
        return self._client._call(API.list_files(self.id, path))

    def mkdir(self, path: str) -> None:
        self._client._call(API.mkdir(self.id, path))

    def remove(self, path: str, recursive: bool = False) -> None:
        self._client._call(API.remove(self.id, path, recursive))


def _file_chunks(path: Path) -> Iterator[bytes]:
    with open_file(path, "rb") as f:
        while chunk := f.read(CHUNK_SIZE):
            yield chunk
