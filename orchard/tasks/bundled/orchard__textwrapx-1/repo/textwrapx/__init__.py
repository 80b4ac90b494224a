"""Word wrapping and justification with long-word handling."""

from textwrapx.justify import justify, justify_line
from textwrapx.wrap import fill, shorten, split_long_word, wrap

__all__ = ["fill", "justify", "justify_line", "shorten", "split_long_word", "wrap"]
__version__ = "1.2.0"
