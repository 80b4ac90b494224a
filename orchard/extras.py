"""Which optional part of orchard needs which extra, and the error for a missing one.

``pip install orchard`` is the SDK and the CLI client. The orchestrator, the rollout layer,
grading and training each need an extra (see pyproject.toml). Their packages import their
third-party dependencies inside ``needs(...)``, so a missing one is a one-line error naming
the extra to install rather than a traceback ending in some library's ``import``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

EXTRAS = {
    "server": "the orchestrator (orchard serve, SandboxClient.local)",
    "rollout": "the recording proxy and harness adapters",
    "tasks": "task grading",
    "train": "the training recipes",
}


class MissingExtra(ImportError):
    """A third-party package of an optional part is not installed; the message names the
    extra that installs it."""

    def __init__(self, extra: str, package: str) -> None:
        self.extra = extra
        self.package = package
        super().__init__(
            f"{EXTRAS[extra]} needs {package!r}, which is not installed: "
            f"pip install 'orchard[{extra}]'", name=package)


@contextlib.contextmanager
def needs(extra: str) -> Iterator[None]:
    """Turns a missing third-party module imported inside the block into MissingExtra.

    A missing orchard module is a bug, not a missing extra, and is left as it is.
    """
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; known: {', '.join(EXTRAS)}")
    try:
        yield
    except ModuleNotFoundError as e:
        top = (e.name or "").split(".")[0]
        if not top or top == "orchard":
            raise
        raise MissingExtra(extra, top) from None
