"""Parallel build levels."""

from __future__ import annotations

from .errors import CycleError
from .graph import DependencyGraph, Node


def batches(graph: DependencyGraph) -> list[list[Node]]:
    """Group the nodes into batches that can each be processed in parallel.

    Every node is in the first batch after all of its dependencies; within a batch,
    nodes keep insertion order.  Raises :class:`CycleError` if the graph has a cycle.
    """
    done: set[Node] = set()
    pending = graph.nodes
    result: list[list[Node]] = []
    while pending:
        batch = [n for n in pending if all(d in done for d in graph.dependencies(n))]
        if not batch:
            raise CycleError(pending)
        result.append(batch)
        done.update(batch)
        pending = [n for n in pending if n not in done]
    return result
