"""GitHub-flavoured Markdown tables."""

from __future__ import annotations

from .cells import pad

MIN_WIDTH = 3  # a delimiter cell needs at least three characters


def _escape(cell: str) -> str:
    return cell.replace("|", "\\|")


def _rule(width: int, align: str) -> str:
    if align == "center":
        return ":" + "-" * (width - 2) + ":"
    if align == "right":
        return "-" * (width - 1) + ":"
    return ":" + "-" * (width - 1)


def render_markdown(rows: list[list[str]], headers: list[str] | None, aligns: list[str]) -> str:
    """Render a Markdown table; without headers an empty header row is emitted, since
    Markdown tables require one."""
    ncols = len(aligns)
    head = [_escape(h) for h in headers] if headers is not None else [""] * ncols
    body = [[_escape(c) for c in r] for r in rows]
    widths = [
        max([MIN_WIDTH] + [len(cell) for cell in column]) for column in zip(head, *body)
    ]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(pad(c, w, a) for c, w, a in zip(cells, widths, aligns)) + " |"

    out = [line(head), "| " + " | ".join(_rule(w, a) for w, a in zip(widths, aligns)) + " |"]
    out.extend(line(r) for r in body)
    return "\n".join(out)
