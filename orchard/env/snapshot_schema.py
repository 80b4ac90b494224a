"""The wire contract of snapshots and forks: a sandbox's files kept at one moment, and the
sandboxes branched off them (see docs/guides/snapshots.md)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field, model_validator

from orchard.env.schema import SANDBOX_ID_PATTERN, SandboxInfo, StrictModel, short_labels


class SnapshotStatus(StrEnum):
    pending = "pending"  # being taken
    ready = "ready"
    deleted = "deleted"


class SnapshotRequest(StrictModel):
    snapshot_id: Annotated[str | None, Field(pattern=SANDBOX_ID_PATTERN)] = None
    labels: dict[str, str] = Field(default_factory=dict, max_length=64)
    ttl: float | None = Field(
        None, gt=0, le=30 * 24 * 3600,
        description="Seconds the snapshot is kept (default: the server's snapshot_ttl, 24 h).")
    keep: bool = Field(
        False, description="Keep it until it is deleted (no expiry; 'ttl' must be left out). "
        "Built images and their cached steps are kept so.")
    memory: bool = Field(
        False, description="Also checkpoint its running processes (CRIU, local backend): a "
        "sandbox created from the snapshot continues them where they were. 422 names the "
        "process that cannot be checkpointed and why.")

    @model_validator(mode="after")
    def _keep_or_ttl(self) -> SnapshotRequest:
        if self.keep and self.ttl is not None:
            raise ValueError("a snapshot is either kept until deleted (keep) or for a ttl: "
                             "give one of them")
        return self


class SnapshotUpdate(StrictModel):
    labels: dict[str, str | None] = Field(
        default_factory=dict, max_length=64,
        description="Labels to set; a null value removes that label.")


class CheckpointedProcess(BaseModel):
    pid: int = Field(description="Its pid in the sandbox (kept in every restore).")
    command: str


class SnapshotInfo(BaseModel):
    """A sandbox's files at one moment: what it wrote over its image, and with ``memory`` its
    running processes too. Sandboxes created from it share it read-only."""

    snapshot_id: str
    sandbox_id: str = Field(description="The sandbox it was taken of.")
    image: str
    status: SnapshotStatus
    size_bytes: int = Field(description="Bytes on disk of what the snapshot itself holds.")
    created_at: datetime
    expires_at: datetime | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    parent: str | None = Field(None, description="The snapshot its sandbox started from.")
    backend: str = "local"
    memory_bytes: int | None = Field(
        None, description="A live snapshot's process images, in bytes; null: files only.")
    processes: list[CheckpointedProcess] = Field(
        default_factory=list, description="A live snapshot's process trees, by their root.")


class SnapshotList(BaseModel):
    snapshots: list[SnapshotInfo]


class SnapshotDeleted(BaseModel):
    snapshot_id: str
    status: Literal["deleted"] = "deleted"
    found: bool = Field(True, description="False: there was no such snapshot; deleting is "
                        "idempotent, so this is no error.")


class ForkRequest(StrictModel):
    count: int = Field(1, ge=1, le=1000, description="How many sandboxes to branch off.")
    labels: Annotated[dict[str, str], AfterValidator(short_labels)] = Field(
        default_factory=dict, max_length=64,
        description="Added to the source's labels on every fork.")
    ttl: float | None = Field(None, gt=0, le=7 * 24 * 3600)
    keep_snapshot: bool = Field(
        False, description="Keep the snapshot the forks start from (else it is deleted once "
        "they are created; its files stay as long as a fork uses them).")
    memory: bool = Field(
        False, description="Fork its running processes too (a live snapshot, see "
        "SnapshotRequest.memory): each fork continues them in its own namespaces.")


class ForkResponse(BaseModel):
    snapshot_id: str
    sandboxes: list[SandboxInfo]
