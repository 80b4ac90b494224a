"""Rollouts: record what a harness's model saw and said (the proxy), turn it into
token-exact training samples, and a scripted teacher model server for tests and demos.

The teacher and tokenizer load on first use: they import transformers, which a proxy does
not need.
"""

from __future__ import annotations

import importlib
from typing import Any

from orchard.rollout.proxy import ProxySettings, assemble_stream, create_proxy_app, token_view
from orchard.rollout.recorder import BadSession, SessionStore
from orchard.rollout.samples import Drift, Sample, build_samples

_LAZY = {name: "orchard.rollout.teacher" for name in (
    "FunctionPolicy", "Reply", "ScriptedPolicy", "TeacherServer", "ToolCall",
    "create_teacher_app")}
_LAZY["load_tokenizer"] = "orchard.rollout.tokenizer"

__all__ = ["BadSession", "Drift", "ProxySettings", "Sample", "SessionStore", "assemble_stream",
           "build_samples", "create_proxy_app", "token_view", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
