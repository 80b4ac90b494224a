"""Rollouts: record what a harness's model saw and said (the proxy), join it with what the
sandboxes did into one trace per rollout, export and replay traces, turn them into token-exact
training samples; harness adapters (mini-swe-agent) and a scripted teacher model server.

Heavy parts load on first use (transformers for the teacher and tokenizer, litellm for
mini-swe-agent, datasets for exports), so a proxy imports none of them.
"""

from __future__ import annotations

from orchard.extras import require

# Before any third-party import: a missing one is then a one-line error naming its extra.
require("rollout")

import importlib
from typing import Any

from orchard.rollout.answers import assemble_stream, token_view
from orchard.rollout.proxy import ProxySettings, create_proxy_app
from orchard.rollout.recorder import BadSession, SessionStore
from orchard.rollout.samples import Drift, Sample, build_samples

_LAZY = {name: "orchard.rollout.teacher" for name in (
    "FunctionPolicy", "Reply", "ScriptedPolicy", "TeacherServer", "ToolCall",
    "create_teacher_app")}
_LAZY["load_tokenizer"] = "orchard.rollout.tokenizer"
_LAZY.update({name: "orchard.rollout.trace" for name in (
    "Trace", "TraceStep", "build_trace", "collect_trace")})
_LAZY.update({name: "orchard.rollout.export" for name in (
    "read_jsonl", "swe_row", "to_dataset", "write_jsonl", "write_parquet", "write_swe_jsonl")})
_LAZY.update({name: "orchard.rollout.replay" for name in ("ReplayReport", "replay")})
_LAZY.update({name: "orchard.rollout.branch" for name in ("branch", "restore")})
_LAZY.update({name: "orchard.rollout.minisweagent" for name in (
    "OrchardEnvironment", "OrchardEnvironmentConfig", "run_task")})

__all__ = ["BadSession", "Drift", "ProxySettings", "Sample", "SessionStore", "assemble_stream",
           "build_samples", "create_proxy_app", "token_view", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
