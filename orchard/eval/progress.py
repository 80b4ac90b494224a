"""Run progress: a rich live display on a terminal (done/total, running, resolved so far, ETA),
one plain log line per finished rollout otherwise (CI logs, files, pipes)."""

from __future__ import annotations

import sys
import threading
import time
from typing import IO, Self

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from orchard.eval.results import RolloutResult


class RunProgress:
    def __init__(self, concurrency: int, *, stream: IO[str] | None = None,
                 live: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.concurrency = concurrency
        self.total = self.done = self.resolved = self.failed = self.resumed = 0
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def start(self, _: RolloutResult | None, done: int, total: int) -> None:
        """Called once by the runner: ``done`` rollouts of ``total`` finished before."""
        self.total, self.done, self.resumed = total, done, done
        self._t0 = time.monotonic()
        if self.live:
            self._progress = Progress(
                TextColumn("[bold]eval"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"), TimeElapsedColumn(), TextColumn("ETA"),
                TimeRemainingColumn(), console=Console(file=self.stream), transient=False)
            self._task = self._progress.add_task("eval", total=total, completed=done,
                                                 status=self._status())
            self._progress.start()
        else:
            self._line(f"{total - done} rollouts to run ({done} of {total} already done), "
                       f"{self.concurrency} at a time")

    def _running(self) -> int:
        return min(self.concurrency, self.total - self.done)

    def _status(self) -> str:
        return (f"running {self._running()}  resolved {self.resolved}/{self.done - self.resumed}"
                + (f"  failed {self.failed}" if self.failed else ""))

    def _eta(self) -> str:
        new = self.done - self.resumed
        if not new:
            return "?"
        left = (time.monotonic() - self._t0) / new * (self.total - self.done)
        return f"{left:.0f}s"

    def update(self, r: RolloutResult) -> None:
        with self._lock:
            self.done += 1
            self.resolved += r.resolved
            self.failed += r.failure is not None
            if self._progress is not None and self._task is not None:
                self._progress.update(self._task, completed=self.done, status=self._status())
                return
            what = ("resolved" if r.resolved else
                    f"failed ({r.failure.cls}: {r.failure.type})" if r.failure else
                    f"not resolved ({r.grade.outcome})" if r.grade else r.exit_status)
            self._line(f"[{self.done}/{self.total}] {r.instance_id}#{r.sample} {what} "
                       f"in {r.timings.total:.1f}s | resolved {self.resolved}/"
                       f"{self.done - self.resumed} | running {self._running()} | "
                       f"ETA {self._eta()}")

    def _line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
