"""Exceptions raised by topograph."""

from __future__ import annotations

from typing import Hashable, Sequence


class CycleError(ValueError):
    """The graph contains a dependency cycle.

    ``cycle`` lists the nodes along one cycle, in dependency order, with the first
    node repeated at the end: ``["a", "b", "a"]`` means a depends on b, which depends
    on a.
    """

    def __init__(self, cycle: Sequence[Hashable]):
        self.cycle = list(cycle)
        super().__init__("dependency cycle: " + " -> ".join(map(str, self.cycle)))


class NodeNotFoundError(KeyError):
    def __init__(self, node: Hashable):
        super().__init__(node)
        self.node = node

    def __str__(self) -> str:
        return f"unknown node: {self.node!r}"
