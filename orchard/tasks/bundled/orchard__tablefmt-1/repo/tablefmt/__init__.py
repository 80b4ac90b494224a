"""tablefmt: plain-text and Markdown tables."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from .cells import display_width, pad, parse_align, to_text
from .markdown import render_markdown
from .plain import render_plain

__all__ = ["FORMATS", "display_width", "format_table", "pad"]

FORMATS = {
    "plain": render_plain,
    "markdown": render_markdown,
}


def format_table(
    rows: Iterable[Sequence[Any]],
    headers: Sequence[Any] | None = None,
    *,
    fmt: str = "plain",
    align: str | Sequence[str] | None = None,
    floatfmt: str = "g",
    missing: str = "",
) -> str:
    """Render ``rows`` as a table in format ``fmt`` (``"plain"`` or ``"markdown"``).

    :param headers: optional column titles.
    :param align: one of ``l``, ``c``, ``r`` per column (e.g. ``"lrr"``); by default
        columns whose values are all numbers are right-aligned, others left-aligned.
    :param floatfmt: format spec for floats.
    :param missing: text shown for ``None`` cells.
    Short rows are padded with empty cells.
    """
    try:
        render = FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown table format {fmt!r}; choose from {sorted(FORMATS)}") from None
    raw_rows = [list(r) for r in rows]
    ncols = max([len(r) for r in raw_rows] + [len(headers or ())])
    for r in raw_rows:
        r.extend([None] * (ncols - len(r)))
    aligns = parse_align(align, raw_rows, ncols)
    text_rows = [[to_text(v, floatfmt, missing) for v in r] for r in raw_rows]
    text_headers = None
    if headers is not None:
        text_headers = [to_text(h, floatfmt, missing) for h in headers]
        text_headers.extend([""] * (ncols - len(text_headers)))
    return render(text_rows, text_headers, aligns)
