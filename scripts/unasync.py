"""Write the blocking SDK client from the async one, as httpcore does with unasync.

``orchard/env/client/async_client.py`` is the source; ``sync_client.py`` is this script's
output, committed (as are ``sync_sandbox.py``, ``sync_pty.py`` and the image builder's
``sync_builder.py``). The rewrite is tokens only: where the twins really differ (sleeping,
tasks, file and terminal I/O) the async source calls a helper of ``_async_io``, and the
rewrite points it at ``_sync_io``'s helper of the same name.

    python scripts/unasync.py          # rewrite sync_client.py
    python scripts/unasync.py --check  # exit 1 if sync_client.py is stale (tests run this)
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLIENT = Path("orchard/env/client")
TWINS = {
    CLIENT / "async_client.py": CLIENT / "sync_client.py",
    CLIENT / "async_sandbox.py": CLIENT / "sync_sandbox.py",
    CLIENT / "async_pty.py": CLIENT / "sync_pty.py",
    Path("orchard/env/build/async_builder.py"): Path("orchard/env/build/sync_builder.py"),
}

RULES = [
    (r"\basync (def|with|for)\b", r"\1"),
    (r"\bawait ", ""),
    # AsyncSandboxClient -> SandboxClient, httpx.AsyncClient -> httpx.Client, AsyncIterator...
    (r"\bAsync(?=[A-Z])", ""),
    (r"\b__a(enter|exit)__\b", r"__\1__"),
    (r"\ba(close|closing|read|iter_lines|iter_bytes|connect_ws)\b", r"\1"),
    (r"\benter_async_context\b", "enter_context"),
    (r"\b_async_io\b", "_sync_io"),
    (r"\basync_pty\b", "sync_pty"),
    # The twins import each other by module path; prose naming the async source keeps its name.
    (r"\b(orchard\.env\.client)\.async_(client|sandbox)\b", r"\1.sync_\2"),
]
_COMPILED = [(re.compile(pattern), replacement) for pattern, replacement in RULES]


def header(source: Path) -> str:
    return (
        f"# Generated from {source.name} by scripts/unasync.py: do not edit by hand.\n"
        f"# Edit {source.name}, then run `python scripts/unasync.py`; the tests fail while\n"
        "# this file is stale. Its imports keep the source's order, and an `async with` nested\n"
        "# around a `with` stays nested here.\n"
        "# ruff: noqa: I001, SIM117\n"
    )


def unasync(text: str) -> str:
    for pattern, replacement in _COMPILED:
        text = pattern.sub(replacement, text)
    return text


def render(root: Path, source: Path) -> str:
    return header(source) + unasync((root / source).read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a generated file is stale")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this)")
    args = parser.parse_args(argv)
    stale = []
    for source, target in TWINS.items():
        expected = render(args.root, source)
        path = args.root / target
        current = path.read_text() if path.exists() else None
        if current == expected:
            continue
        if args.check:
            stale.append(target)
        else:
            path.write_text(expected)
            print(f"wrote {target}")
    for target in stale:
        print(f"{target} is stale: run `python scripts/unasync.py` and commit the result",
              file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
