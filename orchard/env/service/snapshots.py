"""Snapshots: a sandbox's files at one moment (not its processes or memory).

A snapshot's record lives in the store; its files live in the backend, which keeps them while
any sandbox built on them lives, even after the record is deleted. The collector (a reconcile
loop) removes the files of deleted and expired snapshots once nothing uses them, and files
that have no record at all.
"""

from __future__ import annotations

import logging
import time
import uuid

from orchard.env.backends.base import (
    Backend,
    BackendError,
    CheckpointFailed,
    MemoryUnsupported,
    SnapshotTooLarge,
)
from orchard.env.build_schema import tag_label
from orchard.env.config import Settings
from orchard.env.errors import BadRequest, Conflict, NotFound, TooLarge, Unprocessable
from orchard.env.events import EventLog
from orchard.env.image_schema import ImageConfig
from orchard.env.schema import CreateSandboxRequest, EventKind, SandboxStatus
from orchard.env.service.reconciler import PartialPass, listed
from orchard.env.service.records import SandboxRecords, utc_time
from orchard.env.snapshot_schema import (
    CheckpointedProcess,
    SnapshotInfo,
    SnapshotRequest,
    SnapshotStatus,
    SnapshotUpdate,
)
from orchard.env.state.base import StateStore

log = logging.getLogger("orchard.env")
BRANCHABLE = (SandboxStatus.running, SandboxStatus.paused)
# A snapshot still being taken after this long belonged to a replica that died mid-copy.
STALE_PENDING = 3600.0


class Snapshots:
    def __init__(self, records: SandboxRecords, store: StateStore, backend: Backend,
                 settings: Settings, events: EventLog) -> None:
        self.records = records
        self.store = store
        self.backend = backend
        self.settings = settings
        self.events = events

    async def snapshot(self, sid: str, req: SnapshotRequest) -> SnapshotInfo:
        rec = await self.records.get(sid)
        if rec.status not in BRANCHABLE:
            raise Conflict(f"sandbox {sid} is {rec.status.value}: only a running or paused "
                           "sandbox can be snapshotted")
        snap_id = req.snapshot_id or f"snap-{uuid.uuid4().hex[:12]}"
        now = time.time()
        expires = None if req.keep else utc_time(now + (req.ttl or self.settings.snapshot_ttl))
        info = SnapshotInfo(
            snapshot_id=snap_id, sandbox_id=sid, image=rec.image,
            status=SnapshotStatus.pending, size_bytes=0, created_at=utc_time(now),
            expires_at=expires, labels=req.labels,
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
                                               self.settings.max_snapshot_bytes, req.memory)
        except BaseException as e:
            await self.store.drop_snapshot(snap_id)
            if isinstance(e, SnapshotTooLarge):
                raise TooLarge(str(e)) from None
            if isinstance(e, CheckpointFailed | MemoryUnsupported):
                raise Unprocessable(f"live snapshot of sandbox {sid} failed: {e}") from None
            if isinstance(e, BackendError):
                raise Conflict(f"snapshot of sandbox {sid} failed: {e}") from None
            raise
        info.status, info.size_bytes = SnapshotStatus.ready, made.size_bytes
        info.memory_bytes = made.memory_bytes
        info.processes = [CheckpointedProcess.model_validate(p) for p in made.processes]
        await self.store.put_snapshot(info)
        await self.events.record(rec, EventKind.snapshot, snapshot_id=snap_id,
                                 size_bytes=made.size_bytes, memory_bytes=made.memory_bytes,
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

    async def update_snapshot(self, snap_id: str, req: SnapshotUpdate) -> SnapshotInfo:
        """Set or remove labels of a snapshot (a build tags the snapshot it ended on)."""
        async with self.store.lock(f"snapshot:{snap_id}", ttl=15, timeout=30):
            info = await self.get_snapshot(snap_id)
            for key, value in req.labels.items():
                if value is None:
                    info.labels.pop(key, None)
                else:
                    info.labels[key] = value
            if len(info.labels) > 64:
                raise BadRequest(f"snapshot {snap_id} would carry {len(info.labels)} labels; "
                                 "the most is 64: remove some")
            await self.store.put_snapshot(info)
        return info

    async def built_image(self, name: str) -> tuple[SnapshotInfo, ImageConfig] | None:
        """The ready snapshot a build tagged ``name`` (the newest, if two builds raced), and
        the image config of that tag; None when no build made that name."""
        key = tag_label(name)
        tagged = [s for s in await self.list_snapshots() if key in s.labels]
        if not tagged:
            return None
        newest = max(tagged, key=lambda s: s.created_at)
        try:
            return newest, ImageConfig.model_validate_json(newest.labels[key])
        except ValueError:
            raise Conflict(f"snapshot {newest.snapshot_id} carries the image {name!r} with an "
                           f"unreadable config; rebuild the image") from None

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

    async def collect(self) -> None:
        """A reconcile pass: expire snapshots, remove unused files of deleted ones, and
        orphans. Raises PartialPass, after the rest, when the backend could not list its
        snapshots."""
        now = time.time()
        on_backend, unlisted = await listed(self.backend.list_snapshots())
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
        if unlisted is not None:
            raise PartialPass("backend snapshot list failed; skipped the orphan files: "
                              f"{unlisted}") from unlisted

    async def delete_all(self) -> None:
        """Delete every snapshot, and the files of those deleted earlier that nothing uses
        now (an embedded orchestrator's go with it)."""
        for snap in await self.store.list_snapshots():
            await self.delete_snapshot(snap.snapshot_id)
        try:
            await self.collect()
        except PartialPass as e:
            log.warning("snapshots left on stop: %s", e)

    async def _collect(self, info: SnapshotInfo) -> None:
        try:
            gone = await self.backend.delete_snapshot(info.snapshot_id)
        except BackendError as e:
            log.warning("removing snapshot %s failed (%s); retrying next pass",
                        info.snapshot_id, e)
            return
        if gone:
            await self.store.drop_snapshot(info.snapshot_id)
