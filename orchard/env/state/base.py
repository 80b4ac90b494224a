"""The StateStore protocol: where sandbox records, jobs, locks and replica liveness live.

The service never knows where. SQLite serves one orchestrator process; Redis lets several
replicas share everything here, so each method is written for the shared case: notifications
reach waiters in every replica, locks hold across replicas, and a replica that dies stops
beating, which is how the others learn its jobs will never finish.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from typing import Protocol, runtime_checkable

from orchard.env.errors import OrchestratorError
from orchard.env.schema import Job, SandboxEvent, SandboxInfo
from orchard.env.snapshot_schema import SnapshotInfo


class LockTimeout(OrchestratorError, TimeoutError):
    """A lock could not be acquired in time; the message names the lock and the wait."""


class LockLost(OrchestratorError, RuntimeError):
    """A held lock expired or was taken over (e.g. its renewals stalled past the TTL)."""


class StoreUnavailable(OrchestratorError, RuntimeError):
    """The store's server could not be reached; the message names it and what to check."""


@runtime_checkable
class Subscription(Protocol):
    async def wait(self, timeout: float) -> bool:
        """True once a publish on the channel arrived since subscribing (or since the previous
        wait returned True); False on timeout. Publishes are never lost between waits."""
        ...


class EventSubscription:
    """A Subscription fed by its store's dispatcher calling wake(); the event stays set until
    a wait consumes it, which is what keeps a publish from being lost between waits."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def wake(self) -> None:
        self._event.set()

    async def wait(self, timeout: float) -> bool:
        if not self._event.is_set():
            try:
                await asyncio.wait_for(self._event.wait(), timeout)
            except TimeoutError:
                return False
        self._event.clear()
        return True


@runtime_checkable
class StateStore(Protocol):
    shared: bool  # True when several orchestrator replicas may use this store at once

    async def put_sandbox(self, info: SandboxInfo) -> None: ...
    async def get_sandbox(self, sandbox_id: str) -> SandboxInfo | None: ...
    async def list_sandboxes(self) -> list[SandboxInfo]: ...
    async def drop_sandbox(self, sandbox_id: str) -> None: ...
    async def put_snapshot(self, info: SnapshotInfo) -> None: ...
    async def get_snapshot(self, snapshot_id: str) -> SnapshotInfo | None: ...
    async def list_snapshots(self) -> list[SnapshotInfo]: ...
    async def drop_snapshot(self, snapshot_id: str) -> None: ...
    async def put_job(self, job: Job) -> None: ...
    async def get_job(self, job_id: str) -> Job | None: ...
    async def unfinished_jobs(self) -> list[Job]:
        """Jobs recorded as queued or running."""
        ...

    async def prune(self, older_than: float) -> int:
        """Forget deleted sandboxes and finished jobs older than this Unix time."""
        ...

    async def append_event(self, event: SandboxEvent) -> SandboxEvent:
        """Append to the event log; returns the event with its seq, which orders events
        across all sandboxes and replicas."""
        ...

    async def events(self, *, sandbox_id: str | None = None, session: str | None = None,
                     after: int = 0, limit: int = 1000) -> list[SandboxEvent]:
        """Events with seq > after, in seq order, of one sandbox and/or one session."""
        ...

    async def prune_events(self, older_than: float) -> int:
        """Forget events that happened before this Unix time."""
        ...

    # --- coordination -------------------------------------------------------------------

    async def publish(self, channel: str) -> None:
        """Wake every subscriber of channel, in every replica."""
        ...

    def subscribe(self, channel: str) -> AbstractAsyncContextManager[Subscription]:
        """Subscribe before reading the state you wait on, so no change slips between."""
        ...

    def lock(self, name: str, ttl: float, timeout: float) -> AbstractAsyncContextManager[int]:
        """Hold an exclusive lock across replicas, yielding its fencing token: an integer that
        strictly increases with every acquisition of this name, so a resource can refuse a
        holder whose lock has since expired. The lock is renewed while held; it expires ttl
        seconds after its holder dies. Raises LockTimeout after waiting timeout seconds."""
        ...

    async def beat(self, replica: str, ttl: float) -> None:
        """Record that this replica is alive for the next ttl seconds."""
        ...

    async def live_replicas(self) -> set[str]:
        """Replicas whose last beat has not expired."""
        ...

    async def close(self) -> None: ...
