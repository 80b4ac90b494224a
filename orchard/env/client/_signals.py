"""Delete a client's sandboxes when the process is told to stop (SIGINT, SIGTERM).

A signal handler runs on the main thread between two bytecodes, possibly in the middle of a
request on the client's own connection pool, and cannot await anything; so the cleanup here
uses a short-lived blocking connection of its own, whichever twin installed it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from urllib.parse import quote

import httpx

log = logging.getLogger("orchard.client")

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class SignalCleanup:
    """Runs ``cleanup`` on SIGINT/SIGTERM, then hands the signal to the previous handler."""

    def __init__(self, cleanup: Callable[[], None]) -> None:
        self._cleanup = cleanup
        self._active = True
        self._previous: dict[int, Callable[[int, FrameType | None], object] | int] = {}
        for sig in _SIGNALS:
            previous = signal.getsignal(sig)
            # SIG_IGN: the process means to live on, so its sandboxes must too. None: a handler
            # set outside Python, which could not be restored afterwards.
            if previous is None or previous == signal.SIG_IGN:
                continue
            self._previous[sig] = previous
            signal.signal(sig, self._handle)

    @staticmethod
    def can_install() -> bool:
        """Python only lets the main thread set signal handlers."""
        return threading.current_thread() is threading.main_thread()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._active:
            # Once is enough: a second Ctrl-C while deleting must still get through.
            self._active = False
            try:
                self._cleanup()
            except Exception:
                log.exception("orchard: cleanup on signal %d failed", signum)
        previous = self._previous[signum]
        if callable(previous):
            previous(signum, frame)
        else:
            # SIG_DFL: die of the signal as the process would have without us.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def uninstall(self) -> None:
        self._active = False
        if not self.can_install():
            return  # left in place, inert: it only chains to the previous handler now
        for sig, previous in self._previous.items():
            # Someone installed a handler after us and chains to ours: leave theirs alone.
            if signal.getsignal(sig) == self._handle:
                signal.signal(sig, previous)


def delete_sandboxes(
    base_url: str, headers: dict[str, str], sandbox_ids: Iterable[str], timeout: float = 10.0
) -> None:
    """Best-effort blocking DELETE of each sandbox, for use inside a signal handler."""
    with httpx.Client(base_url=base_url, headers=headers, timeout=timeout) as http:
        for sandbox_id in sandbox_ids:
            try:
                response = http.delete(f"/sandboxes/{quote(sandbox_id, safe='')}")
            except httpx.HTTPError as exc:
                log.warning("orchard: could not delete sandbox %s: %s", sandbox_id, exc)
                continue
            if response.is_error and response.status_code != 404:
                log.warning(
                    "orchard: could not delete sandbox %s: %d %s",
                    sandbox_id,
                    response.status_code,
                    response.text,
                )
