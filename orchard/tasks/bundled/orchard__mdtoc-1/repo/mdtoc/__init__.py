"""mdtoc: table-of-contents generation for Markdown documents."""

from .parser import Heading, parse_headings
from .slug import SlugRegistry, slugify
from .toc import build_toc, insert_toc

__all__ = ["Heading", "SlugRegistry", "build_toc", "insert_toc", "parse_headings", "slugify"]
__version__ = "0.5.0"
