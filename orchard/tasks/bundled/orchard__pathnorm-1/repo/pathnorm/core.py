"""Path functions. Paths are ``str``; the separator is always ``/``.

Unlike :mod:`posixpath`, any number of leading slashes means the root (``//a`` is ``/a``),
and nothing ever looks at the file system: ``a/b/..`` is ``a`` even if ``b`` is a symlink.
"""

from __future__ import annotations

SEP = "/"
CURDIR = "."
PARDIR = ".."


def is_absolute(path: str) -> bool:
    """Whether ``path`` starts at the root."""
    return path.startswith(SEP)


def normpath(path: str) -> str:
    """Collapse repeated separators and ``.`` components, and resolve ``..`` lexically.

    ``..`` at the root stays at the root (``/../a`` is ``/a``); in a relative path, ``..``
    that cannot be resolved is kept. The empty path and ``./`` normalise to ``.``.
    """
    absolute = is_absolute(path)
    stack: list[str] = []
    for part in path.split(SEP):
        if part in ("", CURDIR):
            continue
        if part == PARDIR:
            if stack:
                stack.pop()
            elif not absolute:
                stack.append(part)
            continue
        stack.append(part)
    body = SEP.join(stack)
    if absolute:
        return SEP + body
    return body or CURDIR


def parts(path: str) -> list[str]:
    """The components of the normalised path; an absolute path starts with ``"/"``."""
    norm = normpath(path)
    if norm == CURDIR:
        return []
    if norm == SEP:
        return [SEP]
    names = norm.lstrip(SEP).split(SEP)
    return [SEP] + names if is_absolute(norm) else names


def join(*paths: str) -> str:
    """Join path pieces; an absolute piece discards everything before it (like
    :func:`os.path.join`). The result is not normalised."""
    result = ""
    for piece in paths:
        if is_absolute(piece):
            result = piece
        elif not result or result.endswith(SEP):
            result += piece
        else:
            result += SEP + piece
    return result


def split(path: str) -> tuple[str, str]:
    """``(head, tail)`` where ``tail`` is the last component (possibly empty) and ``head``
    the rest, without trailing separators unless it is the root."""
    head, sep, tail = path.rpartition(SEP)
    if not sep:
        return "", tail
    return head.rstrip(SEP) or SEP, tail


def relpath(path: str, start: str = CURDIR) -> str:
    """``path`` relative to the directory ``start``.

    Both must be absolute, or both relative; a relative ``start`` that climbs out with
    ``..`` (where the way back is unknown) raises ``ValueError``.
    """
    if is_absolute(path) != is_absolute(start):
        raise ValueError("cannot mix absolute and relative paths")
    target, base = parts(path), parts(start)
    ups = 0  # a normalised relative path can only start with ".." components
    while ups < len(base) and base[ups] == PARDIR:
        ups += 1
    if target[:ups] != base[:ups]:
        raise ValueError(f"cannot compute a path relative to {start!r}")
    common = 0
    for a, b in zip(target, base):
        if a != b:
            break
        common += 1
    climb = [PARDIR] * (len(base) - common)
    return normpath(join(*climb, *target[common:]))


def is_within(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or inside it, lexically."""
    rel = relpath(path, directory)
    return rel == CURDIR or not (rel == PARDIR or rel.startswith(PARDIR + SEP))
