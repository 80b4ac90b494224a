"""Cycle detection."""

from __future__ import annotations

from .graph import DependencyGraph, Node

_WHITE, _GREY, _BLACK = 0, 1, 2


def find_cycle(graph: DependencyGraph) -> list[Node] | None:
    """Return one dependency cycle as ``[n0, n1, ..., n0]``, or None if there is none.

    The search visits nodes and dependencies in insertion order, so the same graph
    always yields the same cycle.
    """
    colour = {node: _WHITE for node in graph.nodes}
    for start in graph.nodes:
        if colour[start] != _WHITE:
            continue
        # Iterative DFS; `path` holds the grey nodes, `stack` their pending deps.
        path: list[Node] = [start]
        stack = [iter(graph.dependencies(start))]
        colour[start] = _GREY
        while stack:
            dep = next(stack[-1], None)
            if dep is None:
                colour[path.pop()] = _BLACK
                stack.pop()
                continue
            if colour[dep] == _GREY:
                return path[path.index(dep):] + [dep]
            if colour[dep] == _WHITE:
                colour[dep] = _GREY
                path.append(dep)
                stack.append(iter(graph.dependencies(dep)))
    return None


def has_cycle(graph: DependencyGraph) -> bool:
    return find_cycle(graph) is not None
