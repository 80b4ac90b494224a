"""Kubernetes-style resource quantities ("500m", "2", "512Mi", "8Gi"), as the API accepts them."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

_CPU_RE = re.compile(r"(?P<num>\d+(?:\.\d*)?|\.\d+)(?P<milli>m?)")
_MEMORY_RE = re.compile(r"(?P<num>\d+(?:\.\d*)?|\.\d+)(?P<suffix>[KMGTPE]i|[kMGTPE])?")
_MEMORY_SUFFIXES = {
    None: 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def parse_cpu(q: str) -> float:
    """Kubernetes CPU quantity ("2", "0.5", "500m") -> cores."""
    m = _CPU_RE.fullmatch(q.strip())
    if m is None:
        raise ValueError(
            f"invalid cpu quantity {q!r}: expected cores like '2' or '0.5', or millicores "
            "like '500m'"
        )
    cores = float(m["num"]) / (1000 if m["milli"] else 1)
    if cores < 0.001:
        raise ValueError(f"invalid cpu quantity {q!r}: must be at least 1m (0.001 cores)")
    return cores


def parse_memory(q: str) -> int:
    """Kubernetes memory quantity ("512Mi", "8Gi", "1G", "1000", "1.5Gi") -> bytes (rounded up)."""
    text = q.strip()
    m = _MEMORY_RE.fullmatch(text)
    if m is None:
        hint = ""
        if text.endswith("m"):
            hint = " ('m' means milli in Kubernetes quantities; did you mean 'Mi'?)"
        elif text.endswith(("K", "KB", "MB", "GB", "kb", "mb", "gb")):
            hint = " (use Ki/Mi/Gi for binary or k/M/G for decimal units)"
        raise ValueError(
            f"invalid memory quantity {q!r}: expected a number with an optional suffix "
            f"Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P or E, e.g. '512Mi'{hint}"
        )
    try:
        value = Decimal(m["num"]) * _MEMORY_SUFFIXES[m["suffix"]]
    except InvalidOperation as exc:  # pragma: no cover - the regex only admits decimals
        raise ValueError(f"invalid memory quantity {q!r}") from exc
    size = math.ceil(value)
    if size <= 0:
        raise ValueError(f"invalid memory quantity {q!r}: must be greater than zero")
    return size
