"""SQLite state (WAL): the embedded default. Survives SIGKILL of the orchestrator.

Writes are small and local, so they run inline on the event loop: a WAL commit with
synchronous=NORMAL costs tens of microseconds, less than a thread hop.

One orchestrator process owns the file, so coordination is in-process: notifications and
locks live in this object, and only what must outlast a restart (fencing counters, replica
beats) goes to disk.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from orchard.env.schema import Job, SandboxEvent, SandboxInfo
from orchard.env.snapshot_schema import SnapshotInfo
from orchard.env.state.base import EventSubscription, LockTimeout

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sandboxes (
    sandbox_id TEXT PRIMARY KEY, status TEXT NOT NULL, updated REAL NOT NULL, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY, sandbox_id TEXT NOT NULL, status TEXT NOT NULL,
    updated REAL NOT NULL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS jobs_updated ON jobs(updated);
CREATE TABLE IF NOT EXISTS snapshots (
    snapshot_id TEXT PRIMARY KEY, created REAL NOT NULL, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS fences (name TEXT PRIMARY KEY, token INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS replicas (replica TEXT PRIMARY KEY, expires REAL NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, sandbox_id TEXT NOT NULL, session TEXT,
    time REAL NOT NULL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_sandbox ON events(sandbox_id, seq);
CREATE INDEX IF NOT EXISTS events_session ON events(session, seq);
CREATE INDEX IF NOT EXISTS events_time ON events(time);
"""


def sqlite_path(url: str) -> Path:
    """``sqlite:///abs/path.db`` -> Path; raise ValueError with the expected form."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or not parts.path:
        raise ValueError(f"state URL must look like sqlite:///path/to/state.db, got {url!r}")
    return Path(parts.path)


@dataclass
class _LocalLock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0  # holders plus waiters: the entry is dropped at zero so names don't pile up


class SqliteStore:
    shared = False

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Created private first: SQLite gives its -wal and -shm files the database's mode.
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        os.chmod(path, 0o600)
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)
        self._subscribers: dict[str, set[EventSubscription]] = {}
        self._locks: dict[str, _LocalLock] = {}

    async def put_sandbox(self, info: SandboxInfo) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO sandboxes VALUES (?, ?, ?, ?)",
            (info.sandbox_id, info.status.value, time.time(), info.model_dump_json()),
        )

    async def get_sandbox(self, sandbox_id: str) -> SandboxInfo | None:
        row = self._db.execute(
            "SELECT data FROM sandboxes WHERE sandbox_id = ?", (sandbox_id,)
        ).fetchone()
        return None if row is None else SandboxInfo.model_validate_json(row[0])

    async def list_sandboxes(self) -> list[SandboxInfo]:
        rows = self._db.execute("SELECT data FROM sandboxes ORDER BY updated").fetchall()
        return [SandboxInfo.model_validate_json(r[0]) for r in rows]

    async def drop_sandbox(self, sandbox_id: str) -> None:
        self._db.execute("DELETE FROM sandboxes WHERE sandbox_id = ?", (sandbox_id,))

    async def put_snapshot(self, info: SnapshotInfo) -> None:
        self._db.execute("INSERT OR REPLACE INTO snapshots VALUES (?, ?, ?)",
                         (info.snapshot_id, info.created_at.timestamp(),
                          info.model_dump_json()))

    async def get_snapshot(self, snapshot_id: str) -> SnapshotInfo | None:
        row = self._db.execute(
            "SELECT data FROM snapshots WHERE snapshot_id = ?", (snapshot_id,)).fetchone()
        return None if row is None else SnapshotInfo.model_validate_json(row[0])

    async def list_snapshots(self) -> list[SnapshotInfo]:
        rows = self._db.execute("SELECT data FROM snapshots ORDER BY created").fetchall()
        return [SnapshotInfo.model_validate_json(r[0]) for r in rows]

    async def drop_snapshot(self, snapshot_id: str) -> None:
        self._db.execute("DELETE FROM snapshots WHERE snapshot_id = ?", (snapshot_id,))

    async def put_job(self, job: Job) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO jobs VALUES (?, ?, ?, ?, ?)",
            (job.job_id, job.sandbox_id, job.status.value, time.time(), job.model_dump_json()),
        )

    async def get_job(self, job_id: str) -> Job | None:
        row = self._db.execute("SELECT data FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return None if row is None else Job.model_validate_json(row[0])

    async def unfinished_jobs(self) -> list[Job]:
        rows = self._db.execute(
            "SELECT data FROM jobs WHERE status IN ('queued', 'running')").fetchall()
        return [Job.model_validate_json(r[0]) for r in rows]

    async def prune(self, older_than: float) -> int:
        n = self._db.execute(
            "DELETE FROM sandboxes WHERE status = 'deleted' AND updated < ?", (older_than,)
        ).rowcount
        n += self._db.execute(
            "DELETE FROM jobs WHERE status IN ('succeeded', 'failed') AND updated < ?",
            (older_than,),
        ).rowcount
        return n

    async def append_event(self, event: SandboxEvent) -> SandboxEvent:
        # The row id is the seq, but the stored body must carry it too: insert, then fill in,
        # in one transaction, so no reader (or crash) ever meets a row without its body.
        self._db.execute("BEGIN IMMEDIATE")
        try:
            cur = self._db.execute(
                "INSERT INTO events (sandbox_id, session, time, data) VALUES (?, ?, ?, '')",
                (event.sandbox_id, event.session, event.time))
            event = event.model_copy(update={"seq": cur.lastrowid})
            self._db.execute("UPDATE events SET data = ? WHERE seq = ?",
                             (event.model_dump_json(), event.seq))
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
        return event

    async def events(self, *, sandbox_id: str | None = None, session: str | None = None,
                     after: int = 0, limit: int = 1000) -> list[SandboxEvent]:
        where, args = ["seq > ?"], [after]
        if sandbox_id is not None:
            where.append("sandbox_id = ?")
            args.append(sandbox_id)
        if session is not None:
            where.append("session = ?")
            args.append(session)
        rows = self._db.execute(
            f"SELECT data FROM events WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?",
            (*args, limit)).fetchall()
        return [SandboxEvent.model_validate_json(r[0]) for r in rows]

    async def prune_events(self, older_than: float) -> int:
        return self._db.execute("DELETE FROM events WHERE time < ?", (older_than,)).rowcount

    # --- coordination -------------------------------------------------------------------

    async def publish(self, channel: str) -> None:
        for sub in self._subscribers.get(channel, ()):
            sub.wake()

    @asynccontextmanager
    async def subscribe(self, channel: str) -> AsyncIterator[EventSubscription]:
        sub = EventSubscription()
        self._subscribers.setdefault(channel, set()).add(sub)
        try:
            yield sub
        finally:
            subs = self._subscribers[channel]
            subs.discard(sub)
            if not subs:
                del self._subscribers[channel]

    def lock(self, name: str, ttl: float, timeout: float) -> AbstractAsyncContextManager[int]:
        # ttl needs no enforcement here: a holder can only die with the whole process, and
        # that takes every in-process lock with it.
        return self._hold(name, timeout)

    @asynccontextmanager
    async def _hold(self, name: str, timeout: float) -> AsyncIterator[int]:
        entry = self._locks.setdefault(name, _LocalLock())
        entry.users += 1
        try:
            try:
                async with asyncio.timeout(timeout):
                    await entry.lock.acquire()
            except TimeoutError:
                raise LockTimeout(
                    f"lock {name!r} still held by another task of this orchestrator after "
                    f"waiting {timeout:g}s; retry later, or wait longer if its holder "
                    "legitimately works that long"
                ) from None
            try:
                yield self._next_fence(name)
            finally:
                entry.lock.release()
        finally:
            entry.users -= 1
            if not entry.users:
                del self._locks[name]

    def _next_fence(self, name: str) -> int:
        # On disk so tokens keep increasing across restarts: a resource may remember the
        # highest token it saw from a previous life of this orchestrator.
        (token,) = self._db.execute(
            "INSERT INTO fences VALUES (?, 1) "
            "ON CONFLICT(name) DO UPDATE SET token = token + 1 RETURNING token",
            (name,),
        ).fetchone()
        return int(token)

    async def beat(self, replica: str, ttl: float) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO replicas VALUES (?, ?)", (replica, time.time() + ttl)
        )

    async def live_replicas(self) -> set[str]:
        now = time.time()
        self._db.execute("DELETE FROM replicas WHERE expires <= ?", (now,))
        return {r[0] for r in self._db.execute("SELECT replica FROM replicas")}

    async def close(self) -> None:
        for subs in self._subscribers.values():
            for sub in subs:
                sub.wake()  # a waiter re-reads state and finds the store closed, not a hang
        self._db.close()
