"""slugkit: Unicode-aware slug generation."""

from .normalize import fold, normalize_whitespace
from .slugify import slugify, unique_slug

__all__ = ["fold", "normalize_whitespace", "slugify", "unique_slug"]
__version__ = "1.3.0"
