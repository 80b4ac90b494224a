"""configmerge: deep merge of nested configuration dictionaries."""

from .keys import APPEND, DELETE, REPLACE, parse_key
from .lists import STRATEGIES, merge_lists
from .merge import Merger, deep_merge

__all__ = [
    "APPEND",
    "DELETE",
    "REPLACE",
    "STRATEGIES",
    "Merger",
    "deep_merge",
    "merge_lists",
    "parse_key",
]
__version__ = "1.1.0"
