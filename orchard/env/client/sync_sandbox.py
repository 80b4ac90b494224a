# Generated from async_sandbox.py by scripts/unasync.py: do not edit by hand.
# Edit async_sandbox.py, then run `python scripts/unasync.py`; the tests fail while
# this file is stale. Its imports keep the source's order, and an `async with` nested
# around a `with` stays nested here.
# ruff: noqa: I001, SIM117
"""The handle on one sandbox: :class:`Sandbox`, what the client's creates return.

Its methods act on that one sandbox (commands, files, processes, branching) through the
client that made it. ``scripts/unasync.py`` writes the blocking twin, ``sync_sandbox.py``,
from this module as it does the client's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, Unpack

from orchard.env import browser_schema, http_schema, schema, snapshot_schema
from orchard.env.client._sync_io import open_file, remove_file, replace_file
from orchard.env.client.sync_pty import PtySession
from orchard.env.client.base import CHUNK_SIZE, DEFAULT_READY_TIMEOUT, SandboxBase
from orchard.env.client.calls import API, WAIT_MARGIN, ExecOptions, exec_request, parse_event
from orchard.env.client.http_errors import download_errors, wire_errors
from orchard.env.client.results import ExecEvent, ExecResult, ProcessOutputResult

if TYPE_CHECKING:
    # The client module imports this one to make handles; a handle only calls its client.
    from orchard.env.client.sync_client import SandboxClient


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

    def usage(self) -> schema.SandboxUsage:
        """CPU time, memory, processes and disk it uses now (None: not measured here)."""
        return self._client._call(API.usage(self.id))

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
        memory: bool = False,
    ) -> snapshot_schema.SnapshotInfo:
        """Keep its files as a snapshot to create sandboxes from: for ``ttl`` seconds
        (default: the server's snapshot_ttl), or until deleted with ``keep``. ``memory``: its
        running processes too, continued in every sandbox created from it."""
        request = snapshot_schema.SnapshotRequest(
            snapshot_id=snapshot_id, labels=dict(labels or {}), ttl=ttl, keep=keep,
            memory=memory)
        return self._client._call(API.snapshot(self.id, request))

    def fork(
        self,
        count: int = 1,
        *,
        labels: Mapping[str, str] | None = None,
        ttl: float | None = None,
        keep_snapshot: bool = False,
        wait: bool = True,
        memory: bool = False,
    ) -> list[Sandbox]:
        """``count`` new sandboxes starting from its files as they are now (with ``memory``,
        from its running processes too)."""
        request = snapshot_schema.ForkRequest(count=count, labels=dict(labels or {}), ttl=ttl,
                                     keep_snapshot=keep_snapshot, memory=memory)
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
        """One action in the sandbox's browser (goto url=, click id=, dblclick, hover, focus,
        type id= text=, select, scroll, press key= (with modifiers: Control+a), back, forward,
        tab op=; screenshot=True adds a PNG), and the page after."""
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
