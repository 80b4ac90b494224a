"""The wire contract of Orchard Env: every request and response body, shared by API and SDK.

Field names and defaults follow the reference system's REST contract (so its clients work
unchanged) and extend it. Byte payloads that may not be UTF-8 travel as ``*_b64`` fields.
"""

from __future__ import annotations

import base64
import ipaddress
import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    computed_field,
    field_validator,
    model_validator,
)

SANDBOX_ID_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"  # a DNS label: also a pod name
# The recording proxy's session ids (they name its files): one rollout, one session.
SESSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
MAX_OUTPUT_BYTES_DEFAULT = 10 * 1024 * 1024
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
_HOSTNAME = re.compile(r"^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)"
                       r"(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*\.?$", re.IGNORECASE)
# What an exec without a timeout gets, as in the reference system: an unbounded command would
# outlive its client's read timeout, and clients retry.
DEFAULT_EXEC_TIMEOUT = 300.0


def parse_egress_entry(entry: str) -> IPNetwork | str:
    """An address or network (``10.1.2.0/24``, ``2001:db8::1``) or a host name (lower-case,
    no trailing dot); else ValueError saying what an entry may be."""
    text = entry.strip()
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        pass
    if _HOSTNAME.match(text) and not text.replace(".", "").isdigit():
        return text.rstrip(".").lower()
    raise ValueError(f"egress entry {entry!r} is neither an IP address, a CIDR network "
                     "(10.1.2.0/24) nor a host name (pypi.org)")


class SandboxStatus(StrEnum):
    pending = "pending"
    running = "running"
    paused = "paused"
    failed = "failed"
    deleting = "deleting"
    deleted = "deleted"


class JobStatus(StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"


class StrictModel(BaseModel):
    """A request body: an unknown field is a 422 naming it, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


class CreateSandboxRequest(StrictModel):
    image: str | None = Field(
        None,
        description="'host' (read-only view of the host system; the default), a registry "
        "reference (python:3.12-slim, ghcr.io/org/img:tag, name@sha256:...), or on the "
        "server a rootfs directory, a docker-archive/oci-archive tarball or an OCI layout "
        "directory. With from_snapshot: the snapshot's image (leave it out).",
        min_length=1,
        max_length=4096,
    )
    block_network: bool = Field(
        True, description="True: a network namespace with loopback only. False: its own "
        "network namespace with outbound access to the public internet (not to the host, "
        "other sandboxes or private ranges; see docs/guides/security.md).")
    egress: list[str] | None = Field(
        None, max_length=256,
        description="With block_network false: the only destinations it may reach, as IP "
        "addresses, CIDR networks or host names (re-resolved while it lives); private "
        "ranges may be listed. Default: the public internet.")
    sandbox_id: Annotated[str | None, Field(pattern=SANDBOX_ID_PATTERN)] = None
    cpu: str | None = Field(None, description="CPU limit in cores, e.g. '2' or '500m'.")
    memory: str | None = Field(None, description="Memory limit, e.g. '512Mi', '8Gi'.")
    pids: int | None = Field(None, ge=8, le=1_000_000, description="Max processes.")
    disk: str | None = Field(
        None, description="Disk quota for everything the sandbox writes, e.g. '10Gi' (at "
        "least 16Mi). `limits.disk` says whether the host enforces it.")
    timeout: float | None = Field(
        None, gt=0, le=7 * 24 * 3600,
        description="Seconds the sandbox may take to become ready before it is failed "
        "(default: the server's pending_timeout). Not its lifetime: that is 'ttl'.")
    ttl: float | None = Field(
        None, gt=0, le=7 * 24 * 3600,
        description="Seconds the sandbox lives (default: the server's default_ttl, 2 h).")
    labels: dict[str, str] = Field(default_factory=dict, max_length=64)
    env: dict[str, str] = Field(default_factory=dict, description="Default env for every exec.")
    workdir: str | None = Field(
        None, max_length=4096, pattern=r"^/",
        description="Default working directory of every exec (default: a built image's "
        "WORKDIR, else /workspace where it exists, else /).")
    exclusive_exec: bool = Field(
        False, description="Run this sandbox's execs one at a time, across all orchestrator "
        "replicas (later ones queue, up to their own timeout).")
    session: Annotated[str | None, Field(pattern=SESSION_PATTERN)] = Field(
        None, description="The rollout this sandbox belongs to: tags its events (GET "
        "/events?session=) and names its recording-proxy session.")
    model_proxy: bool = Field(
        False, description="Let the sandbox reach the orchestrator's recording proxy (and, "
        "with block_network, nothing else): execs get OPENAI_BASE_URL pointing at it under "
        "this sandbox's session. Needs `session` and a server started with --model-proxy.")
    from_snapshot: Annotated[str | None, Field(pattern=SANDBOX_ID_PATTERN)] = Field(
        None, description="Start from this snapshot's files (POST /sandboxes/{id}/snapshot) "
        "instead of the bare image; 'image' may be left out (it is the snapshot's).")

    @field_validator("egress")
    @classmethod
    def _egress_entries(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return None
        return [str(parse_egress_entry(e)) for e in v]

    @model_validator(mode="after")
    def _egress_needs_network(self) -> CreateSandboxRequest:
        if self.egress is not None and self.block_network:
            raise ValueError("egress is an allow-list for a networked sandbox: set "
                             "block_network to false with it")
        return self

    @model_validator(mode="after")
    def _proxy_needs_session(self) -> CreateSandboxRequest:
        if self.model_proxy and self.session is None:
            raise ValueError("model_proxy needs a session id: the proxy records the model "
                             "calls under it; set 'session'")
        return self

    @field_validator("labels")
    @classmethod
    def _labels_are_short(cls, v: dict[str, str]) -> dict[str, str]:
        return short_labels(v)


def short_labels(labels: dict[str, str]) -> dict[str, str]:
    """``labels``, or ValueError naming the first key or value that is too long or empty."""
    for k, val in labels.items():
        if not (0 < len(k) <= 128) or len(val) > 1024:
            raise ValueError(f"label {k!r}: keys must be 1-128 chars, values <= 1024 chars")
    return labels


class LimitReport(BaseModel):
    """What the host could enforce for each requested limit."""

    requested: str | None
    enforced: bool
    detail: str = ""


class SandboxInfo(BaseModel):
    sandbox_id: str
    status: SandboxStatus = Field(
        description="pending, running (= ready), paused, failed, deleting or deleted.")
    image: str
    block_network: bool
    cpu: str | None = None
    memory: str | None = None
    pids: int | None = None
    disk: str | None = None
    env: dict[str, str] = Field(default_factory=dict, description="Default env of its execs "
                                "(as asked for; forks inherit it).")
    from_snapshot: str | None = Field(None, description="The snapshot it started from.")
    workdir: str | None = Field(None, description="Default working directory of its execs.")
    paused_at: datetime | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    created_at: datetime
    ready_at: datetime | None = None
    ready_deadline: datetime | None = Field(
        None, description="A sandbox still pending then is failed.")
    expires_at: datetime | None = None
    last_heartbeat: datetime | None = None
    error: str | None = None
    image_error: str | None = Field(
        None, description="Why its image could not be had, when that failed it: "
        "digest_mismatch, disk_full, registry_unavailable, not_found, unauthorized, "
        "no_platform, bad_image.")
    progress: str | None = Field(
        None, description="What a pending sandbox is waiting for, e.g. its image's pull: "
        "'pulling python:3.12-slim: 12.3/45.6 MB, 1/3 layers'.")
    limits: dict[str, LimitReport] = Field(default_factory=dict)
    backend: str = "local"
    exclusive_exec: bool = False
    replica: str | None = Field(None, description="The orchestrator replica that launched it.")
    pool: str | None = Field(None, description="The warm pool it was taken from, if any.")
    session: str | None = None
    model_base_url: str | None = Field(
        None, description="The recording proxy's OpenAI base URL as seen from inside the "
        "sandbox (also in every exec's OPENAI_BASE_URL); set when model_proxy was asked for.")
    namespace: str | None = Field(None, description="The Kubernetes namespace of its pod.")
    egress: list[str] | None = None

    @computed_field(description="Whether it runs commands: status is running.")
    def ready(self) -> bool:
        return self.status == SandboxStatus.running

    @computed_field(description="Why it failed or was deleted (the same as 'error'); while "
                    "pending, what it waits for (its 'progress').")
    def status_message(self) -> str | None:
        if self.error is None and self.status == SandboxStatus.pending:
            return self.progress
        return self.error


class SandboxUsage(BaseModel):
    """What a sandbox uses now, from its cgroups and its writable layer (null: not measured
    by this backend)."""

    sandbox_id: str
    cpu_seconds: float | None = Field(None, description="CPU time used since it started.")
    memory_bytes: int | None = Field(None, description="Memory charged to it now.")
    pids: int | None = Field(None, description="Processes running in it.")
    disk_bytes: int | None = Field(
        None, description="Bytes its processes have written (its writable layer, allocated).")


class SandboxList(BaseModel):
    sandboxes: list[SandboxInfo]


class DeleteResponse(BaseModel):
    sandbox_id: str
    status: Literal["deleted"] = "deleted"
    found: bool = Field(True, description="False: there was no such sandbox (or it was "
                        "pruned long ago); deleting is idempotent, so this is no error.")


class ExecRequest(StrictModel):
    command: str | list[str] | None = Field(
        None, description="Shell command: run by /bin/bash -c when the image has bash, else "
        "/bin/sh -c. A list is joined with spaces into one such command (the reference "
        "SDK's form); for a program and its arguments without a shell, use 'argv'.")
    argv: list[str] | None = Field(None, min_length=1, description="Run without a shell.")
    timeout_seconds: float | None = Field(
        None, ge=0, le=24 * 3600, validate_default=True,
        description=f"Kill the command after this many seconds; absent, null or 0: "
        f"{DEFAULT_EXEC_TIMEOUT:g}.")
    cwd: str | None = Field(None, max_length=4096)
    env: dict[str, str] | None = Field(None, validate_default=True,
                                       description="Added to the sandbox's env.")
    login_shell: bool = False
    wait: bool = Field(True, description="Return the finished job; false returns job_id at once.")
    stdin: str | None = Field(None, description="Text fed to stdin; otherwise stdin is closed.")
    stdin_b64: str | None = Field(None, description="Bytes fed to stdin, base64.")
    max_output_bytes: int = Field(MAX_OUTPUT_BYTES_DEFAULT, ge=0, le=1 << 30)
    background: bool = Field(False, description="Start a long-lived process; see /processes.")
    stream: bool = Field(False, description="Stream output as NDJSON events while it runs.")

    @field_validator("command")
    @classmethod
    def _join_list(cls, v: str | list[str] | None) -> str | None:
        return " ".join(v) if isinstance(v, list) else v

    @field_validator("timeout_seconds")
    @classmethod
    def _default_timeout(cls, v: float | None) -> float:
        return v or DEFAULT_EXEC_TIMEOUT

    @field_validator("env")
    @classmethod
    def _no_env_is_empty(cls, v: dict[str, str] | None) -> dict[str, str]:
        return v or {}

    @model_validator(mode="after")
    def _one_program(self) -> ExecRequest:
        if (self.command is None) == (self.argv is None):
            raise ValueError("give exactly one of 'command' (a shell string) or 'argv' (a list)")
        if self.stdin is not None and self.stdin_b64 is not None:
            raise ValueError("give at most one of 'stdin' and 'stdin_b64'")
        if self.stdin_b64 is not None:
            try:
                base64.b64decode(self.stdin_b64, validate=True)
            except ValueError as e:
                raise ValueError(f"stdin_b64 is not valid base64: {e}") from None
        return self

    def stdin_bytes(self) -> bytes | None:
        if self.stdin_b64 is not None:
            return base64.b64decode(self.stdin_b64)
        return None if self.stdin is None else self.stdin.encode()


class Job(BaseModel):
    job_id: str
    sandbox_id: str
    command: str
    argv: list[str] | None = None
    status: JobStatus
    stdout: str = ""
    stderr: str = ""
    stdout_b64: str | None = Field(None, description="Set when stdout is not valid UTF-8.")
    stderr_b64: str | None = Field(None, description="Set when stderr is not valid UTF-8.")
    stdout_dropped: int = Field(0, description="Bytes cut from the middle of stdout.")
    stderr_dropped: int = 0
    exit_code: int | None = None
    timed_out: bool = False
    created_at: datetime
    started_at: datetime | None = None
    completed_at: datetime | None = None
    error: str | None = None
    replica: str | None = Field(None, description="The orchestrator replica that ran it.")


class JobAccepted(BaseModel):
    job_id: str
    status: JobStatus


class ProcessInfo(BaseModel):
    """A background process started with exec(background=True)."""

    process_id: str
    sandbox_id: str = ""
    command: str
    pid: int
    running: bool
    exit_code: int | None = None
    started_at: datetime | None = None


class ProcessList(BaseModel):
    processes: list[ProcessInfo]


class ProcessOutput(BaseModel):
    process_id: str
    running: bool
    exit_code: int | None
    stdout_b64: str
    stderr_b64: str
    stdout_offset: int = Field(description="Pass back as stdout_offset to read on from here.")
    stderr_offset: int
    stdout_dropped: int = Field(0, description="Bytes lost because the buffer rolled over.")
    stderr_dropped: int = 0


class PatchRequest(StrictModel):
    patch: str = Field(min_length=1)
    timeout_seconds: float = Field(60, gt=0, le=3600)
    cwd: str | None = Field(None, description="Directory to apply in (default /workspace).")


class PatchResponse(BaseModel):
    success: bool
    method: Literal["git apply", "git apply --reject", "patch --fuzz=5"] | None = None
    stdout: str = ""
    stderr: str = ""
    exit_code: int
    attempts: list[str] = Field(default_factory=list, description="Why each method failed.")


class FileUpload(StrictModel):
    path: str = Field(min_length=1, max_length=4096)
    content: str = Field(description="File content, base64.")
    mode: int | None = Field(None, ge=0, le=0o7777)


class FileEntry(BaseModel):
    name: str
    type: Literal["file", "directory", "symlink", "other"]
    size: int
    modified: float


class FileList(BaseModel):
    path: str
    files: list[FileEntry]


class FileWriteResult(BaseModel):
    path: str
    size: int


class FileDownload(BaseModel):
    path: str
    content: str = Field(description="File content, base64.")
    size: int


class PathRequest(StrictModel):
    path: str = Field(min_length=1, max_length=4096)
    recursive: bool = False


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    backend: str
    sandboxes: int
    version: str


class Resources(BaseModel):
    backend: str
    sandboxes: int
    max_sandboxes: int
    creates_in_flight: int
    max_concurrent_creates: int
    cpus: int
    memory_bytes: int
    cgroup: dict[str, str]


class ErrorBody(BaseModel):
    detail: str


class StreamEvent(BaseModel):
    """One NDJSON line of a streamed exec: output chunks, then one final 'exit' event."""

    type: Literal["stdout", "stderr", "exit"]
    data_b64: str | None = None
    job: Job | None = None


class EventKind(StrEnum):
    created = "created"
    ready = "ready"
    failed = "failed"
    exec = "exec"
    process = "process"
    file_write = "file_write"
    mkdir = "mkdir"
    remove = "remove"
    patch = "patch"
    snapshot = "snapshot"
    browser = "browser"
    http = "http"
    paused = "paused"
    resumed = "resumed"
    deleted = "deleted"


class PoolInfo(BaseModel):
    """A warm pool (GET /pools): its entry in orchard.yaml and how it fares."""

    name: str
    entry: dict[str, Any] = Field(description="The pool's entry, as configured.")
    size: int = Field(description="Sandboxes it keeps ready (the target).")
    ready: int = Field(description="Sandboxes ready to be taken now.")
    starting: int = Field(description="Sandboxes launching to refill it.")
    hits: int = Field(description="Creates that took one of its sandboxes.")
    misses: int = Field(description="Creates that matched it but found none ready.")


class SandboxEvent(BaseModel):
    """One thing the orchestrator did to a sandbox, with enough detail to redo it: the
    sandbox side of a rollout's trace. ``data`` per kind is listed in docs/guides/traces.md."""

    seq: int = Field(0, description="Order across all sandboxes; assigned by the store.")
    sandbox_id: str
    time: float = Field(description="Unix time the action started.")
    kind: EventKind
    session: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    data: dict[str, Any] = Field(default_factory=dict)


class EventList(BaseModel):
    events: list[SandboxEvent]
    next_after: int = Field(description="Pass back as `after` to read on from here.")
