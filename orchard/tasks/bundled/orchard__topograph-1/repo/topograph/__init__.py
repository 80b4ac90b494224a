"""topograph: dependency graphs, topological ordering and cycle detection."""

from .cycles import find_cycle, has_cycle
from .errors import CycleError, NodeNotFoundError
from .graph import DependencyGraph
from .levels import batches
from .sort import static_order

__all__ = [
    "CycleError",
    "DependencyGraph",
    "NodeNotFoundError",
    "batches",
    "find_cycle",
    "has_cycle",
    "static_order",
]
