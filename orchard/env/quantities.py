"""Kubernetes-style resource quantities ("500m", "2", "512Mi", "8Gi"), as the API accepts them."""

from __future__ import annotations

import re

_MEMORY_UNITS = {
    "": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_cpu(q: str) -> float:
    """Cores: "2" -> 2.0, "0.5" -> 0.5, "500m" -> 0.5."""
    m = _QUANTITY.match(q)
    if not m or m.group(2) not in ("", "m"):
        raise ValueError(f"cpu {q!r} is not a quantity like '2', '0.5' or '500m'")
    value = float(m.group(1))
    return value / 1000 if m.group(2) == "m" else value


def parse_memory(q: str) -> int:
    """Bytes: "512Mi" -> 536870912, "1G" -> 10**9, "1000" -> 1000."""
    m = _QUANTITY.match(q)
    if not m or m.group(2) not in _MEMORY_UNITS:
        raise ValueError(f"memory {q!r} is not a quantity like '512Mi', '8Gi' or '1G'")
    return int(float(m.group(1)) * _MEMORY_UNITS[m.group(2)])
