"""``${option}`` and ``${section:option}`` interpolation."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .errors import InterpolationDepthError, InterpolationMissingOptionError, NoOptionError

if TYPE_CHECKING:
    from .config import Config

MAX_DEPTH = 10

_TOKEN_RE = re.compile(r"\$(?:(?P<escaped>\$)|\{(?P<ref>[^{}]+)\})")


def interpolate(config: "Config", section: str, option: str, value: str, depth: int = 0) -> str:
    """Expand the references in ``value``, the raw value of ``section``/``option``.

    ``${name}`` refers to an option of the same section (or of ``[DEFAULT]``);
    ``${other:name}`` refers to an option of section ``other``.  The referenced value
    is itself expanded, as seen from the section it belongs to.  ``$$`` is a literal ``$``.
    """
    if depth > MAX_DEPTH:
        raise InterpolationDepthError(section, option)

    def replace(m: re.Match) -> str:
        if m["escaped"]:
            return "$"
        ref = m["ref"].strip()
        if ":" in ref:
            ref_section, ref_option = (part.strip() for part in ref.split(":", 1))
        else:
            ref_section, ref_option = section, ref
        try:
            raw = config.get(ref_section, ref_option, raw=True)
        except (NoOptionError, KeyError):
            raise InterpolationMissingOptionError(section, option, ref) from None
        return interpolate(config, section, ref_option, raw, depth + 1)

    return _TOKEN_RE.sub(replace, value)
