"""The text format: ``<count><char>`` per run, the count omitted when it is 1.

Digits and backslashes in the data would be ambiguous, so they are escaped with a
backslash: ``encode("1112") == "3\\\\1\\\\2"``.
"""

from __future__ import annotations

from rlecodec.errors import DecodeError
from rlecodec.runs import iter_runs

ESCAPE = "\\"


def _needs_escape(char: str) -> bool:
    return char.isdigit() or char == ESCAPE


def encode(text: str) -> str:
    """Run-length encode ``text``."""
    out = []
    for char, count in iter_runs(text):
        if count > 1:
            out.append(str(count))
        out.append(ESCAPE + char if _needs_escape(char) else char)
    return "".join(out)


def decode(data: str) -> str:
    """Decode the output of :func:`encode`; raises :class:`DecodeError` if malformed."""
    out = []
    pos = 0
    while pos < len(data):
        start = pos
        while pos < len(data) and data[pos] in "0123456789":
            pos += 1
        count = int(data[start:pos]) if pos > start else 1
        if count == 0:
            raise DecodeError("zero run length", start)
        if pos == len(data):
            raise DecodeError("run length without a character", start)
        char = data[pos]
        if char == ESCAPE:
            pos += 1
            if pos == len(data):
                raise DecodeError("dangling escape", pos - 1)
            char = data[pos]
        out.append(char * count)
        pos += 1
    return "".join(out)
