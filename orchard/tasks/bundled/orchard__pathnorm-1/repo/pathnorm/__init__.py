"""POSIX path normalisation and relativisation, as pure string operations."""

from pathnorm.core import (SEP, is_absolute, is_within, join, normpath, parts, relpath,
                           split)

__all__ = ["SEP", "is_absolute", "is_within", "join", "normpath", "parts", "relpath",
           "split"]
__version__ = "1.0.3"
