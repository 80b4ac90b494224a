"""inigrid: INI-style configuration files with sections and interpolation."""

from .config import Config
from .errors import (
    ConfigError,
    DuplicateSectionError,
    InterpolationDepthError,
    InterpolationMissingOptionError,
    NoOptionError,
    NoSectionError,
    ParseError,
)

__all__ = [
    "Config",
    "ConfigError",
    "DuplicateSectionError",
    "InterpolationDepthError",
    "InterpolationMissingOptionError",
    "NoOptionError",
    "NoSectionError",
    "ParseError",
]
