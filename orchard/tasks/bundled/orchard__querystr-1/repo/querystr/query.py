"""The :class:`QueryParams` multi-dict and the :func:`parse` / :func:`build` functions."""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping, Union

from .codec import decode_component, encode_component

Pairs = Iterable[tuple[str, Any]]
ParamsLike = Union["QueryParams", Mapping[str, Any], Pairs]


class QueryParams:
    """An ordered list of ``(key, value)`` pairs with dict-like helpers.

    A value of ``None`` is a bare key without ``=`` (``?debug``), which is different
    from an empty value (``?debug=``).
    """

    def __init__(self, pairs: ParamsLike = ()):
        self._pairs: list[tuple[str, str | None]] = list(_iter_pairs(pairs))

    # -- reading ---------------------------------------------------------------
    def get(self, key: str, default: Any = None) -> str | None:
        """The first value for ``key``."""
        for k, v in self._pairs:
            if k == key:
                return v
        return default

    def getlist(self, key: str) -> list[str | None]:
        return [v for k, v in self._pairs if k == key]

    def keys(self) -> list[str]:
        """Distinct keys in order of first appearance."""
        return list(dict.fromkeys(k for k, _ in self._pairs))

    def items(self) -> list[tuple[str, str | None]]:
        return list(self._pairs)

    def to_dict(self) -> dict[str, str | None]:
        """Keys mapped to their *last* value."""
        return dict(self._pairs)

    def __contains__(self, key: object) -> bool:
        return any(k == key for k, _ in self._pairs)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._pairs)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, QueryParams):
            return NotImplemented
        return self._pairs == other._pairs

    def __repr__(self) -> str:
        return f"QueryParams({self._pairs!r})"

    # -- writing -----------------------------------------------------------------
    def add(self, key: str, value: Any) -> None:
        """Append a pair, keeping existing values for ``key``."""
        self._pairs.append((key, _as_text(value)))

    def set(self, key: str, value: Any) -> None:
        """Replace all values of ``key`` by one pair at the first one's position
        (or at the end if ``key`` is new)."""
        out: list[tuple[str, str | None]] = []
        placed = False
        for k, v in self._pairs:
            if k != key:
                out.append((k, v))
            elif not placed:
                out.append((key, _as_text(value)))
                placed = True
        if not placed:
            out.append((key, _as_text(value)))
        self._pairs = out

    def remove(self, key: str) -> int:
        """Remove every pair with ``key``; return how many were removed."""
        before = len(self._pairs)
        self._pairs = [(k, v) for k, v in self._pairs if k != key]
        return before - len(self._pairs)

    def copy(self) -> "QueryParams":
        return QueryParams(self._pairs)

    def to_string(self, *, plus: bool = False, sort: bool = False) -> str:
        return build(self, plus=plus, sort=sort)

    __str__ = to_string


def _as_text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _iter_pairs(params: ParamsLike) -> Iterator[tuple[str, str | None]]:
    """Pairs from a QueryParams, a mapping (list values repeat the key) or pairs."""
    if isinstance(params, QueryParams):
        yield from params._pairs
        return
    items = params.items() if isinstance(params, Mapping) else params
    for key, value in items:
        if isinstance(value, (list, tuple)):
            for v in value:
                yield str(key), _as_text(v)
        else:
            yield str(key), _as_text(value)


def parse(query: str) -> QueryParams:
    """Parse a query string (a leading ``?`` is ignored, empty pieces are skipped)."""
    if query.startswith("?"):
        query = query[1:]
    pairs = []
    for piece in query.split("&"):
        if not piece:
            continue
        key, eq, value = piece.partition("=")
        pairs.append((decode_component(key), decode_component(value) if eq else None))
    return QueryParams(pairs)


def build(params: ParamsLike, *, plus: bool = False, sort: bool = False) -> str:
    """Encode ``params`` as a query string (without the leading ``?``).

    ``params`` may be a :class:`QueryParams`, a mapping (list/tuple values repeat the
    key) or an iterable of pairs.  ``None`` values produce a bare key.  With ``sort``
    the pairs are ordered by key (stably), which gives canonical URLs for caching.
    """
    pairs = list(_iter_pairs(params))
    if sort:
        pairs.sort(key=lambda kv: kv[0])
    parts = []
    for key, value in pairs:
        k = encode_component(key, plus=plus)
        parts.append(k if value is None else f"{k}={encode_component(value, plus=plus)}")
    return "&".join(parts)
