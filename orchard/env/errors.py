"""Service errors: each carries the HTTP status it maps to and a message saying what to do."""

from __future__ import annotations


class ServiceError(Exception):
    status = 500

    def __init__(self, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.headers = headers or {}


class BadRequest(ServiceError):
    status = 400


class NotFound(ServiceError):
    status = 404


class WaitTimedOut(ServiceError):
    status = 408


class Conflict(ServiceError):
    status = 409


class TooLarge(ServiceError):
    status = 413


class Overloaded(ServiceError):
    status = 503

    def __init__(self, detail: str, retry_after: float = 1.0) -> None:
        super().__init__(detail, {"Retry-After": str(max(1, round(retry_after)))})
