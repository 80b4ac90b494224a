"""Rollouts: record what a harness's model saw and said (the proxy), and turn it into
token-exact training samples."""

from orchard.rollout.proxy import ProxySettings, assemble_stream, create_proxy_app, token_view
from orchard.rollout.recorder import BadSession, SessionStore
from orchard.rollout.samples import Drift, Sample, build_samples

__all__ = ["BadSession", "Drift", "ProxySettings", "Sample", "SessionStore", "assemble_stream",
           "build_samples", "create_proxy_app", "token_view"]
