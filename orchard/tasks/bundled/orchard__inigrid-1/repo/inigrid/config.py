"""The :class:`Config` object."""

from __future__ import annotations

import io
from typing import Iterable, Iterator

from .errors import DuplicateSectionError, NoOptionError, NoSectionError
from .interpolate import interpolate
from .parser import DEFAULT_SECTION, parse

_UNSET = object()

BOOLEAN_STATES = {
    "1": True, "yes": True, "true": True, "on": True,
    "0": False, "no": False, "false": False, "off": False,
}


class Config:
    """An INI configuration: named sections of options plus a ``[DEFAULT]`` section
    whose options every section inherits."""

    def __init__(self, defaults: dict[str, str] | None = None):
        self._defaults: dict[str, str] = {k.lower(): str(v) for k, v in (defaults or {}).items()}
        self._sections: dict[str, dict[str, str]] = {}

    # -- reading -------------------------------------------------------------
    @classmethod
    def from_string(cls, text: str) -> "Config":
        cfg = cls()
        cfg.read_string(text)
        return cfg

    def read_string(self, text: str) -> None:
        self.read_lines(io.StringIO(text))

    def read_lines(self, lines: Iterable[str]) -> None:
        for name, options in parse(lines).items():
            if name == DEFAULT_SECTION:
                self._defaults.update(options)
            else:
                self._sections.setdefault(name, {}).update(options)

    # -- sections ------------------------------------------------------------
    def sections(self) -> list[str]:
        return list(self._sections)

    def has_section(self, section: str) -> bool:
        return section in self._sections

    def add_section(self, section: str) -> None:
        if section == DEFAULT_SECTION or section in self._sections:
            raise DuplicateSectionError(f"section {section!r} already exists")
        self._sections[section] = {}

    def _section(self, section: str) -> dict[str, str]:
        if section == DEFAULT_SECTION:
            return self._defaults
        try:
            return self._sections[section]
        except KeyError:
            raise NoSectionError(section) from None

    # -- options -------------------------------------------------------------
    def options(self, section: str) -> list[str]:
        own = self._section(section)
        return list(dict.fromkeys([*own, *self._defaults]))

    def has_option(self, section: str, option: str) -> bool:
        try:
            own = self._section(section)
        except NoSectionError:
            return False
        option = option.lower()
        return option in own or option in self._defaults

    def get(self, section: str, option: str, *, raw: bool = False, fallback=_UNSET) -> str:
        """The value of ``option`` in ``section``, falling back to ``[DEFAULT]``.

        Unless ``raw`` is true, ``${...}`` references are expanded.  ``fallback`` is
        returned instead of raising when the section or option does not exist.
        """
        key = option.lower()
        try:
            own = self._section(section)
        except NoSectionError:
            if fallback is not _UNSET:
                return fallback
            raise
        if key in own:
            value = own[key]
        elif key in self._defaults:
            value = self._defaults[key]
        elif fallback is not _UNSET:
            return fallback
        else:
            raise NoOptionError(section, option)
        return value if raw else interpolate(self, section, key, value)

    def getint(self, section: str, option: str, *, fallback=_UNSET) -> int:
        value = self.get(section, option, fallback=fallback)
        return value if value is fallback else int(value)

    def getfloat(self, section: str, option: str, *, fallback=_UNSET) -> float:
        value = self.get(section, option, fallback=fallback)
        return value if value is fallback else float(value)

    def getboolean(self, section: str, option: str, *, fallback=_UNSET) -> bool:
        value = self.get(section, option, fallback=fallback)
        if value is fallback:
            return value
        try:
            return BOOLEAN_STATES[value.strip().lower()]
        except KeyError:
            raise ValueError(f"not a boolean: {value!r}") from None

    def items(self, section: str, *, raw: bool = False) -> list[tuple[str, str]]:
        return [(opt, self.get(section, opt, raw=raw)) for opt in self.options(section)]

    def set(self, section: str, option: str, value: str) -> None:
        self._section(section)[option.lower()] = str(value)

    def remove_option(self, section: str, option: str) -> bool:
        return self._section(section).pop(option.lower(), _UNSET) is not _UNSET

    def __iter__(self) -> Iterator[str]:
        return iter(self._sections)

    # -- writing -------------------------------------------------------------
    def to_string(self) -> str:
        """Serialise back to INI text (raw values, multi-line values indented)."""
        out: list[str] = []
        blocks = ([(DEFAULT_SECTION, self._defaults)] if self._defaults else []) + list(
            self._sections.items()
        )
        for name, options in blocks:
            out.append(f"[{name}]")
            for key, value in options.items():
                value = value.replace("\n", "\n    ")
                out.append(f"{key} = {value}")
            out.append("")
        return "\n".join(out)
