"""Orchard task sets as OpenEnv environments (``openenv-core``): reset / step / state over
WebSocket and HTTP, typed actions and observations, a domain's tools as an MCP environment;
one sandbox per episode, rewarded by the task's own grading. ``orchard openenv serve`` runs
one; ``TaskEnv`` and ``ToolsEnv`` are its clients."""

from orchard.extras import require

# Before any third-party import: a missing one is then a one-line error naming its extra.
require("openenv")

from orchard.openenv.client import TaskEnv, ToolsEnv
from orchard.openenv.environment import (
    EpisodeHooks,
    GradedEpisode,
    McpOpener,
    ServedTasks,
    TaskEnvironment,
)
from orchard.openenv.models import SUBMIT_TOOL, TaskAction, TaskObservation, TaskState
from orchard.openenv.server import create_app, serve
from orchard.openenv.tools import ToolsEnvironment

__all__ = [
    "SUBMIT_TOOL",
    "EpisodeHooks",
    "GradedEpisode",
    "McpOpener",
    "ServedTasks",
    "TaskAction",
    "TaskEnv",
    "TaskEnvironment",
    "TaskObservation",
    "TaskState",
    "ToolsEnv",
    "ToolsEnvironment",
    "create_app",
    "serve",
]
