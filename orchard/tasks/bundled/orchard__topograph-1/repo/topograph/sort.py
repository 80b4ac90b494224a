"""Topological ordering."""

from __future__ import annotations

import heapq

from .errors import CycleError
from .graph import DependencyGraph, Node


def static_order(graph: DependencyGraph) -> list[Node]:
    """All nodes, each one after everything it depends on.

    Among the nodes that are ready at any point, the one added to the graph first comes
    first.  Raises :class:`CycleError` if the graph has a cycle.
    """
    index = {node: i for i, node in enumerate(graph.nodes)}
    waiting = {node: len(graph.dependencies(node)) for node in graph.nodes}
    dependents = {node: graph.dependents(node) for node in graph.nodes}
    ready = [index[n] for n, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    order: list[Node] = []
    nodes = graph.nodes
    while ready:
        node = nodes[heapq.heappop(ready)]
        order.append(node)
        for dependent in dependents[node]:
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                heapq.heappush(ready, index[dependent])
    if len(order) < len(nodes):
        remaining = [n for n in nodes if waiting[n] > 0]
        raise CycleError(remaining)
    return order
