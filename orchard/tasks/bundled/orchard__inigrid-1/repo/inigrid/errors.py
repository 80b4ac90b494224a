"""Exceptions raised by inigrid."""


class ConfigError(Exception):
    """Base class of all inigrid errors."""


class ParseError(ConfigError):
    def __init__(self, lineno: int, line: str, reason: str):
        super().__init__(f"line {lineno}: {reason}: {line!r}")
        self.lineno = lineno
        self.line = line


class DuplicateSectionError(ConfigError):
    pass


class NoSectionError(ConfigError, KeyError):
    def __init__(self, section: str):
        super().__init__(f"no section {section!r}")
        self.section = section

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.args[0]


class NoOptionError(ConfigError, KeyError):
    def __init__(self, section: str, option: str):
        super().__init__(f"no option {option!r} in section {section!r}")
        self.section = section
        self.option = option

    def __str__(self) -> str:
        return self.args[0]


class InterpolationMissingOptionError(ConfigError):
    def __init__(self, section: str, option: str, reference: str):
        super().__init__(
            f"bad interpolation in [{section}] {option}: "
            f"${{{reference}}} does not name an existing option"
        )
        self.section = section
        self.option = option
        self.reference = reference


class InterpolationDepthError(ConfigError):
    def __init__(self, section: str, option: str):
        super().__init__(
            f"interpolation of [{section}] {option} is too deeply nested (circular reference?)"
        )
        self.section = section
        self.option = option
