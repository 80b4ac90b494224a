"""The binary format: a ``(count, value)`` byte pair per run, count in 1..255."""

from __future__ import annotations

from rlecodec.errors import DecodeError
from rlecodec.runs import iter_runs


def encode_bytes(data: bytes) -> bytes:
    """Run-length encode ``data`` as ``(count, value)`` byte pairs."""
    out = bytearray()
    for value, count in iter_runs(data):
        out += bytes((count, value))
    return bytes(out)


def decode_bytes(data: bytes) -> bytes:
    """Decode the output of :func:`encode_bytes`; raises :class:`DecodeError` if
    malformed."""
    if len(data) % 2:
        raise DecodeError("odd length: truncated pair", len(data) - 1)
    out = bytearray()
    for pos in range(0, len(data), 2):
        count, value = data[pos], data[pos + 1]
        if count == 0:
            raise DecodeError("zero run length", pos)
        out += bytes((value,)) * count
    return bytes(out)
