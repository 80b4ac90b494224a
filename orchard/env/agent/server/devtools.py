"""Chromium and its DevTools protocol pipe: finding the browser, starting it as the agent's
child with the protocol on fds 3 and 4, and requests over that pipe from any thread.

Standard library only, like the rest of the agent.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import threading
import time

from .common import HTTPError

BUNDLE_PYTHON = "/.orchard/bundle/bin/python3"
CHROMIUM = ("chromium", "chromium-browser", "google-chrome", "headless_shell")
# The orchestrator's Chromium, when it carries one in (orchard/env/agent/browser_bundle.py).
INJECTED = "/.orchard/browser/current"
VIEWPORT = (1280, 800)
# Where a live fork leaves a restored browser's protocol pipe (FIFOs) and pid.
RESTORED_DIR = "/tmp/.orchard-devtools"
NAVIGATION_GRACE = 0.15
# The browser is made a subreaper (kept across exec): Crashpad's handler daemonizes, and must
# land in the browser's process tree, not pid 1's, for a live snapshot to take them together.
_ON_3_AND_4 = ("import ctypes, os, sys; ctypes.CDLL(None).prctl(36, 1, 0, 0, 0); "
               "os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
               "os.execv(sys.argv[3], sys.argv[3:])")


class BrowserGone(HTTPError):
    """The browser exited: this request fails, and the next starts a fresh one."""

    def __init__(self):
        super().__init__(504, "the browser exited; it restarts on the next request")


class _Orphan:
    """A restored browser, as much of subprocess.Popen as DevTools uses: pid 1's reaper
    collects it, so it is alive while its pid is and is no zombie."""

    def __init__(self, pid):
        self.pid = pid

    def poll(self):
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                return -1 if f.read().rpartition(")")[2].split()[0] == "Z" else None
        except OSError:
            return -1

    def wait(self, timeout):
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("chromium", timeout)
            time.sleep(0.05)
        return -1


class DevTools:
    """One Chromium and its protocol pipe; requests from any thread, events kept per session."""

    def __init__(self, proc, to_w, from_r):
        self.proc, self._to_w, self._from_r = proc, to_w, from_r
        self._next = 0
        self.answered = 0  # so a caller can tell a browser that died before its request
        self._lock = threading.Lock()
        self._answers = {}
        self._cond = threading.Condition()
        self.loading = {}  # session -> frames loading
        self.settled_at = {}
        threading.Thread(target=self._read, daemon=True).start()

    @classmethod
    def launch(cls, executable, env):
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        # Moved above 9 first, so that placing them on 3 and 4 below overwrites neither.
        to_r, from_w = (_high(fd) for fd in (to_r, from_w))
        # The browser reads commands on fd 3 and writes answers on fd 4. A few lines of
        # Python put them there: dash, the usual /bin/sh, cannot name fds above 9.
        profile = "/tmp/.orchard-browser"
        # Without smooth scrolling a wheel scroll lands at once, so the observation after it
        # shows the scrolled page and a click after it aims at a page that holds still.
        proc = subprocess.Popen(
            [_python(), "-I", "-S", "-c", _ON_3_AND_4, str(to_r), str(from_w), executable,
             "--headless", "--no-sandbox",
             "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--disable-sync",
             "--disable-background-networking", "--mute-audio", "--hide-scrollbars",
             "--disable-smooth-scrolling",
             f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}", f"--user-data-dir={profile}",
             "--remote-debugging-pipe", "about:blank"],
            pass_fds=(to_r, from_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True, env={**os.environ, **env})
        os.close(to_r)
        os.close(from_w)
        return cls(proc, to_w, from_r)

    @classmethod
    def restored(cls):
        """The browser a live fork restored (see orchard/env/backends/local/checkpoint.py),
        once: its protocol pipe became two FIFOs, and it is pid 1's orphan now. None if there
        is none, or it is gone."""
        try:
            with open(os.path.join(RESTORED_DIR, "restored.json")) as f:
                pid = int(json.load(f)["pid"])
            os.unlink(os.path.join(RESTORED_DIR, "restored.json"))
            # The browser holds both FIFOs open read-write, so neither open blocks.
            to_w = os.open(os.path.join(RESTORED_DIR, "commands"), os.O_WRONLY | os.O_CLOEXEC)
            from_r = os.open(os.path.join(RESTORED_DIR, "answers"), os.O_RDONLY | os.O_CLOEXEC)
        except (OSError, ValueError, KeyError):
            return None
        return cls(_Orphan(pid), to_w, from_r)

    def alive(self):
        if self.proc.poll() is not None or None in self._answers:
            return False
        # A browser on its way out closes its end of the pipe before it can be reaped.
        watch = select.poll()
        watch.register(self._to_w, select.POLLOUT)
        return not any(ev & (select.POLLERR | select.POLLHUP) for _, ev in watch.poll(0))

    def _read(self):
        buf = b""
        while True:
            try:
                data = os.read(self._from_r, 1 << 16)
            except OSError:
                data = b""
            if not data:
                with self._cond:
                    self._answers[None] = "closed"
                    self._cond.notify_all()
                return
            buf += data
            *messages, buf = buf.split(b"\0")
            for raw in messages:
                self._dispatch(json.loads(raw))

    def _dispatch(self, msg):
        with self._cond:
            if "id" in msg:
                self._answers[msg["id"]] = msg
            else:
                session, method = msg.get("sessionId"), msg.get("method")
                frames = self.loading.setdefault(session, set())
                frame = msg.get("params", {}).get("frameId")
                # A requested navigation counts as loading at once: on a busy machine the
                # load itself may start well after the click that asked for it returned.
                if method in ("Page.frameStartedLoading", "Page.frameRequestedNavigation"):
                    frames.add(frame)
                elif method in ("Page.frameStoppedLoading", "Page.frameDetached",
                                "Page.navigatedWithinDocument",
                                "Page.frameClearedScheduledNavigation"):
                    frames.discard(frame)
                    self.settled_at[session] = time.monotonic()
            self._cond.notify_all()

    def call(self, method, params=None, session=None, timeout=30.0):
        with self._lock:
            self._next += 1
            ident = self._next
            msg = {"id": ident, "method": method, "params": params or {}}
            if session:
                msg["sessionId"] = session
            try:
                os.write(self._to_w, json.dumps(msg).encode() + b"\0")
            except BrokenPipeError:
                raise BrowserGone() from None
        deadline = time.monotonic() + timeout
        with self._cond:
            while ident not in self._answers:
                left = deadline - time.monotonic()
                if None in self._answers:
                    raise BrowserGone()
                if left <= 0:
                    raise HTTPError(504, f"the browser did not answer {method} in {timeout:g}s")
                self._cond.wait(left)
            answer = self._answers.pop(ident)
            self.answered += 1
        if "error" in answer:
            raise RuntimeError(answer["error"].get("message", str(answer["error"])))
        return answer.get("result", {})

    def settle(self, session, timeout, since=0.0):
        """Until no frame of the session is loading and none has for 100 ms (and for the
        navigation grace since ``since``), or timeout; True if it settled."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                now = time.monotonic()
                quiet = min(now - self.settled_at.get(session, 0.0),
                            now - since - NAVIGATION_GRACE + 0.1)
                if not self.loading.get(session) and quiet >= 0.1:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))

    def close(self):
        with contextlib.suppress(OSError):
            os.close(self._to_w)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 9)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


def find_chromium():
    """The injected Chromium and its environment, else one on the image's PATH."""
    bundle = os.path.realpath(INJECTED)
    if os.access(os.path.join(bundle, "chromium"), os.X_OK):
        return os.path.join(bundle, "chromium"), {
            "FONTCONFIG_FILE": os.path.join(bundle, "fonts.conf")}
    executable = next((p for p in map(shutil.which, CHROMIUM) if p), None)
    if executable is None:
        raise HTTPError(400, "no Chromium in this sandbox: the orchestrator's host has none to "
                        "carry in (install Debian's chromium package there; `make setup` "
                        "does) and the image has none on its PATH")
    return executable, {}


def _python():
    """The agent's interpreter as this process sees it: a forked agent's sys.executable names a
    host path, gone inside the sandbox, where the bundle's is."""
    return next((p for p in (sys.executable, BUNDLE_PYTHON) if os.path.exists(p)), sys.executable)


def _high(fd):
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return moved
