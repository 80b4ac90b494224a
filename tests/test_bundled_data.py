"""The bundled task set lives in one archive: packing is deterministic and loses nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard.domains.swe import bundled_data
from orchard.domains.swe.loaders import load_tasks


def test_unpack_then_pack_gives_the_same_bytes(tmp_path: Path) -> None:
    shipped = bundled_data.archive_bytes()
    bundled_data.unpack(shipped, tmp_path)
    assert len(list(tmp_path.glob("*/task.yaml"))) == 33
    assert bundled_data.pack(tmp_path) == shipped
    (tmp_path / "orchard__romanum-1" / "NOTE").write_text("an edit")
    assert bundled_data.pack(tmp_path) != shipped  # the check can fail


def test_the_cache_is_keyed_by_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = bundled_data.bundled_dir()
    assert first.parent == tmp_path / "orchard" / "bundled-tasks"
    assert bundled_data.bundled_dir() == first
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no unpack left behind
    tasks = load_tasks("bundled")
    assert {t.instance_id for t in tasks} == {p.name for p in first.iterdir()}
