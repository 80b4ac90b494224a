"""Sandbox records: the store's view of each sandbox, changed one locked step at a time, and
this replica's count of the live ones (what admission control reads).

Several replicas may share the store: every decision re-reads the record, and every change
goes through ``update`` under the record's lock, so two replicas never overwrite each other's
transitions (e.g. resurrect a deleted sandbox).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

from orchard.env.agent.client import AgentClient
from orchard.env.errors import Conflict, NotFound, WaitTimedOut
from orchard.env.schema import LimitReport, SandboxInfo, SandboxStatus
from orchard.env.state.base import StateStore

LIVE = (SandboxStatus.pending, SandboxStatus.running, SandboxStatus.paused)
# Marks a warm pool's sandbox not yet taken (its value: the pool's name); see pools.py.
POOL_LABEL = "orchard.pool"


def utc_time(ts: float | None = None) -> datetime:
    return datetime.fromtimestamp(time.time() if ts is None else ts, UTC)


def became_ready(limits: dict[str, LimitReport]) -> Callable[[SandboxInfo], bool]:
    """The change that marks a pending sandbox running, with the limits its backend reports."""
    def change(rec: SandboxInfo) -> bool:
        if rec.status != SandboxStatus.pending:
            return False
        rec.status, rec.ready_at, rec.limits = SandboxStatus.running, utc_time(), limits
        rec.progress = None
        return True
    return change


class RunningSandboxes(Protocol):
    """What execs and agent operations need of the lifecycle: a running sandbox's record and
    its agent, or the service error that says why there is none."""

    async def running(self, sid: str) -> tuple[SandboxInfo, AgentClient]: ...


class SandboxRecords:
    def __init__(self, store: StateStore) -> None:
        self.store = store
        # Live records as of the last reconcile pass plus this replica's own changes since:
        # approximate across replicas by one reconcile interval.
        self.live: dict[str, SandboxInfo] = {}

    def active_count(self) -> int:
        return len(self.live)

    async def insert(self, rec: SandboxInfo) -> None:
        """Record a new sandbox; Conflict if a live one has its id."""
        sid = rec.sandbox_id
        async with self.store.lock(f"record:{sid}", ttl=15, timeout=30):
            existing = await self.store.get_sandbox(sid)
            if existing is not None and existing.status in LIVE:
                raise Conflict(f"sandbox {sid} already exists ({existing.status.value}); "
                               "choose another sandbox_id or delete it first")
            await self.store.put_sandbox(rec)
        self.live[sid] = rec

    async def update(self, sid: str,
                     change: Callable[[SandboxInfo], bool]) -> SandboxInfo | None:
        """Apply change to the stored record under its lock; change returns False to leave
        it as it is. Returns the record as it now stands (None if there is none)."""
        async with self.store.lock(f"record:{sid}", ttl=15, timeout=30):
            rec = await self.store.get_sandbox(sid)
            if rec is None or not change(rec):
                return rec
            await self.store.put_sandbox(rec)
        if rec.status in LIVE:
            self.live[sid] = rec
        else:
            self.live.pop(sid, None)
        await self.store.publish(f"sandbox:{sid}")
        return rec

    async def read_live(self) -> dict[str, SandboxInfo]:
        """Every live record in the store, which then becomes this replica's count."""
        live = {r.sandbox_id: r for r in await self.store.list_sandboxes() if r.status in LIVE}
        self.live = dict(live)
        return live

    async def get(self, sid: str) -> SandboxInfo:
        """A sandbox's record, as its user sees it: a pool's sandbox is nobody's until taken,
        so nothing (read, pause, snapshot, fork) reaches it before."""
        rec = await self.store.get_sandbox(sid)
        if rec is None or POOL_LABEL in rec.labels:
            raise NotFound(f"no sandbox {sid!r}; list them with GET /sandboxes")
        return rec

    async def list(self, labels: dict[str, str] | None = None) -> list[SandboxInfo]:
        want = (labels or {}).items()
        # A pool's sandboxes are nobody's until taken.
        return [r for r in await self.store.list_sandboxes()
                if r.status != SandboxStatus.deleted and want <= r.labels.items()
                and POOL_LABEL not in r.labels]

    async def wait(self, sid: str, timeout: float) -> SandboxInfo:
        deadline = time.monotonic() + timeout
        async with self.store.subscribe(f"sandbox:{sid}") as changed:
            rec = await self.get(sid)
            while rec.status == SandboxStatus.pending:
                left = deadline - time.monotonic()
                if left <= 0 or not await changed.wait(left):
                    rec = await self.get(sid)
                    if rec.status == SandboxStatus.pending:
                        raise WaitTimedOut(f"sandbox {sid} not ready after {timeout}s; "
                                           "wait again")
                rec = await self.get(sid)
        # A failed or deleted sandbox is an answer too: its status and status_message say
        # so (clients check `ready`), as the reference system does.
        return rec
