"""The :class:`BloomSet` filter."""

from __future__ import annotations

import hashlib
import struct
from typing import Iterable, Union

from .sizing import expected_error_rate, optimal_num_bits, optimal_num_hashes

Key = Union[str, bytes]
_HEADER = struct.Struct(">QIQ")  # num_bits, num_hashes, count


def _to_bytes(key: Key) -> bytes:
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode("utf-8")
    raise TypeError(f"keys must be str or bytes, not {type(key).__name__}")


class BloomSet:
    """A Bloom filter: a set that may report false positives, never false negatives.

    Use :meth:`for_capacity` to size the filter from the number of items you
    expect and the false-positive rate you can tolerate.
    """

    def __init__(self, num_bits: int, num_hashes: int):
        if num_bits <= 0 or num_hashes <= 0:
            raise ValueError("num_bits and num_hashes must be positive")
        self.num_bits = num_bits
        self.num_hashes = num_hashes
        self._bits = bytearray((num_bits + 7) // 8)
        self._count = 0

    @classmethod
    def for_capacity(cls, capacity: int, error_rate: float = 0.01) -> "BloomSet":
        """A filter holding ``capacity`` items at about ``error_rate`` false positives."""
        num_bits = optimal_num_bits(capacity, error_rate)
        return cls(num_bits, optimal_num_hashes(num_bits, capacity))

    # -- hashing ------------------------------------------------------------
    def _positions(self, key: Key) -> list[int]:
        """Bit positions for ``key`` using double hashing (Kirsch-Mitzenmacher)."""
        digest = hashlib.blake2b(_to_bytes(key), digest_size=16).digest()
        h1 = int.from_bytes(digest[:8], "big")
        h2 = int.from_bytes(digest[8:], "big") | 1
        return [(h1 + i * h2) % self.num_bits for i in range(self.num_hashes)]

    def _get(self, pos: int) -> bool:
        return bool(self._bits[pos >> 3] & (1 << (pos & 7)))

    def _set(self, pos: int) -> None:
        self._bits[pos >> 3] |= 1 << (pos & 7)

    # -- set-like API -------------------------------------------------------
    def add(self, key: Key) -> None:
        for pos in self._positions(key):
            self._set(pos)
        self._count += 1

    def update(self, keys: Iterable[Key]) -> None:
        for key in keys:
            self.add(key)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, (str, bytes)):
            return False
        return all(self._get(pos) for pos in self._positions(key))

    def __len__(self) -> int:
        """Number of :meth:`add` calls (duplicates included)."""
        return self._count

    def bits_set(self) -> int:
        return sum(bin(byte).count("1") for byte in self._bits)

    def estimated_error_rate(self) -> float:
        """Expected false-positive rate given the items added so far."""
        return expected_error_rate(self.num_bits, self.num_hashes, self._count)

    def _check_compatible(self, other: "BloomSet") -> None:
        if (self.num_bits, self.num_hashes) != (other.num_bits, other.num_hashes):
            raise ValueError("filters have different sizes or hash counts")

    def __or__(self, other: "BloomSet") -> "BloomSet":
        if not isinstance(other, BloomSet):
            return NotImplemented
        self._check_compatible(other)
        merged = BloomSet(self.num_bits, self.num_hashes)
        merged._bits = bytearray(a | b for a, b in zip(self._bits, other._bits))
        merged._count = self._count + other._count
        return merged

    # -- serialisation ------------------------------------------------------
    def to_bytes(self) -> bytes:
        return _HEADER.pack(self.num_bits, self.num_hashes, self._count) + bytes(self._bits)

    @classmethod
    def from_bytes(cls, data: bytes) -> "BloomSet":
        num_bits, num_hashes, count = _HEADER.unpack_from(data)
        bloom = cls(num_bits, num_hashes)
        body = data[_HEADER.size:]
        if len(body) != len(bloom._bits):
            raise ValueError("corrupt filter: wrong payload length")
        bloom._bits = bytearray(body)
        bloom._count = count
        return bloom

    def __repr__(self) -> str:
        return (f"BloomSet(num_bits={self.num_bits}, num_hashes={self.num_hashes}, "
                f"count={self._count})")
