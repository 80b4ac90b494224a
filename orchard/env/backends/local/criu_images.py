"""The one edit a live snapshot makes to CRIU's images: its user namespace becomes "ours".

CRIU dumps as host root, so the sandbox's user namespace is foreign to it and is saved (its
uid map names the source sandbox's host uids). A fork must not get those uids, and CRIU
restores as the fork's root, inside the fork's user namespace. So the inventory is told that
the tree's user namespace is CRIU's own (``root_ids.user_ns_id`` = the root task's), and the
saved namespace is dropped: the tree is restored into the user namespace CRIU runs in.

An image file is its magic (one 32-bit word for the inventory, two for the others), then
entries, each a 32-bit little-endian length and a protobuf message. Only the fields below are
read or written; the rest is copied through byte for byte.
"""

from __future__ import annotations

import struct
from pathlib import Path

from orchard.env.errors import OrchestratorError

# images/inventory.proto and images/core.proto (task_kobj_ids_entry).
INVENTORY_ROOT_IDS = 3
IDS_USER_NS = 10
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


class ImageFormatError(OrchestratorError, ValueError):
    """An image is not laid out as CRIU 4 writes it."""


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf):
            raise ImageFormatError("a varint runs past the message")
        b = buf[i]
        value |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return value, i
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b, value = value & 0x7F, value >> 7
        out.append(b | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _fields(msg: bytes) -> list[tuple[int, int, bytes]]:
    """(field number, wire type, raw value) in order; varints raw-encoded."""
    out, i = [], 0
    while i < len(msg):
        key, j = _varint(msg, i)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            _, end = _varint(msg, j)
        elif wire == _LENGTH:
            size, j = _varint(msg, j)
            end = j + size
        elif wire in (_FIXED32, _FIXED64):
            end = j + (4 if wire == _FIXED32 else 8)
        else:
            raise ImageFormatError(f"wire type {wire} is not used by CRIU's images")
        out.append((number, wire, msg[j:end]))
        i = end
    return out


def _join(fields: list[tuple[int, int, bytes]]) -> bytes:
    out = bytearray()
    for number, wire, raw in fields:
        out += _encode_varint(number << 3 | wire)
        out += _encode_varint(len(raw)) + raw if wire == _LENGTH else raw
    return bytes(out)


def _single_entry(data: bytes, magics: int) -> bytes:
    head = 4 * magics
    (size,) = struct.unpack_from("<I", data, head)
    if head + 4 + size != len(data):
        raise ImageFormatError("expected exactly one entry")
    return data[head + 4:]


def _with_entry(data: bytes, magics: int, entry: bytes) -> bytes:
    return data[:4 * magics] + struct.pack("<I", len(entry)) + entry


def adopt_user_namespace(images: Path, root_pid: int) -> None:
    """Make the dumped tree's user namespace the restorer's own (see the module doc)."""
    ids = _fields(_single_entry((images / f"ids-{root_pid}.img").read_bytes(), 2))
    user = [raw for number, _, raw in ids if number == IDS_USER_NS]
    if not user:
        raise ImageFormatError(f"ids-{root_pid}.img names no user namespace")
    inventory = images / "inventory.img"
    data = inventory.read_bytes()
    entry = _fields(_single_entry(data, 1))
    for k, (number, wire, raw) in enumerate(entry):
        if number == INVENTORY_ROOT_IDS:
            root_ids = [(n, w, user[0] if n == IDS_USER_NS else r) for n, w, r in _fields(raw)]
            entry[k] = (number, wire, _join(root_ids))
    inventory.write_bytes(_with_entry(data, 1, _join(entry)))
    for saved in images.glob("userns-*.img"):
        saved.unlink()
