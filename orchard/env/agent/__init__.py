"""The in-sandbox agent (``server``, stdlib only), its bundle, and the orchestrator's client."""

from orchard.env.agent.client import AgentClient, AgentError, AgentUnreachable

__all__ = ["AgentClient", "AgentError", "AgentUnreachable"]
