"""The web console at /ui: sandboxes, rollouts and traces, eval reports and metrics, as pages
built on the orchestrator's REST API (docs/guides/console.md)."""

from orchard.console.app import mount_console

__all__ = ["mount_console"]
