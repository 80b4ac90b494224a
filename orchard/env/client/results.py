"""What the SDK returns: the wire models, plus exact byte accessors for base64 fields."""

from __future__ import annotations

import base64

from orchard.env import schema


def b64decode(data: str | None) -> bytes:
    return base64.b64decode(data) if data else b""


class ExecResult(schema.Job):
    """A job. ``stdout``/``stderr`` are text; the ``*_bytes`` properties are exact."""

    @property
    def stdout_bytes(self) -> bytes:
        # The server sets *_b64 only when the output is not UTF-8; then the text is lossy.
        return b64decode(self.stdout_b64) if self.stdout_b64 is not None else self.stdout.encode()

    @property
    def stderr_bytes(self) -> bytes:
        return b64decode(self.stderr_b64) if self.stderr_b64 is not None else self.stderr.encode()

    @property
    def finished(self) -> bool:
        return self.status in (schema.JobStatus.succeeded, schema.JobStatus.failed)

    @property
    def ok(self) -> bool:
        """Finished in time with exit code 0."""
        return self.finished and self.exit_code == 0 and not self.timed_out


class ExecEvent(schema.StreamEvent):
    """One event of a streamed exec: an output chunk, or the final ``exit`` with the job."""

    job: ExecResult | None = None

    @property
    def data(self) -> bytes:
        return b64decode(self.data_b64)


class ProcessOutputResult(schema.ProcessOutput):
    """New output of a background process since the offsets that were asked for."""

    @property
    def stdout_bytes(self) -> bytes:
        return b64decode(self.stdout_b64)

    @property
    def stderr_bytes(self) -> bytes:
        return b64decode(self.stderr_b64)
