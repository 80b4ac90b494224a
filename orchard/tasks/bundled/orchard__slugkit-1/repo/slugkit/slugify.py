"""Slug generation."""

from __future__ import annotations

import re
from typing import Collection, Iterable

from .normalize import fold

_APOSTROPHES_RE = re.compile(r"(?<=\w)['`](?=\w)")
_NON_ALNUM_RE = re.compile(r"[^A-Za-z0-9]+")


def _remove_stopwords(text: str, stopwords: Iterable[str]) -> str:
    words = sorted({w for w in stopwords if w}, key=len, reverse=True)
    if not words:
        return text
    pattern = r"\b(?:%s)\b" % "|".join(re.escape(w) for w in words)
    return re.sub(pattern, " ", text, re.IGNORECASE)


def _truncate(slug: str, max_length: int, separator: str, word_boundary: bool) -> str:
    if len(slug) <= max_length:
        return slug
    cut = slug[:max_length]
    if word_boundary and separator:
        # Only keep whole words, unless the first word alone is too long.
        if slug[max_length : max_length + len(separator)] != separator:
            head, sep, _ = cut.rpartition(separator)
            if sep:
                cut = head
    return cut.strip(separator) if separator else cut


def slugify(
    text: str,
    *,
    separator: str = "-",
    lowercase: bool = True,
    max_length: int | None = None,
    word_boundary: bool = True,
    stopwords: Iterable[str] = (),
    replacements: Iterable[tuple[str, str]] = (),
) -> str:
    """Return an ASCII slug for ``text``.

    :param separator: joins the words of the slug.
    :param lowercase: lower-case the result.
    :param max_length: truncate the slug to at most this many characters; with
        ``word_boundary`` (the default) only whole words are kept.
    :param stopwords: words to drop, matched as whole words and case-insensitively
        (``stopwords=["the"]`` also removes ``"The"``).
    :param replacements: ``(old, new)`` pairs applied to the raw text first, e.g.
        ``[("&", " and ")]``.
    """
    for old, new in replacements:
        text = text.replace(old, new)
    text = fold(text)
    text = _APOSTROPHES_RE.sub("", text)
    text = _remove_stopwords(text, stopwords)
    if lowercase:
        text = text.lower()
    if separator:
        slug = _NON_ALNUM_RE.sub(separator, text).strip(separator)
    else:
        slug = _NON_ALNUM_RE.sub("", text)
    if max_length is not None:
        if max_length < 0:
            raise ValueError("max_length must be non-negative")
        slug = _truncate(slug, max_length, separator, word_boundary)
    return slug


def unique_slug(text: str, existing: Collection[str], **options) -> str:
    """Slugify ``text`` and append ``-2``, ``-3``, ... until it is not in ``existing``.

    Accepts the same keyword options as :func:`slugify`; with ``max_length`` the base
    slug is shortened so that the suffixed slug still fits.
    """
    separator = options.get("separator", "-")
    max_length = options.get("max_length")
    slug = slugify(text, **options)
    if slug not in existing:
        return slug
    n = 2
    while True:
        suffix = f"{separator}{n}"
        base = slug
        if max_length is not None and len(base) + len(suffix) > max_length:
            base = base[: max(max_length - len(suffix), 0)].rstrip(separator)
        candidate = base + suffix
        if candidate not in existing:
            return candidate
        n += 1
