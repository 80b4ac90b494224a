"""The wire contract of requests to a sandbox's own services: an HTTP request in, its answer
out. The agent makes the request on the sandbox's loopback, so a service the sandbox serves
(a site, a tool server) needs no port opened to the outside."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# What an answer may weigh: the agent reads at most this much of it.
MAX_RESPONSE_BYTES = 8 << 20
Method = Literal["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"]


class ServiceRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    port: int = Field(ge=1, le=65535, description="The port the service listens on, on the "
                      "sandbox's 127.0.0.1.")
    method: Method = "GET"
    path: str = Field("/", pattern=r"^/", max_length=8192, description="With its query.")
    headers: dict[str, str] = Field(default_factory=dict)
    body: str = Field("", max_length=8 << 20, description="Text, e.g. JSON.")
    timeout: float = Field(30.0, gt=0, le=600, description="Seconds to wait for the answer.")


class ServiceResponse(BaseModel):
    status: int
    headers: dict[str, str]
    body: str = Field(description="The answer's body: text, or base64 when `encoding` says.")
    encoding: Literal["utf-8", "base64"] = "utf-8"

    def json(self) -> Any:
        """The body, parsed as JSON."""
        return json.loads(self.body)


def service_request(port: int, path: str, method: Method, json_body: Any, body: str,
                    headers: Mapping[str, str] | None, timeout: float) -> ServiceRequest:
    """The SDK's arguments as a request: ``json_body`` (when not None) is sent as JSON."""
    sent = dict(headers or {})
    if json_body is not None:
        body = json.dumps(json_body)
        sent.setdefault("Content-Type", "application/json")
    return ServiceRequest(port=port, path=path, method=method, headers=sent, body=body,
                          timeout=timeout)
