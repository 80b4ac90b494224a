"""Plain-text tables: columns separated by two spaces, a dashed rule under the headers."""

from __future__ import annotations

from .cells import pad

COLUMN_GAP = "  "


def render_plain(rows: list[list[str]], headers: list[str] | None, aligns: list[str]) -> str:
    table = ([headers] if headers is not None else []) + rows
    if not table:
        return ""
    widths = [max(len(cell) for cell in column) for column in zip(*table)]

    def line(cells: list[str]) -> str:
        return COLUMN_GAP.join(pad(c, w, a) for c, w, a in zip(cells, widths, aligns)).rstrip()

    out = []
    if headers is not None:
        out.append(line(headers))
        out.append(COLUMN_GAP.join("-" * w for w in widths))
    out.extend(line(r) for r in rows)
    return "\n".join(out)
