"""docs/architecture.md's module map is the newcomer's index: it must name every module there
is (or the folder that holds it), and nothing that is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _named() -> set[str]:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc.split("\n## Module map\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([^`]+)` \|", section, re.MULTILINE))


def test_the_module_map_names_every_module() -> None:
    named = _named()
    missing = []
    for path in sorted((ROOT / "orchard").rglob("*.py")):
        rel = path.relative_to(ROOT)
        folders = {f"{p.as_posix()}/" for p in rel.parents}
        if rel.name != "__init__.py" and rel.as_posix() not in named and not folders & named:
            missing.append(rel.as_posix())
    assert not missing, f"add these to the module map in docs/architecture.md: {missing}"


def test_the_module_map_names_nothing_that_is_gone() -> None:
    gone = sorted(n for n in _named() if not (ROOT / n).exists())
    assert not gone, f"the module map in docs/architecture.md names what is gone: {gone}"
