"""Classic Bloom filter sizing formulas.

For ``n`` expected items and a target false-positive probability ``p``:

- bits:   ``m = -n * ln(p) / ln(2)**2``
- hashes: ``k = (m / n) * ln(2)``
- after inserting ``n`` items the false-positive probability is
  ``(1 - exp(-k * n / m)) ** k``
"""

from __future__ import annotations

import math

LN2 = math.log(2)


def optimal_num_bits(capacity: int, error_rate: float) -> int:
    """Number of bits needed to hold ``capacity`` items at ``error_rate``."""
    if capacity <= 0:
        raise ValueError("capacity must be positive")
    if not 0 < error_rate < 1:
        raise ValueError("error_rate must be between 0 and 1 (exclusive)")
    return math.ceil(-capacity * math.log(error_rate) / (LN2 * LN2))


def optimal_num_hashes(num_bits: int, capacity: int) -> int:
    """Number of hash functions minimising the error rate for ``capacity`` items."""
    if num_bits <= 0 or capacity <= 0:
        raise ValueError("num_bits and capacity must be positive")
    return max(1, round(capacity / num_bits * LN2))


def expected_error_rate(num_bits: int, num_hashes: int, count: int) -> float:
    """False-positive probability after ``count`` insertions."""
    if count <= 0:
        return 0.0
    return (1.0 - math.exp(-num_hashes * count / num_bits)) ** num_hashes
