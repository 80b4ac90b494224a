"""The :class:`DependencyGraph` container."""

from __future__ import annotations

from typing import Hashable, Iterable, Iterator

from .errors import NodeNotFoundError

Node = Hashable


class DependencyGraph:
    """A directed graph where an edge ``a -> b`` means "a depends on b".

    Nodes are remembered in the order they were first mentioned, and the dependencies
    of a node in the order they were added; all algorithms in topograph use these
    orders to break ties, so their results are deterministic.
    """

    def __init__(self, mapping: dict[Node, Iterable[Node]] | None = None):
        # node -> its dependencies (dict used as an ordered set)
        self._deps: dict[Node, dict[Node, None]] = {}
        for node, deps in (mapping or {}).items():
            self.add(node, *deps)

    def add(self, node: Node, *dependencies: Node) -> None:
        """Add ``node`` (if new) and make it depend on ``dependencies``."""
        self._deps.setdefault(node, {})
        for dep in dependencies:
            self._deps.setdefault(dep, {})
            self._deps[node][dep] = None

    def remove(self, node: Node) -> None:
        """Remove ``node`` and every edge to or from it."""
        if node not in self._deps:
            raise NodeNotFoundError(node)
        del self._deps[node]
        for deps in self._deps.values():
            deps.pop(node, None)

    @property
    def nodes(self) -> list[Node]:
        return list(self._deps)

    def dependencies(self, node: Node) -> list[Node]:
        """Direct dependencies of ``node``."""
        try:
            return list(self._deps[node])
        except KeyError:
            raise NodeNotFoundError(node) from None

    def dependents(self, node: Node) -> list[Node]:
        """Nodes that depend directly on ``node``."""
        if node not in self._deps:
            raise NodeNotFoundError(node)
        return [n for n, deps in self._deps.items() if node in deps]

    def edges(self) -> Iterator[tuple[Node, Node]]:
        for node, deps in self._deps.items():
            for dep in deps:
                yield node, dep

    def transitive_dependencies(self, node: Node) -> list[Node]:
        """Everything ``node`` depends on, directly or not, in breadth-first order."""
        seen: dict[Node, None] = {}
        frontier = self.dependencies(node)
        while frontier:
            nxt = []
            for dep in frontier:
                if dep not in seen and dep != node:
                    seen[dep] = None
                    nxt.extend(self._deps[dep])
            frontier = nxt
        return list(seen)

    def subgraph(self, roots: Iterable[Node]) -> "DependencyGraph":
        """The graph restricted to ``roots`` and everything they depend on."""
        keep = set()
        for root in roots:
            keep.add(root)
            keep.update(self.transitive_dependencies(root))
        sub = DependencyGraph()
        for node, deps in self._deps.items():
            if node in keep:
                sub.add(node, *deps)
        return sub

    def copy(self) -> "DependencyGraph":
        return self.subgraph(self._deps)

    def __contains__(self, node: object) -> bool:
        return node in self._deps

    def __len__(self) -> int:
        return len(self._deps)

    def __repr__(self) -> str:
        return f"DependencyGraph({ {n: list(d) for n, d in self._deps.items()} !r})"
