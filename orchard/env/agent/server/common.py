"""Constants and helpers that every part of the agent shares."""

import base64
import os
import threading
import time

MARKER = "ORCHARD_EXEC_ID"
WORKDIR = "/workspace"
CHUNK = 1 << 16
PROCESS_BUFFER = 1 << 20
DRAIN_LIMIT = 1 << 20
# How long an exec keeps reading after its command exited, for output still in the pipes.
# Processes it left running in the background may hold the pipes open for ever: past this,
# their output is drained and dropped.
EXIT_GRACE = 0.1
PIPE_MAX = 1 << 20  # the most a Linux pipe buffers (/proc/sys/fs/pipe-max-size default)


class HTTPError(Exception):
    def __init__(self, status, detail):
        super().__init__(detail)
        self.status = status
        self.detail = detail


def now():
    return time.time()


def text_or_b64(data, key, out):
    try:
        out[key] = data.decode()
    except UnicodeDecodeError:
        out[key] = ""
        out[key + "_b64"] = base64.b64encode(data).decode()


def resolve(path):
    if not path:
        raise HTTPError(400, "missing 'path' query parameter")
    return os.path.normpath(path if path.startswith("/") else os.path.join(WORKDIR, path))


_exec_counter = [0]
_exec_lock = threading.Lock()


def next_id(prefix):
    with _exec_lock:
        _exec_counter[0] += 1
        return f"{prefix}{os.getpid()}-{_exec_counter[0]}"


def exit_status(code):
    return 128 - code if code < 0 else code
