"""The sandbox service, composed: it builds its parts, wires each to the few others it needs,
and starts and stops them together. Backend- and store-agnostic.

- records (records.py): the store's sandbox records and this replica's live count;
- lifecycle (lifecycle.py): admission, create, delete, heartbeats, the agents of running
  sandboxes;
- jobs (exec_jobs.py): execs and their job records;
- snapshots (snapshots.py) and branching (branching.py): snapshots, forks, pause and resume;
- ops (sandbox_ops.py): the other agent operations (files, patches, processes, browser);
- images (images.py): the backend's image cache, if it keeps one;
- pools (pools.py): the warm pools, refilled by their loop, taken from by creates;
- reconciler (reconciler.py): the control loops that keep store and backend in agreement.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid

from orchard.env.backends.base import Backend
from orchard.env.config import Settings
from orchard.env.events import EventLog
from orchard.env.metrics import Metrics
from orchard.env.service.background import Background
from orchard.env.service.branching import Branching
from orchard.env.service.exec_jobs import ExecJobs
from orchard.env.service.images import Images
from orchard.env.service.lifecycle import Lifecycle
from orchard.env.service.pools import Pools
from orchard.env.service.reconciler import ControlLoop, Reconciler
from orchard.env.service.records import SandboxRecords
from orchard.env.service.sandbox_ops import SandboxOps
from orchard.env.service.snapshots import Snapshots
from orchard.env.state.base import StateStore


def replica_id() -> str:
    """Unique per process start: a restarted orchestrator is a new replica, so jobs it ran
    before the restart are recognisably orphaned."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class SandboxService:
    def __init__(self, backend: Backend, store: StateStore, settings: Settings,
                 metrics: Metrics | None = None) -> None:
        self.backend = backend
        self.store = store
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.events = EventLog(store, self.metrics, settings.event_content_bytes)
        self.replica = replica_id()
        self.background = Background()
        self.records = SandboxRecords(store)
        self.snapshots = Snapshots(self.records, store, backend, settings, self.events)
        self.lifecycle = Lifecycle(self.records, store, backend, settings, self.metrics,
                                   self.events, self.replica, self.snapshots)
        self.jobs = ExecJobs(self.lifecycle, store, settings, self.metrics, self.events,
                             self.replica, self.background)
        self.branching = Branching(self.records, self.lifecycle, self.snapshots, store,
                                   backend, settings, self.events, self.background)
        self.ops = SandboxOps(self.lifecycle, self.events, backend)
        self.images = Images(backend)
        self.pools = Pools(self.records, self.lifecycle, settings, self.metrics, self.events)
        if settings.pools:
            self.lifecycle.pool = self.pools
        passes = {"sandboxes": self._reconcile_sandboxes, "jobs": self.jobs.fail_orphans,
                  "snapshots": self.snapshots.collect, "prune": self._prune,
                  "pools": self.pools.fill}
        periods = settings.loop_periods()
        self.reconciler = Reconciler([
            ControlLoop(name, periods[name], run, self.metrics, settings.reconcile_max_backoff)
            for name, run in passes.items()])

    @property
    def beat_ttl(self) -> float:
        """How long this replica counts as alive after a beat: three missed passes."""
        return 3 * self.settings.reconcile_interval + 2

    async def start(self) -> None:
        """Adopt what the store and the backend hold (a restart or another replica's work),
        fail what can no longer finish, remove orphans; then keep reconciling."""
        await self.reconciler.start()

    async def reconcile_once(self) -> None:
        """One pass of every reconcile loop now, instead of at their next period."""
        await self.reconciler.run_once()

    async def stop(self, delete_all: bool = False) -> None:
        await self.reconciler.stop()
        await self.pools.close()
        if delete_all:
            await self.lifecycle.delete_own()
        await asyncio.gather(self.lifecycle.settle(), self.background.drain())
        if delete_all and not self.store.shared:  # an embedded orchestrator's go with it
            await self.snapshots.delete_all()
        await self.lifecycle.close_agents()

    async def _reconcile_sandboxes(self) -> None:
        # The beat first: the passes of other replicas (and this one's) read who is alive.
        await self.store.beat(self.replica, self.beat_ttl)
        await self.lifecycle.reconcile()

    async def _prune(self) -> None:
        now = time.time()
        await self.store.prune(now - self.settings.retention)
        await self.store.prune_events(now - self.settings.event_retention)
