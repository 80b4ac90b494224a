"""The in-sandbox agent (``server``, standard library only) and the orchestrator's client."""

from orchard.env.agent.client import AgentClient, AgentError, AgentUnreachable

__all__ = ["AgentClient", "AgentError", "AgentUnreachable"]
