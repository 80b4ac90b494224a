"""Helpers working on whole URLs."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from .query import ParamsLike, QueryParams, build, parse


def get_params(url: str) -> QueryParams:
    """The query parameters of ``url``."""
    return parse(urlsplit(url).query)


def add_params(url: str, params: ParamsLike) -> str:
    """Append ``params`` to the query of ``url``, keeping existing parameters (even
    with the same key), the fragment and everything else unchanged."""
    parts = urlsplit(url)
    merged = parse(parts.query)
    for key, value in QueryParams(params).items():
        merged.add(key, value)
    return urlunsplit(parts._replace(query=build(merged)))
