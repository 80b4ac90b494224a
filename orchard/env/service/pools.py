"""Warm pools: sandboxes launched ahead of the creates that will want them.

Each entry of ``pools:`` keeps ``size`` sandboxes of its shape ready. They are ordinary
records that carry the POOL_LABEL (naming their pool), so a restarted orchestrator adopts them
like any other sandbox and recognises them by it; GET /sandboxes does not list them and no
agent operation reaches them until one is taken. A create that matches an entry claims a
ready one under its record's lock: the label goes, the caller's labels, TTL and session come
in, and it never carries the label again, so a sandbox someone used is never handed out twice.
The refill is a level-triggered loop (the reconciler's "pools" loop): each pass counts each
pool's members and launches the missing ones or deletes the surplus; a take also starts one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from orchard.env.config import PoolEntry, Settings
from orchard.env.events import EventLog
from orchard.env.metrics import Metrics
from orchard.env.quantities import parse_cpu, parse_memory
from orchard.env.schema import (
    CreateSandboxRequest,
    EventKind,
    PoolInfo,
    SandboxInfo,
    SandboxStatus,
)
from orchard.env.service.lifecycle import Lifecycle
from orchard.env.service.records import POOL_LABEL, SandboxRecords, utc_time


def _same(a: object, b: object, parse: Callable[[str], float]) -> bool:
    """Two quantities given either way ('1' and '1000m', '1Gi' and '1024Mi') are one."""
    if a is None or b is None:
        return a is b
    try:
        return parse(str(a)) == parse(str(b))
    except ValueError:
        return False


def matches(entry: PoolEntry, req: CreateSandboxRequest) -> bool:
    """Whether a pool sandbox can serve this create as a fresh launch would. What a running
    sandbox cannot take on afterwards makes it a miss: a chosen sandbox_id (the id names its
    directories, cgroups and sockets), env or workdir (its agent's defaults are fixed when
    it starts), a snapshot to start from, a model proxy."""
    if (req.sandbox_id is not None or req.env or req.workdir is not None
            or req.from_snapshot is not None or req.model_proxy):
        return False
    egress = sorted(req.egress) if req.egress is not None else None
    return ((req.image or "host") == entry.image and req.block_network == entry.block_network
            and egress == (sorted(entry.egress) if entry.egress is not None else None)
            and req.pids == entry.pids and _same(req.cpu, entry.cpu, parse_cpu)
            and _same(req.memory, entry.memory, parse_memory)
            and _same(req.disk, entry.disk, parse_memory))


class Pools:
    def __init__(self, records: SandboxRecords, lifecycle: Lifecycle, settings: Settings,
                 metrics: Metrics, events: EventLog) -> None:
        self.records = records
        self.lifecycle = lifecycle
        self.settings = settings
        self.metrics = metrics
        self.events = events
        self.entries = {e.name: e for e in settings.pools}
        self.hits = dict.fromkeys(self.entries, 0)
        self.misses = dict.fromkeys(self.entries, 0)
        # One fill at a time: two passes counting the same members would overfill.
        self._filling = asyncio.Lock()
        self._refills: set[asyncio.Task[None]] = set()
        self._closed = False
        for name, entry in self.entries.items():
            metrics.pool_size.labels(name).set(entry.size)
            metrics.pool_ready.labels(name)
            metrics.pool_hits.labels(name)
            metrics.pool_misses.labels(name)

    def members(self, name: str) -> list[SandboxInfo]:
        """The pool's live sandboxes not yet taken, as this replica last saw them."""
        return [r for r in self.records.live.values() if r.labels.get(POOL_LABEL) == name]

    def _ready(self, name: str) -> list[SandboxInfo]:
        return [r for r in self.members(name) if r.status == SandboxStatus.running]

    async def take(self, req: CreateSandboxRequest) -> SandboxInfo | None:
        """A ready pool sandbox, now the caller's; None when no pool matches or the matching
        one is empty (the create then launches cold)."""
        entry = next((e for e in self.entries.values() if matches(e, req)), None)
        if entry is None or self._closed:
            return None
        now = time.time()
        for candidate in self._ready(entry.name):
            claimed = False

            def claim(rec: SandboxInfo) -> bool:
                nonlocal claimed
                if rec.status != SandboxStatus.running or POOL_LABEL not in rec.labels:
                    return False  # taken by another replica, or gone, since we looked
                rec.labels = {**entry.labels, **req.labels}
                rec.pool, rec.session, rec.exclusive_exec = entry.name, req.session, \
                    req.exclusive_exec
                rec.created_at = rec.ready_at = utc_time(now)
                rec.expires_at = utc_time(now + (req.ttl or self.settings.default_ttl))
                rec.replica, rec.last_heartbeat = self.lifecycle.replica, None
                claimed = True
                return True

            rec = await self.records.update(candidate.sandbox_id, claim)
            if claimed and rec is not None:
                self.hits[entry.name] += 1
                self.metrics.pool_hits.labels(entry.name).inc()
                # As a cold create logs it (a replay starts from it), and which pool served it.
                await self.events.record(rec, EventKind.created, now, image=rec.image,
                                         block_network=rec.block_network, cpu=rec.cpu,
                                         memory=rec.memory, pids=rec.pids, disk=rec.disk,
                                         env=req.env, model_proxy=False, timeout=req.timeout,
                                         ttl=req.ttl, egress=rec.egress, from_snapshot=None,
                                         workdir=None, pool=entry.name)
                self._refill()
                return rec
        self.misses[entry.name] += 1
        self.metrics.pool_misses.labels(entry.name).inc()
        self._refill()
        return None

    def _refill(self) -> None:
        task = asyncio.create_task(self._fill_quietly())
        self._refills.add(task)
        task.add_done_callback(self._refills.discard)

    async def _fill_quietly(self) -> None:
        # Its error is the loop's to retry: the next pass counts again.
        with contextlib.suppress(Exception):
            await self.fill()

    async def fill(self) -> None:
        """A pass: launch each pool's missing sandboxes, delete its surplus (a smaller size
        after a restart) and the sandboxes of pools gone from the settings. A create that
        fails raises, so the loop backs off."""
        async with self._filling:
            # A pool no longer configured (a restart with other settings): its sandboxes
            # would never be taken.
            for rec in list(self.records.live.values()):
                if rec.labels.get(POOL_LABEL, "") not in ("", *self.entries):
                    await self.lifecycle.delete(rec.sandbox_id, "its pool is not configured")
            for name, entry in self.entries.items():
                if self._closed:
                    return
                members = self.members(name)
                for rec in members[entry.size:]:
                    await self.lifecycle.delete(rec.sandbox_id, "pool is over its size")
                for _ in range(entry.size - len(members)):
                    await self.lifecycle.create(self._request(entry), queued=True, for_pool=True)
                self.metrics.pool_ready.labels(name).set(len(self._ready(name)))

    def _request(self, entry: PoolEntry) -> CreateSandboxRequest:
        return CreateSandboxRequest(
            image=entry.image, block_network=entry.block_network, egress=entry.egress,
            cpu=entry.cpu, memory=entry.memory, pids=entry.pids, disk=entry.disk,
            labels={**entry.labels, POOL_LABEL: entry.name})

    async def close(self) -> None:
        """Start no more pool sandboxes (the service is stopping); wait for refills."""
        self._closed = True
        await asyncio.gather(*self._refills, return_exceptions=True)

    def info(self) -> list[PoolInfo]:
        out = []
        for name, entry in self.entries.items():
            members = self.members(name)
            ready = sum(r.status == SandboxStatus.running for r in members)
            self.metrics.pool_ready.labels(name).set(ready)
            out.append(PoolInfo(name=name, entry=entry.model_dump(exclude_none=True),
                                size=entry.size, ready=ready, starting=len(members) - ready,
                                hits=self.hits[name], misses=self.misses[name]))
        return out
