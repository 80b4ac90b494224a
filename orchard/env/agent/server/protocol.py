"""The agent's wire protocol: JSON bodies of its endpoints, shared with ``agent.client``.

Standard library only, like the rest of the agent. The agent's modules import this file only
for type checkers (``typing`` is a heap cost every sandbox would pay); the client imports it.
"""

from typing import NotRequired, TypedDict


class Health(TypedDict):
    """GET /health. An unauthenticated probe of a token-protected agent gets ``status`` only."""

    status: str
    pid: NotRequired[int]
    processes: NotRequired[int]


class ProcessRequest(TypedDict, total=False):
    """POST /processes. ``command`` (run by the shell) wins over ``argv``."""

    argv: list[str]
    command: str
    login_shell: bool
    cwd: str
    env: dict[str, str]


class ExecRequest(ProcessRequest, total=False):
    """POST /exec."""

    stdin_b64: str | None
    timeout: float | None
    max_output_bytes: int
    stream: bool


class ExecResult(TypedDict):
    """POST /exec's answer. Output that is not UTF-8 comes as ``*_b64`` with ``""`` beside it."""

    exit_code: int
    timed_out: bool
    started_at: float
    completed_at: float
    stdout: str
    stderr: str
    stdout_b64: NotRequired[str]
    stderr_b64: NotRequired[str]
    stdout_dropped: int
    stderr_dropped: int


class ExecEvent(TypedDict):
    """One NDJSON line of a streamed exec: output (``data_b64``), then one ``exit``."""

    type: str
    data_b64: NotRequired[str]
    result: NotRequired[ExecResult]


class ProcessInfo(TypedDict):
    """A background process: POST /processes, GET and DELETE /processes/ID."""

    process_id: str
    command: str
    pid: int
    running: bool
    exit_code: int | None
    started_at: float


class ProcessList(TypedDict):
    """GET /processes."""

    processes: list[ProcessInfo]


class ProcessOutput(TypedDict):
    """GET /processes/ID/output: what followed the offsets asked for, and where to go on from."""

    process_id: str
    running: bool
    exit_code: int | None
    stdout_b64: str
    stdout_offset: int
    stdout_dropped: int
    stderr_b64: str
    stderr_offset: int
    stderr_dropped: int


class FileEntry(TypedDict):
    name: str
    type: str  # directory, file, symlink or other
    size: int
    modified: float


class DirListing(TypedDict):
    """GET /files/list."""

    path: str
    files: list[FileEntry]


class FileWritten(TypedDict):
    """PUT /files."""

    path: str
    size: int


class PathResult(TypedDict):
    """POST /files/mkdir and DELETE /files: the absolute path acted on."""

    path: str


class PatchRequest(TypedDict):
    """POST /patch."""

    patch: str
    cwd: NotRequired[str]
    timeout: NotRequired[float]


class PatchResult(TypedDict):
    """POST /patch's answer; ``attempts`` says why each method tried before failed."""

    success: bool
    method: str | None
    stdout: str
    stderr: str
    exit_code: int
    attempts: list[str]


class ArchiveRestored(TypedDict):
    """PUT /archive (a tar body): the trees it replaced, and how many regular files it wrote."""

    paths: list[str]
    files: int


class SignalRequest(TypedDict):
    """POST /signal: STOP pauses every process of the sandbox but the agent, CONT resumes."""

    signal: str


class Signalled(TypedDict):
    """POST /signal's answer; ``not_permitted`` counts processes the agent may not signal."""

    signalled: int
    not_permitted: int


class BrowserRequest(TypedDict, total=False):
    """POST /browser: one action, then an observation (see browser.py)."""

    action: str  # observe, goto, click, type, select, scroll, press, back, tab
    url: str
    id: int
    x: float
    y: float
    text: str
    submit: bool
    clear: bool
    value: str
    direction: str
    amount: int
    key: str
    op: str
    index: int
    screenshot: bool
    marks: bool
    timeout: float


class BrowserTab(TypedDict):
    index: int
    url: str
    title: str
    active: bool


class BrowserObservation(TypedDict):
    url: str
    title: str
    tabs: list[BrowserTab]
    tree: str
    truncated: bool
    elements: int
    error: str | None
    screenshot_png_b64: NotRequired[str]


class ServiceRequest(TypedDict, total=False):
    """POST /http: a request to a service on the sandbox's loopback (see forward.py)."""

    port: int
    method: str
    path: str
    headers: dict[str, str]
    body: str
    timeout: float


class ServiceResponse(TypedDict):
    status: int
    headers: dict[str, str]
    body: str
    encoding: str  # utf-8, or base64 for a body that is not text
