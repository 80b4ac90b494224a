"""The service's branching half (a mixin): snapshots, forks, pause and resume.

A snapshot is a sandbox's files at one moment (not its processes or memory). Its record lives
in the store; its files live in the backend, which keeps them while any sandbox built on them
lives, even after the record is deleted. The reconcile pass removes the files of deleted and
expired snapshots once nothing uses them, and files that have no record at all.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from orchard.env.backends.base import (
    Backend,
    BackendError,
    SnapshotTooLarge,
)
from orchard.env.errors import Conflict, NotFound, Overloaded, TooLarge
from orchard.env.exec_jobs import utc_time
from orchard.env.schema import (
    CreateSandboxRequest,
    EventKind,
    ForkRequest,
    ForkResponse,
    SandboxInfo,
    SandboxStatus,
    SnapshotInfo,
    SnapshotRequest,
    SnapshotStatus,
)

if TYPE_CHECKING:
    from orchard.env.config import Settings
    from orchard.env.events import EventLog
    from orchard.env.state.base import StateStore

log = logging.getLogger("orchard.env")
FORK_LABEL = "orchard.dev/fork-of"
BRANCHABLE = (SandboxStatus.running, SandboxStatus.paused)
# A snapshot still being taken after this long belonged to a replica that died mid-copy.
STALE_PENDING = 3600.0


class Branching:
    # What it uses of SandboxService, which sets these up.
    store: StateStore
    backend: Backend
    settings: Settings
    events: EventLog
    _live: dict[str, SandboxInfo]
    _tasks: set[asyncio.Task[Any]]
    _launches: dict[str, asyncio.Task[None]]
    _update: Callable[..., Awaitable[SandboxInfo | None]]
    get: Callable[[str], Awaitable[SandboxInfo]]
    create: Callable[..., Awaitable[SandboxInfo]]

    # --- snapshots ------------------------------------------------------------------------

    async def snapshot(self, sid: str, req: SnapshotRequest) -> SnapshotInfo:
        rec = await self.get(sid)
        if rec.status not in BRANCHABLE:
            raise Conflict(f"sandbox {sid} is {rec.status.value}: only a running or paused "
                           "sandbox can be snapshotted")
        snap_id = req.snapshot_id or f"snap-{uuid.uuid4().hex[:12]}"
        now = time.time()
        info = SnapshotInfo(
            snapshot_id=snap_id, sandbox_id=sid, image=rec.image,
            status=SnapshotStatus.pending, size_bytes=0, created_at=utc_time(now),
            expires_at=utc_time(now + (req.ttl or self.settings.snapshot_ttl)), labels=req.labels,
            parent=rec.from_snapshot, backend=self.backend.name)
        async with self.store.lock(f"snapshot:{snap_id}", ttl=15, timeout=30):
            if await self.store.get_snapshot(snap_id) is not None:
                raise Conflict(f"snapshot {snap_id} already exists; choose another "
                               "snapshot_id or delete it first")
            # Recorded before the files exist, so the collector never takes them for orphans.
            await self.store.put_snapshot(info)
        t0 = time.perf_counter()
        try:
            made = await self.backend.snapshot(sid, snap_id, rec.from_snapshot,
                                               self.settings.max_snapshot_bytes)
        except BaseException as e:
            await self.store.drop_snapshot(snap_id)
            if isinstance(e, SnapshotTooLarge):
                raise TooLarge(str(e)) from None
            if isinstance(e, BackendError):
                raise Conflict(f"snapshot of sandbox {sid} failed: {e}") from None
            raise
        info.status, info.size_bytes = SnapshotStatus.ready, made.size_bytes
        await self.store.put_snapshot(info)
        await self.events.record(rec, EventKind.snapshot, snapshot_id=snap_id,
                                 size_bytes=made.size_bytes,
                                 ms=round((time.perf_counter() - t0) * 1000, 3))
        return info

    async def get_snapshot(self, snap_id: str) -> SnapshotInfo:
        info = await self.store.get_snapshot(snap_id)
        if info is None or info.status == SnapshotStatus.deleted:
            raise NotFound(f"no snapshot {snap_id!r}; list them with GET /snapshots")
        return info

    async def list_snapshots(self, labels: dict[str, str] | None = None) -> list[SnapshotInfo]:
        want = (labels or {}).items()
        return [s for s in await self.store.list_snapshots()
                if s.status == SnapshotStatus.ready and want <= s.labels.items()]

    async def delete_snapshot(self, snap_id: str) -> bool:
        """Forget a snapshot; its files go once no sandbox uses them. False: none by that id."""
        async with self.store.lock(f"snapshot:{snap_id}", ttl=15, timeout=30):
            info = await self.store.get_snapshot(snap_id)
            if info is None or info.status == SnapshotStatus.deleted:
                return False
            info.status = SnapshotStatus.deleted
            await self.store.put_snapshot(info)
        await self._collect(info)
        return True

    async def snapshot_to_start(self, req: CreateSandboxRequest) -> SnapshotInfo:
        """The ready snapshot a create names; its image must be the one asked for, if any."""
        assert req.from_snapshot is not None
        info = await self.get_snapshot(req.from_snapshot)
        if info.status != SnapshotStatus.ready:
            raise Conflict(f"snapshot {info.snapshot_id} is still being taken; retry shortly")
        if req.image is not None and req.image != info.image:
            raise Conflict(f"snapshot {info.snapshot_id} is of image {info.image!r}, not "
                           f"{req.image!r}; leave 'image' out to use the snapshot's")
        return info

    async def collect_snapshots(self, now: float) -> None:
        """One pass: expire snapshots, remove unused files of deleted ones, and orphans."""
        try:
            on_backend: set[str] | None = await self.backend.list_snapshots()
        except Exception:  # noqa: BLE001 - never act on a partial view
            log.exception("backend snapshot list failed; skipping the orphan pass")
            on_backend = None
        recorded = await self.store.list_snapshots()
        for info in recorded:
            age = now - info.created_at.timestamp()
            expired = info.expires_at is not None and now > info.expires_at.timestamp()
            if (info.status == SnapshotStatus.ready and expired
                    or info.status == SnapshotStatus.pending and age > STALE_PENDING):
                await self.delete_snapshot(info.snapshot_id)
            elif info.status == SnapshotStatus.deleted:
                await self._collect(info)
        if on_backend is not None:
            for snap_id in on_backend - {s.snapshot_id for s in recorded}:
                log.info("removing orphan snapshot %s (no record)", snap_id)
                await self.backend.delete_snapshot(snap_id)

    async def _collect(self, info: SnapshotInfo) -> None:
        try:
            gone = await self.backend.delete_snapshot(info.snapshot_id)
        except BackendError as e:
            log.warning("removing snapshot %s failed (%s); retrying next pass",
                        info.snapshot_id, e)
            return
        if gone:
            await self.store.drop_snapshot(info.snapshot_id)

    # --- forks ----------------------------------------------------------------------------

    async def fork(self, sid: str, req: ForkRequest) -> ForkResponse:
        """``count`` new sandboxes starting from a snapshot of ``sid`` taken now."""
        rec = await self.get(sid)
        if rec.status not in BRANCHABLE:
            raise Conflict(f"sandbox {sid} is {rec.status.value}: only a running or paused "
                           "sandbox can be forked")
        live = len(self._live)
        if live + req.count > self.settings.max_sandboxes:
            raise Overloaded(f"forking {req.count} would make {live + req.count} live sandboxes, "
                             f"over the limit of {self.settings.max_sandboxes}; delete some or "
                             "fork fewer", 2)
        snap = await self.snapshot(sid, SnapshotRequest(labels={FORK_LABEL: sid}))
        base = CreateSandboxRequest(
            image=rec.image, block_network=rec.block_network, egress=rec.egress, cpu=rec.cpu,
            memory=rec.memory, pids=rec.pids, disk=rec.disk, env=rec.env, ttl=req.ttl,
            labels={**rec.labels, **req.labels, FORK_LABEL: sid},
            exclusive_exec=rec.exclusive_exec, from_snapshot=snap.snapshot_id)
        forks = [await self.create(base, queued=True) for _ in range(req.count)]
        if not req.keep_snapshot:
            # Deleted once every fork has pinned its files (or failed): until then the
            # collector must not take them.
            task = asyncio.create_task(self._drop_after_launch(snap.snapshot_id,
                                                               [f.sandbox_id for f in forks]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return ForkResponse(snapshot_id=snap.snapshot_id, sandboxes=forks)

    async def _drop_after_launch(self, snap_id: str, sandbox_ids: list[str]) -> None:
        launches = [t for s in sandbox_ids if (t := self._launches.get(s)) is not None]
        await asyncio.gather(*launches, return_exceptions=True)
        await self.delete_snapshot(snap_id)

    # --- pause ----------------------------------------------------------------------------

    async def pause(self, sid: str) -> SandboxInfo:
        """Freeze every process of a running sandbox (memory is kept)."""
        return await self._pause_or_resume(sid, SandboxStatus.running, SandboxStatus.paused)

    async def resume(self, sid: str) -> SandboxInfo:
        return await self._pause_or_resume(sid, SandboxStatus.paused, SandboxStatus.running)

    async def _pause_or_resume(self, sid: str, source: SandboxStatus,
                               target: SandboxStatus) -> SandboxInfo:
        verb = "pause" if target == SandboxStatus.paused else "resume"
        async with self.store.lock(f"pause:{sid}", ttl=15, timeout=30):
            rec = await self.get(sid)
            if rec.status == target:
                return rec  # idempotent, like delete
            if rec.status != source:
                raise Conflict(f"sandbox {sid} is {rec.status.value}: only a {source.value} "
                               f"sandbox can be {verb}d")
            try:
                if target == SandboxStatus.paused:
                    await self.backend.pause(sid)
                else:
                    await self.backend.resume(sid)
            except BackendError as e:
                raise Conflict(f"could not {verb} sandbox {sid}: {e}") from None

            def change(r: SandboxInfo) -> bool:
                if r.status != source:
                    return False
                r.status = target
                r.paused_at = utc_time(time.time()) if target == SandboxStatus.paused else None
                if target == SandboxStatus.running:
                    r.last_heartbeat = r.last_heartbeat and utc_time(time.time())
                return True

            rec = await self._update(sid, change)
            if rec is None or rec.status != target:  # deleted meanwhile: leave it be
                raise Conflict(f"sandbox {sid} changed while it was {verb}d; check GET "
                               f"/sandboxes/{sid}")
        await self.events.record(rec, EventKind.paused if target == SandboxStatus.paused
                                 else EventKind.resumed)
        return rec
