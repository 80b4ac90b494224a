"""What every router shares: documented error answers, wait limits, label filters."""

from __future__ import annotations

from typing import Any

from orchard.env.errors import BadRequest
from orchard.env.schema import ErrorBody

MAX_SEQ = 2**63 - 1  # event seqs are SQLite/Redis 64-bit integers
MAX_WAIT = 3600.0  # the longest server-side wait; longer ones are cut to it

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 403, 404, 408, 409, 413, 503)
}
# What a create or a pull answers when its image cannot be had (the 401 and 404 are the
# registry's refusal and an unknown name or tag).
IMAGE_ERRORS: dict[int | str, dict[str, Any]] = {
    422: {"model": ErrorBody, "description": "The image has no manifest for this platform, "
          "or its content does not match its digest"},
    502: {"model": ErrorBody, "description": "The image's registry failed or is unreachable"},
    507: {"model": ErrorBody, "description": "No room for the image in the image cache"},
}


def label_filter(items: list[str]) -> dict[str, str]:
    wanted = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BadRequest(f"label filter {item!r} must look like key=value")
        wanted[key] = value
    return wanted
