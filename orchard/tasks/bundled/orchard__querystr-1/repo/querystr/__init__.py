"""querystr: URL query strings as ordered multi-dicts."""

from .codec import decode_component, encode_component
from .query import QueryParams, build, parse
from .url import add_params, get_params

__all__ = [
    "QueryParams",
    "add_params",
    "build",
    "decode_component",
    "encode_component",
    "get_params",
    "parse",
]
