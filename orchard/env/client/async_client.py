"""The client: :class:`AsyncSandboxClient`, which makes :class:`AsyncSandbox` handles.

Example::

    async with AsyncSandboxClient() as client:
        async with await client.create_sandbox() as sb:
            r = await sb.exec("python3 -c 'print(6*7)'")
            assert r.stdout == "42\\n" and r.exit_code == 0

The client holds the calls about the service as a whole (creating and listing sandboxes,
snapshots, images, pools, jobs); ``async_sandbox.py`` holds the handle's calls about one
sandbox. Both are the sources of their twins: ``scripts/unasync.py`` writes the blocking
``sync_client.py`` and ``sync_sandbox.py`` from them by renaming tokens. Where the two differ,
these call helpers of ``_async_io``; the blocking ones call helpers of the same names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self, TypeVar, Unpack

import httpx

from orchard.env import image_schema, schema, snapshot_schema
from orchard.env.client import errors
from orchard.env.client._async_io import for_each, sleep
from orchard.env.client.async_sandbox import AsyncSandbox
from orchard.env.client.base import (
    DEFAULT_READY_TIMEOUT,
    BaseClient,
    ClientOptions,
    log,
)
from orchard.env.client.calls import API, Call
from orchard.env.client.results import ExecResult

T = TypeVar("T")


class AsyncSandboxClient(BaseClient):
    """Talks to an Orchard orchestrator; deletes the sandboxes it created when closed.

    ``base_url`` and ``api_key`` default to ``ORCHARD_URL`` and ``ORCHARD_API_KEY``.
    ``AsyncSandboxClient.local()`` starts a private orchestrator in this process instead.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        """``transport`` carries the requests instead of httpx's network transport (e.g.
        ``httpx.MockTransport`` in a test); the cleanup on SIGINT/SIGTERM still uses the
        network. The other options are :class:`BaseClient`'s."""
        super().__init__(base_url, **options)
        self._http = httpx.AsyncClient(**self._http_options(), transport=transport)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        try:
            await self.cleanup_all()
        finally:
            await self._http.aclose()
            self._release()

    async def _send(
        self, call: Call[Any], content: Callable[[], Any] | None = None
    ) -> httpx.Response:
        attempt = 0
        while True:
            try:
                request = self._request(self._http, call, content() if content else None)
                response = await self._http.send(request, stream=call.stream)
                if call.stream and response.is_error:
                    await response.aread()  # a small JSON error body: its detail goes in the error
            except httpx.TransportError as exc:
                delay = self._delay_after_error(call, attempt, exc)
            else:
                if not response.is_error:
                    return response
                delay = self._delay_after_response(call, attempt, response)
            attempt += 1
            await sleep(delay)

    async def _call(self, call: Call[T], content: Callable[[], Any] | None = None) -> T:
        return call.parse(await self._send(call, content))

    # --- sandboxes ---

    async def create_sandbox(
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
    ) -> AsyncSandbox:
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
        sandbox = AsyncSandbox(self, await self._call(API.create_sandbox(request)))
        self._remember(sandbox.id)
        if wait:
            try:
                await sandbox.wait_ready(timeout or DEFAULT_READY_TIMEOUT)
            except errors.OrchardError:
                await self._discard(sandbox.id)  # the caller gets no handle to delete it with
                raise
        return sandbox

    async def get_sandbox(self, sandbox_id: str) -> AsyncSandbox:
        return AsyncSandbox(self, await self._call(API.get_sandbox(sandbox_id)))

    async def list_sandboxes(
        self, labels: Mapping[str, str] | None = None
    ) -> list[schema.SandboxInfo]:
        """All sandboxes, or those carrying every one of ``labels``."""
        return (await self._call(API.list_sandboxes(labels))).sandboxes

    async def events(
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
            page = await self._call(API.events(session, sandbox_id, labels, after, page_size))
            out += page.events
            if len(page.events) < page_size:
                return out
            after = page.next_after

    async def delete_sandbox(self, sandbox_id: str) -> schema.DeleteResponse:
        result = await self._call(API.delete_sandbox(sandbox_id))
        self._forget(sandbox_id)
        return result

    async def _discard(self, sandbox_id: str) -> None:
        try:
            await self.delete_sandbox(sandbox_id)
        except errors.OrchardError as exc:
            log.warning("orchard: could not delete sandbox %s: %s", sandbox_id, exc)

    async def cleanup_all(self) -> None:
        """Delete every sandbox this client created and has not deleted yet (best effort)."""
        await for_each(self._discard, list(self._created))

    # --- snapshots ---

    async def get_snapshot(self, snapshot_id: str) -> snapshot_schema.SnapshotInfo:
        return await self._call(API.get_snapshot(snapshot_id))

    async def list_snapshots(
        self, labels: Mapping[str, str] | None = None
    ) -> list[snapshot_schema.SnapshotInfo]:
        return (await self._call(API.list_snapshots(labels))).snapshots

    async def update_snapshot(
        self, snapshot_id: str, *, labels: Mapping[str, str | None]
    ) -> snapshot_schema.SnapshotInfo:
        """Set labels of a snapshot; a ``None`` value removes that label."""
        request = snapshot_schema.SnapshotUpdate(labels=dict(labels))
        return await self._call(API.update_snapshot(snapshot_id, request))

    async def delete_snapshot(self, snapshot_id: str) -> snapshot_schema.SnapshotDeleted:
        """Its files stay while sandboxes started from it live."""
        return await self._call(API.delete_snapshot(snapshot_id))

    # --- images (a local-backend orchestrator's cache) ---

    async def list_images(self) -> image_schema.ImageList:
        """The images the server has unpacked: names, size, last use, sandboxes on each."""
        return await self._call(API.list_images())

    async def pull_image(self, image: str) -> image_schema.ImageInfo:
        """Pull a registry image now (asking the registry again if a tag is cached)."""
        return await self._call(API.pull_image(image))

    async def remove_image(self, name: str) -> image_schema.ImagesRemoved:
        """Remove an image by name or digest; ConflictError while a sandbox runs on it."""
        return await self._call(API.remove_image(name))

    async def prune_images(self) -> image_schema.ImagesRemoved:
        """Remove every image no sandbox runs on."""
        return await self._call(API.prune_images())

    # --- service ---

    async def health(self) -> schema.Health:
        return await self._call(API.health())

    async def resources(self) -> schema.Resources:
        return await self._call(API.resources())

    async def pools(self) -> list[schema.PoolInfo]:
        """The server's warm pools (orchard.yaml's ``pools:``): each one's entry, the size it
        keeps, its ready and starting sandboxes, hits and misses; empty if it has none."""
        return await self._call(API.pools())

    async def get_job(self, job_id: str) -> ExecResult:
        return await self._call(API.get_job(job_id))

    async def wait_job(self, job_id: str, timeout: float = 60.0) -> ExecResult:
        """The job once finished, or as it is after ``timeout`` (check ``.finished``)."""
        return await self._call(API.wait_job(job_id, timeout))
