"""Where the proxy keeps what it saw: one JSON line per model call, one file per session.

Each call is appended, flushed and fsynced on its own, so a crash of the proxy loses at most the
call in flight, and a reader never sees half a record (a torn last line is skipped).
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any

from pydantic import ConfigDict
from typing_extensions import TypedDict

SESSION_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ModelCall(TypedDict, total=False):
    """One recorded model call, as the proxy stores it and a trace holds it.

    A dict on the wire and on disk (one JSON line each); typed so that readers know its fields,
    as sandbox events are. Fields a newer proxy adds are kept, not dropped.
    """

    __pydantic_config__ = ConfigDict(extra="allow")  # type: ignore[misc]

    session: str
    index: int
    endpoint: str
    upstream: str
    request: Any
    started_at: float
    latency_ms: float
    status: int
    response: Any
    """The answer (a streamed one assembled into the plain endpoint's shape), or its text."""
    tokens: dict[str, Any] | None
    """Prompt and completion token ids, when the upstream or the renderer gave them."""
    rendered: dict[str, Any]
    """Set when the proxy rendered a chat call into a token-id completion request."""
    error: Any
    """Why the call failed: the proxy's message, or the upstream's error body."""
    record_error: str


class BadSession(ValueError):
    """A session id that cannot name a file; the message says what is allowed."""


def check_session(session: str) -> str:
    if not SESSION_PATTERN.match(session):
        raise BadSession(f"session id {session!r} must be 1-128 characters of letters, digits, "
                         "'.', '_' or '-', starting with a letter or digit")
    return session


class SessionStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._next_index: dict[str, int] = {}

    def _path(self, session: str) -> Path:
        return self.root / f"{check_session(session)}.jsonl"

    def append(self, session: str, record: ModelCall) -> ModelCall:
        """Store record as the session's next call (its `index` is set here); blocking."""
        path = self._path(session)
        with self._lock:
            if session not in self._next_index:
                self._next_index[session] = len(self.read(session) or [])
            record = record.copy()  # the caller's call stays as it was
            record.update(session=session, index=self._next_index[session])
            line = json.dumps(record, separators=(",", ":")).encode() + b"\n"
            with open(path, "ab+") as f:
                end = f.seek(0, os.SEEK_END)
                if end:
                    f.seek(end - 1)
                    if f.read(1) != b"\n":
                        line = b"\n" + line  # after a torn write: keep the tear on its own line
                f.write(line)  # append mode: always at the end, wherever we read
                f.flush()
                os.fsync(f.fileno())
            self._next_index[session] += 1
        return record

    def read(self, session: str) -> list[ModelCall] | None:
        """The session's calls in order, or None if it has none."""
        path = self._path(session)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        calls: list[ModelCall] = []
        for line in text.splitlines():
            try:
                calls.append(json.loads(line))
            except ValueError:
                continue  # the torn tail of a write a crash interrupted
        return calls

    def sessions(self) -> list[str]:
        return sorted(p.stem for p in self.root.glob("*.jsonl"))

