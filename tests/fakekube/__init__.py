"""Fakes of a Kubernetes cluster for tests and benchmarks; see `tests.fakekube.apiserver`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.fakekube.apiserver import (
        ApiError,
        FakeApiServer,
        RequestLog,
        RequestRecord,
        ResourceKind,
        Selector,
    )

__all__ = ["ApiError", "FakeApiServer", "RequestLog", "RequestRecord", "ResourceKind", "Selector"]


def __getattr__(name: str) -> Any:
    # Imported lazily so `python -m tests.fakekube.apiserver` does not import the module twice
    # (runpy warns when the package has already imported the module it is about to run).
    if name in __all__:
        from tests.fakekube import apiserver

        return getattr(apiserver, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
