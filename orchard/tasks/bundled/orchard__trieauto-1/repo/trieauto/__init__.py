"""trieauto: a trie with frequency-ranked prefix autocomplete."""

from .trie import Trie

__all__ = ["Trie"]
__version__ = "1.2.0"
