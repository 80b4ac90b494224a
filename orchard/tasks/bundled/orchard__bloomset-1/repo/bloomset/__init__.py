"""bloomset: a Bloom filter sized from a target false-positive rate."""

from .filter import BloomSet
from .sizing import expected_error_rate, optimal_num_bits, optimal_num_hashes

__all__ = ["BloomSet", "expected_error_rate", "optimal_num_bits", "optimal_num_hashes"]
__version__ = "0.2.0"
