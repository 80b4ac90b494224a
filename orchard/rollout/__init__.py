"""Rollouts, by concern.

- ``proxy``: record what a harness's model saw and said, token-exactly.
- ``traces``: join those calls with what the sandboxes did into one trace per rollout; export,
  replay and branch traces; turn them into token-exact training samples.
- ``agents``: the tool-calling loop the domains' agents share (each domain's own agent loop
  lives with it, in ``orchard.domains.<name>``).

Heavy parts load on first use (transformers for the tokenizer, datasets for exports), so a
proxy imports none of them.
"""

from __future__ import annotations

from orchard.extras import require

# Before any third-party import: a missing one is then a one-line error naming its extra.
require("rollout")

import importlib
from typing import Any

from orchard.rollout.proxy.answers import assemble_stream, token_view
from orchard.rollout.proxy.app import ProxySettings, create_proxy_app
from orchard.rollout.proxy.recorder import BadSession, ModelCall, SessionStore
from orchard.rollout.traces.samples import Drift, Sample, build_samples

_LAZY = {"load_tokenizer": "orchard.rollout.tokenizer"}
_LAZY.update({name: "orchard.rollout.traces.trace" for name in (
    "Trace", "TraceStep", "build_trace", "collect_trace")})
_LAZY.update({name: "orchard.rollout.traces.export" for name in (
    "read_jsonl", "swe_row", "to_dataset", "write_jsonl", "write_parquet", "write_swe_jsonl")})
_LAZY.update({name: "orchard.rollout.traces.replay" for name in ("ReplayReport", "replay")})
_LAZY.update({name: "orchard.rollout.traces.branch" for name in ("branch", "restore")})

__all__ = ["BadSession", "Drift", "ModelCall", "ProxySettings", "Sample", "SessionStore",
           "assemble_stream", "build_samples", "create_proxy_app", "token_view", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
