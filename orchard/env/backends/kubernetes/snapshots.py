"""Snapshots of pods: tar archives of the sandbox's kept paths, made and restored by its agent.

The orchestrator cannot see a pod's file system, so the agent streams the paths listed in
``kubernetes.snapshot_paths`` out as one tar, written to ``kubernetes.snapshot_dir/<id>.tar``,
and a sandbox created from the snapshot gets it streamed back in before it is handed out. Each
archive holds the whole paths, so snapshots never build on each other: one can be deleted at
any time. Pause and resume are SIGSTOP and SIGCONT from the agent to every process of the pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from pathlib import Path

from orchard.env.agent.client import AgentClient, AgentError
from orchard.env.backends.base import BackendError, SnapshotMade, SnapshotMissing, SnapshotTooLarge
from orchard.env.backends.kubernetes.config import KubernetesConfig

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_SUFFIX = ".tar"


class PodSnapshots:
    """The snapshot directory and the agent calls that fill it and restore from it."""

    def __init__(self, config: KubernetesConfig) -> None:
        self.dir = Path(config.snapshot_dir) if config.snapshot_dir else None
        self.paths = list(config.snapshot_paths)
        self.timeout = config.snapshot_timeout

    def tar(self, snapshot_id: str) -> Path:
        """Where the snapshot's archive lives; raises when snapshots are not set up."""
        if self.dir is None:
            raise BackendError("snapshots on Kubernetes need a directory to keep them in: set "
                               "kubernetes.snapshot_dir to a volume mounted into the "
                               "orchestrator (ReadWriteMany with several replicas)")
        if not _ID.fullmatch(snapshot_id):
            raise BackendError(f"snapshot id {snapshot_id!r} cannot name a file: use letters, "
                               "digits, '.', '_' and '-', starting with a letter or digit")
        return self.dir / f"{snapshot_id}{_SUFFIX}"

    def require(self, snapshot_id: str) -> Path:
        tar = self.tar(snapshot_id)
        if not tar.is_file():
            raise SnapshotMissing(f"snapshot {snapshot_id} has no archive at {tar}: it was "
                                  "deleted or taken elsewhere; take a new snapshot, or point "
                                  "kubernetes.snapshot_dir at the volume that holds it")
        return tar

    async def take(self, agent: AgentClient, sandbox_id: str, snapshot_id: str,
                   max_bytes: int) -> SnapshotMade:
        tar = self.tar(snapshot_id)
        await asyncio.to_thread(tar.parent.mkdir, parents=True, exist_ok=True)
        # A name of its own per attempt: a crashed or concurrent attempt cannot mix into it,
        # and readers only ever see a complete archive (the rename is atomic).
        partial = tar.with_name(f"{tar.name}.partial-{uuid.uuid4().hex[:12]}")
        try:
            # Frozen while it is archived: a consistent state even while processes run (those
            # already paused stay paused).
            size = await agent.get_archive(self.paths, partial, max_bytes, timeout=self.timeout,
                                           freeze=True)
            await asyncio.to_thread(partial.rename, tar)
        except AgentError as e:
            if e.status == 413:
                raise SnapshotTooLarge(f"sandbox {sandbox_id} is too large to snapshot: "
                                       f"{e.detail}") from None
            raise BackendError(f"snapshot of sandbox {sandbox_id} failed in its agent: "
                               f"{e.detail}") from None
        except OSError as e:
            raise BackendError(f"cannot write snapshot {snapshot_id} to {tar.parent} ({e}); "
                               "check that kubernetes.snapshot_dir is a writable volume with "
                               "room to spare") from None
        finally:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(partial.unlink, missing_ok=True)
        return SnapshotMade(snapshot_id=snapshot_id, size_bytes=size)

    async def restore(self, agent: AgentClient, sandbox_id: str, snapshot_id: str) -> None:
        tar = self.require(snapshot_id)
        try:
            await agent.put_archive(tar, timeout=self.timeout)
        except FileNotFoundError:
            raise SnapshotMissing(f"snapshot {snapshot_id} was deleted while sandbox "
                                  f"{sandbox_id} was being created from it; take a new "
                                  "snapshot") from None
        except AgentError as e:
            raise BackendError(f"restoring snapshot {snapshot_id} into sandbox {sandbox_id} "
                               f"failed in its agent: {e.detail}") from None

    async def delete(self, snapshot_id: str) -> bool:
        """Every sandbox got its own copy of the archive, so nothing ever still uses it."""
        if self.dir is None:
            return True  # never kept anything
        await asyncio.to_thread(self.tar(snapshot_id).unlink, missing_ok=True)
        return True

    async def list(self) -> set[str]:
        if self.dir is None:
            return set()

        def names() -> set[str]:
            with contextlib.suppress(FileNotFoundError):
                return {p.name[: -len(_SUFFIX)] for p in self.dir.glob(f"*{_SUFFIX}")
                        if _ID.fullmatch(p.name[: -len(_SUFFIX)])}
            return set()

        try:
            return await asyncio.to_thread(names)
        except OSError as e:
            raise BackendError(f"cannot list snapshots in {self.dir} ({e}); check that "
                               "kubernetes.snapshot_dir is mounted and readable") from None


async def signal_pod(agent: AgentClient, sandbox_id: str, sig: str) -> None:
    """STOP or CONT every process of the pod but its agent."""
    try:
        result = await agent.signal_all(sig)
        if sig == "STOP" and result["not_permitted"]:
            # Half a pause is worse than none: let the stopped ones go on, then say why.
            await agent.signal_all("CONT")
            raise BackendError(
                f"cannot pause sandbox {sandbox_id}: its agent may not signal "
                f"{result['not_permitted']} of its processes (they run as another user); add "
                "KILL to kubernetes.add_capabilities")
    except AgentError as e:
        verb = "pause" if sig == "STOP" else "resume"
        raise BackendError(f"cannot {verb} sandbox {sandbox_id}: its agent says: "
                           f"{e.detail}") from None
