"""Trie storing word frequencies, with ranked prefix completion."""

from __future__ import annotations

import heapq
from typing import Iterable, Iterator, Mapping


class _Node:
    """One trie node. ``count`` > 0 marks the end of a stored word."""

    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.count = 0


class Trie:
    """A prefix tree mapping words to how often they were seen.

    Words are normalised with :meth:`str.casefold` unless ``case_sensitive``
    is true, so ``"Apple"`` and ``"apple"`` are the same entry by default.

    >>> t = Trie()
    >>> t.insert("car", 3); t.insert("cart"); t.insert("cat", 2)
    >>> t.complete("ca")
    ['car', 'cat', 'cart']
    """

    def __init__(self, words: Iterable[str] = (), *, case_sensitive: bool = False):
        self._root = _Node()
        self._size = 0
        self.case_sensitive = case_sensitive
        for word in words:
            self.insert(word)

    @classmethod
    def from_counts(cls, counts: Mapping[str, int], *, case_sensitive: bool = False) -> "Trie":
        """Build a trie from a ``{word: frequency}`` mapping."""
        trie = cls(case_sensitive=case_sensitive)
        for word, count in counts.items():
            trie.insert(word, count)
        return trie

    # -- helpers ------------------------------------------------------------
    def _normalise(self, word: str) -> str:
        return word if self.case_sensitive else word.casefold()

    def _find(self, key: str) -> _Node | None:
        node = self._root
        for ch in key:
            node = node.children.get(ch)
            if node is None:
                return None
        return node

    # -- mutation -----------------------------------------------------------
    def insert(self, word: str, count: int = 1) -> None:
        """Add ``count`` occurrences of ``word``."""
        if not word:
            raise ValueError("cannot insert an empty word")
        if count < 1:
            raise ValueError("count must be a positive integer")
        node = self._root
        for ch in self._normalise(word):
            node = node.children.setdefault(ch, _Node())
        if node.count == 0:
            self._size += 1
        node.count += count

    # -- queries ------------------------------------------------------------
    def __len__(self) -> int:
        """Number of distinct words stored."""
        return self._size

    def __contains__(self, word: object) -> bool:
        if not isinstance(word, str):
            return False
        node = self._find(self._normalise(word))
        return node is not None and node.count > 0

    def frequency(self, word: str) -> int:
        """How often ``word`` was inserted (0 if never)."""
        node = self._find(self._normalise(word))
        return node.count if node is not None else 0

    def has_prefix(self, prefix: str) -> bool:
        """True if at least one stored word starts with ``prefix``."""
        return self._find(self._normalise(prefix)) is not None

    def _walk(self, node: _Node, prefix: str) -> Iterator[tuple[str, int]]:
        stack = [(node, prefix)]
        while stack:
            current, text = stack.pop()
            if current.count:
                yield text, current.count
            for ch, child in current.children.items():
                stack.append((child, text + ch))

    def items(self, prefix: str = "") -> list[tuple[str, int]]:
        """All ``(word, frequency)`` pairs under ``prefix``, alphabetically."""
        key = self._normalise(prefix)
        node = self._find(key)
        if node is None:
            return []
        return sorted(self._walk(node, key))

    def __iter__(self) -> Iterator[str]:
        return (word for word, _ in self.items())

    def complete(self, prefix: str, limit: int | None = 10) -> list[str]:
        """The stored words starting with ``prefix``, most frequent first.

        Ties are broken alphabetically.  ``limit=None`` returns every match.
        """
        key = self._normalise(prefix)
        node = self._find(key)
        if node is None:
            return []
        ranked_key = lambda pair: (-pair[1], pair[0])  # noqa: E731
        matches = self._walk(node, key)
        if limit is None:
            ranked = sorted(matches, key=ranked_key)
        else:
            ranked = heapq.nsmallest(limit, matches, key=ranked_key)
        return [word for word, _ in ranked]
