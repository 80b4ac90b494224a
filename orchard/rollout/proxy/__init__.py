"""The recording proxy: an OpenAI-compatible relay in front of the model that keeps each call's
request, answer and exact tokens per rollout session."""

from orchard.rollout.proxy.app import ProxySettings, create_proxy_app
from orchard.rollout.proxy.recorder import BadSession, ModelCall, SessionStore

__all__ = ["BadSession", "ModelCall", "ProxySettings", "SessionStore", "create_proxy_app"]
