"""The Backend protocol: what the service needs from a place that runs sandboxes.

The service never knows which backend it drives. A backend creates a sandbox, says how to
reach its agent (a Unix socket locally, ``podIP:9090`` on Kubernetes), lists what exists (the
source of truth for reconciliation) and deletes completely and idempotently.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from orchard.env.errors import OrchestratorError
from orchard.env.image_schema import ImageInfo, ImageList, ImagesRemoved
from orchard.env.schema import LimitReport, SandboxUsage


class BackendError(OrchestratorError, RuntimeError):
    """A sandbox could not be created or reached; the message says why and what to do."""


@dataclass(frozen=True)
class SandboxSpec:
    sandbox_id: str
    image: str
    block_network: bool = True
    cpu: str | None = None
    memory: str | None = None
    pids: int | None = None
    disk: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    agent_token: str | None = None  # when set, the agent refuses requests without it
    model_proxy: bool = False  # let it reach the recording proxy (see Backend.model_base_url)
    session: str | None = None  # its rollout; a model_proxy sandbox's calls go under this one
    egress: list[str] | None = None  # with block_network False: the only destinations allowed
    snapshot: str | None = None  # start from this snapshot's files instead of the bare image


class SnapshotTooLarge(BackendError):
    """The sandbox holds more than a snapshot may; the message gives both sizes."""


class SnapshotMissing(BackendError):
    """The snapshot's files are gone from the backend (deleted, or never taken here)."""


class CheckpointFailed(BackendError):
    """A process could not be checkpointed or restored; the message names it and says why."""


class MemoryUnsupported(BackendError):
    """Live (memory) snapshots cannot be taken by this backend or host; the message says why
    and what to do."""


@dataclass(frozen=True)
class SnapshotMade:
    snapshot_id: str
    size_bytes: int  # bytes on disk of what this snapshot adds (not its parents or image)
    memory_bytes: int | None = None  # a live snapshot's process images; None: files only
    processes: list[dict[str, object]] = field(default_factory=list)  # pid, command per tree


class ImageUnavailable(BackendError):
    """The sandbox's image cannot be had; ``kind`` says why (an ``ImageErrorKind`` of
    orchard.env.image_schema: not_found, unauthorized, digest_mismatch, disk_full, ...)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class ImageInUse(BackendError):
    """A sandbox still runs on the image to remove; the message names them."""


class SpecRejected(OrchestratorError, ValueError):
    """The backend cannot run this spec (e.g. an image it cannot resolve); says what to change."""


class SpecForbidden(SpecRejected):
    """The backend could run this spec but its configuration forbids it (e.g. an image path
    outside the image directories); says which setting allows it."""


def agent_token(secret: bytes, sandbox_id: str) -> str:
    """Per-sandbox and derivable from the backend's secret, so nothing is stored, and a
    sandbox that reads its own token can reach no other sandbox's agent."""
    return hmac.new(secret, sandbox_id.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class SandboxHandle:
    sandbox_id: str
    address: str  # "unix:/path/to/agent.sock" or "tcp:host:port"
    limits: dict[str, LimitReport] = field(default_factory=dict)
    token: str | None = None  # sent as X-Agent-Token


class ImageCache(Protocol):
    """Images the backend pulls and keeps itself (the local backend); a backend whose
    platform pulls them (Kubernetes: the kubelet) has none.

    Raises ImageUnavailable (its kind says why) and ImageInUse (``remove`` of an image a
    sandbox runs on)."""

    async def check(self, image: str) -> None:
        """Before a sandbox is recorded: the image can be had (a registry image's manifest
        for this platform, with these credentials), so a create fails at once if not."""
        ...

    async def pull(self, image: str, report: Callable[[str], Awaitable[None]] | None = None,
                   refresh: bool = False) -> Any:
        """Have the image in the cache (pulled once, whoever asks), telling ``report`` how
        the pull goes; ``refresh`` asks the registry again what a tag names."""
        ...

    def list(self) -> ImageList: ...

    def find(self, name: str) -> ImageInfo: ...

    def remove(self, name: str) -> ImagesRemoved: ...

    def prune(self) -> ImagesRemoved: ...


@runtime_checkable
class Backend(Protocol):
    name: str
    image_cache: ImageCache | None

    @property
    def namespace(self) -> str | None:
        """Where on its platform the backend's sandboxes live (a Kubernetes namespace),
        recorded with each sandbox; None where there is no such place."""
        ...

    def check(self, spec: SandboxSpec) -> None:
        """Raise SpecRejected if this backend could never run spec; called before any record."""
        ...

    async def start(self) -> None:
        """Connect and load what exists; raise BackendError saying what is unreachable."""
        ...

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        """Start the sandbox and return once its agent is ready; raise BackendError."""
        ...

    async def delete(self, sandbox_id: str) -> None:
        """Remove every trace of the sandbox; a no-op for one that is already gone."""
        ...

    async def list(self) -> set[str]:
        """Ids of every sandbox that exists on the backend, recorded or not."""
        ...

    async def adopt(self, sandbox_id: str) -> SandboxHandle | None:
        """The handle of a live, ready sandbox (one this process did not create, e.g. after a
        restart or on another replica), or None if it is not alive and ready."""
        ...

    async def snapshot(self, sandbox_id: str, snapshot_id: str, parent: str | None,
                       max_bytes: int, memory: bool = False) -> SnapshotMade:
        """Keep the files the sandbox changed over its image (and over ``parent``, the snapshot
        it started from) as ``snapshot_id``; consistent even while its processes run. With
        ``memory``, its processes too, restored in every sandbox created from it. Raise
        SnapshotTooLarge past max_bytes, MemoryUnsupported or CheckpointFailed for memory,
        BackendError otherwise."""
        ...

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        """Remove a snapshot's files unless a sandbox or another snapshot still builds on them:
        True once gone (also when it never existed), False while still in use."""
        ...

    async def list_snapshots(self) -> set[str]:
        """Ids of every snapshot whose files the backend holds."""
        ...

    async def pause(self, sandbox_id: str) -> None:
        """Stop every process of the sandbox where it stands (memory is kept)."""
        ...

    async def resume(self, sandbox_id: str) -> None:
        """Let a paused sandbox's processes run on."""
        ...

    async def usage(self, sandbox_id: str) -> SandboxUsage:
        """What the sandbox uses now; fields this backend cannot measure stay None."""
        ...

    async def prepare_browser(self) -> None:
        """Make sure sandboxes can start a browser (build what is injected for it); called
        before every browser action, so it must be cheap once done. Raise BackendError."""
        ...

    def model_base_url(self, session: str) -> str:
        """The recording proxy's OpenAI base URL for session as a model_proxy sandbox reaches
        it; raise SpecRejected when this backend has no proxy configured."""
        ...

    def describe(self) -> dict[str, str]:
        """Facts about what the backend can enforce, for /resources."""
        ...

    async def close(self) -> None: ...
