"""Branching: forks (new sandboxes from a snapshot of one taken now), pause and resume."""

from __future__ import annotations

import time

from pydantic import ValidationError

from orchard.env.backends.base import Backend, BackendError
from orchard.env.config import Settings
from orchard.env.errors import BadRequest, Conflict, Overloaded
from orchard.env.events import EventLog
from orchard.env.schema import CreateSandboxRequest, EventKind, SandboxInfo, SandboxStatus
from orchard.env.service.background import Background
from orchard.env.service.lifecycle import Lifecycle
from orchard.env.service.records import SandboxRecords, utc_time
from orchard.env.service.snapshots import BRANCHABLE, Snapshots
from orchard.env.snapshot_schema import ForkRequest, ForkResponse, SnapshotRequest
from orchard.env.state.base import StateStore

FORK_LABEL = "orchard.dev/fork-of"


class Branching:
    def __init__(self, records: SandboxRecords, lifecycle: Lifecycle, snapshots: Snapshots,
                 store: StateStore, backend: Backend, settings: Settings, events: EventLog,
                 background: Background) -> None:
        self.records = records
        self.lifecycle = lifecycle
        self.snapshots = snapshots
        self.store = store
        self.backend = backend
        self.settings = settings
        self.events = events
        self.background = background

    # --- forks ----------------------------------------------------------------------------

    async def fork(self, sid: str, req: ForkRequest) -> ForkResponse:
        """``count`` new sandboxes starting from a snapshot of ``sid`` taken now."""
        rec = await self.records.get(sid)
        if rec.status not in BRANCHABLE:
            raise Conflict(f"sandbox {sid} is {rec.status.value}: only a running or paused "
                           "sandbox can be forked")
        live = self.records.active_count()
        if live + req.count > self.settings.max_sandboxes:
            raise Overloaded(f"forking {req.count} would make {live + req.count} live sandboxes, "
                             f"over the limit of {self.settings.max_sandboxes}; delete some or "
                             "fork fewer", 2)
        # Checked before the snapshot, so that a create it would refuse leaves nothing behind.
        try:
            base = CreateSandboxRequest(
                image=rec.image, block_network=rec.block_network, egress=rec.egress,
                cpu=rec.cpu, memory=rec.memory, pids=rec.pids, disk=rec.disk, env=rec.env,
                ttl=req.ttl, workdir=rec.workdir,
                labels={**rec.labels, **req.labels, FORK_LABEL: sid},
                exclusive_exec=rec.exclusive_exec)
        except ValidationError as e:  # the source's labels and the fork's, over 64 together
            raise BadRequest(f"cannot fork {sid}: {e.errors()[0]['msg']}; give the forks fewer "
                             "labels (they carry the source's labels and these)") from None
        snap = await self.snapshots.snapshot(sid, SnapshotRequest(labels={FORK_LABEL: sid},
                                                                  memory=req.memory))
        base = base.model_copy(update={"from_snapshot": snap.snapshot_id})
        forks = [await self.lifecycle.create(base, queued=True) for _ in range(req.count)]
        if not req.keep_snapshot:
            # Deleted once every fork has pinned its files (or failed): until then the
            # collector must not take them.
            self.background.spawn(self._drop_after_launch(snap.snapshot_id,
                                                          [f.sandbox_id for f in forks]))
        return ForkResponse(snapshot_id=snap.snapshot_id, sandboxes=forks)

    async def _drop_after_launch(self, snap_id: str, sandbox_ids: list[str]) -> None:
        await self.lifecycle.launched(sandbox_ids)
        await self.snapshots.delete_snapshot(snap_id)

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
            rec = await self.records.get(sid)
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

            rec = await self.records.update(sid, change)
            if rec is None or rec.status != target:  # deleted meanwhile: leave it be
                raise Conflict(f"sandbox {sid} changed while it was {verb}d; check GET "
                               f"/sandboxes/{sid}")
        await self.events.record(rec, EventKind.paused if target == SandboxStatus.paused
                                 else EventKind.resumed)
        return rec
