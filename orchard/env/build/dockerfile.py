"""A Dockerfile read into instructions, and the words of each with variables substituted.

dockerfile-parse (containerbuildsystem) does the reading: line continuations, comments, the
``escape`` directive, and the ``key=value`` / ``key value`` forms of ENV, ARG and LABEL. Two
things it lacks are added here: the ``${name:-word}`` and ``${name:+word}`` forms (it leaves
them mangled), and a check that refuses, by name and line, what a build here cannot do.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from dockerfile_parse import DockerfileParser
from dockerfile_parse.util import WordSplitter, extract_key_values

from orchard.env.client.errors import OrchardError

# What each instruction does to a build: a step that writes files (a layer), or one that only
# changes the image's config.
LAYER_STEPS = frozenset({"RUN", "COPY", "ADD", "WORKDIR"})
CONFIG_STEPS = frozenset({"ENV", "ARG", "USER", "CMD", "ENTRYPOINT", "SHELL", "LABEL",
                          "MAINTAINER", "EXPOSE", "VOLUME", "STOPSIGNAL"})
# Refused, with why: a build would otherwise differ from Docker's without saying so.
UNSUPPORTED = {
    "ONBUILD": "it registers triggers for later builds, which this builder does not keep",
    "HEALTHCHECK": "sandboxes run no container command for it to check",
}
_MODIFIER = re.compile(r"(?<!\\)\$\{([A-Za-z_][A-Za-z0-9_]*):([-+])([^}]*)\}")


class BuildError(OrchardError):
    """A Dockerfile build failed; the message says which instruction (and line) and why."""


class DockerfileError(BuildError):
    """The Dockerfile asks for something this builder does not do, or is malformed."""


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: RUN, COPY, ...
    value: str  # the text after the keyword, continuations joined
    line: int  # 1-based, of the keyword

    def where(self) -> str:
        return f"line {self.line} ({self.keyword} {_short(self.value)})"

    def error(self, why: str) -> DockerfileError:
        return DockerfileError(f"Dockerfile {self.where()}: {why}")


def parse_dockerfile(text: str) -> list[Instruction]:
    """The instructions of a single-stage Dockerfile, FROM first; DockerfileError for any
    instruction, form or flag the builder does not do, naming it and its line."""
    parser = DockerfileParser(fileobj=io.BytesIO(text.encode()), env_replace=False)
    steps = [Instruction(s["instruction"].upper(), s["value"].strip(), s["startline"] + 1)
             for s in parser.structure if s["instruction"] != "COMMENT"]
    froms = [s for s in steps if s.keyword == "FROM"]
    if not froms:
        raise DockerfileError("the Dockerfile has no FROM instruction: start it with "
                              "'FROM <image>'")
    if len(froms) > 1:
        raise froms[1].error("multi-stage builds (a second FROM) are not supported; build each "
                             "stage as its own image and FROM it by name")
    start = steps.index(froms[0])
    _check_from(froms[0])
    for n, step in enumerate(steps):
        if step.keyword in UNSUPPORTED:
            raise step.error(f"{step.keyword} is not supported ({UNSUPPORTED[step.keyword]})")
        if n < start and step.keyword != "ARG":
            raise step.error("only ARG may come before FROM")
        if n > start and step.keyword not in LAYER_STEPS | CONFIG_STEPS:
            raise step.error(f"unknown instruction {step.keyword}")
    return steps


def _check_from(step: Instruction) -> None:
    words = step.value.split()
    if any(w.startswith("--") for w in words):
        raise step.error("FROM flags (--platform) are not supported; sandboxes run the host's "
                         "platform")
    if len(words) == 3 and words[1].lower() == "as":
        raise step.error("multi-stage builds (FROM ... AS name) are not supported; build each "
                         "stage as its own image and FROM it by name")
    if len(words) != 1:
        raise step.error("FROM takes one image")
    if words[0] == "scratch":
        raise step.error("FROM scratch is not supported: a sandbox needs an image to start "
                         "from; use a minimal rootfs or image")


def substitute(text: str, variables: Mapping[str, str]) -> str:
    """``text`` with ``$name``, ``${name}``, ``${name:-word}`` and ``${name:+word}`` replaced
    by their values, and quotes and escapes kept for word splitting."""
    def modifier(m: re.Match[str]) -> str:
        value = variables.get(m.group(1), "")
        if m.group(2) == "-":
            return value or m.group(3)
        return m.group(3) if value else ""

    text = _MODIFIER.sub(modifier, text)
    return "".join(WordSplitter(text, args=dict(variables)).split(maxsplit=0, dequote=False))


def words(text: str, variables: Mapping[str, str]) -> list[str]:
    """The words of ``text`` after substitution, quotes removed (COPY's sources, FROM)."""
    return list(WordSplitter(substitute(text, variables)).split())


def substitute_word(text: str, variables: Mapping[str, str]) -> str:
    """One value (an ARG default) after substitution, its quotes removed."""
    return "".join(WordSplitter(substitute(text, variables)).split(maxsplit=0))


def arg_words(text: str) -> list[tuple[str, str | None]]:
    """The names an ARG line declares and their defaults as written (None: no default)."""
    out: list[tuple[str, str | None]] = []
    for word in WordSplitter(text).split(dequote=False):
        name, has_default, default = word.partition("=")
        out.append((name, default if has_default else None))
    return out


def key_values(text: str, variables: Mapping[str, str]) -> list[tuple[str, str]]:
    """ENV, LABEL and ARG pairs, in either form (``k=v k2="v 2"`` or ``k value words``)."""
    return list(extract_key_values(env_replace=True, args=dict(variables), envs={},
                                   instruction_value=_MODIFIER.sub(
                                       lambda m: substitute(m.group(0), variables), text)))


def json_form(text: str) -> list[str] | None:
    """The exec (JSON array) form of RUN, CMD, ENTRYPOINT and SHELL, or None for the shell
    form. A malformed array is the shell form, as Docker reads it."""
    if not text.startswith("["):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None


def split_flags(step: Instruction, text: str, allowed: frozenset[str]
                ) -> tuple[dict[str, str], str]:
    """Leading ``--name=value`` flags of ``text`` and the rest; a flag not ``allowed`` is a
    DockerfileError naming it."""
    flags: dict[str, str] = {}
    rest = text
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        rest = rest.lstrip()
        name, _, value = flag[2:].partition("=")
        if name not in allowed:
            why = ("multi-stage builds are not supported" if name == "from" else
                   f"only {', '.join('--' + a for a in sorted(allowed))} are" if allowed else
                   "it takes no flags here")
            raise step.error(f"{step.keyword} --{name} is not supported ({why})")
        flags[name] = value
    return flags, rest


def _short(text: str, limit: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."
