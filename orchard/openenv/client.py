"""Typed OpenEnv clients of an Orchard task server (async; ``.sync()`` for blocking code).

    async with TaskEnv(base_url="http://127.0.0.1:8000") as env:
        first = await env.reset(task_id="bundled-001")
        ran = await env.step(TaskAction(command="pytest -q"))
        done = await env.step(TaskAction(submit=True))     # done.reward: the task's grade

``ToolsEnv`` is OpenEnv's ``MCPToolClient`` for a task set that serves tools; its ``reset``
gives the task's prompt too.
"""

from __future__ import annotations

from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.types import Observation
from openenv.core.mcp_client import MCPToolClient

from orchard.openenv.models import TaskAction, TaskObservation, TaskState


def _observation(payload: dict[str, Any]) -> TaskObservation:
    return TaskObservation(**payload.get("observation", {}), reward=payload.get("reward"),
                           done=payload.get("done", False))


class TaskEnv(EnvClient[TaskAction, TaskObservation, TaskState]):
    """Episodes of commands and a submit."""

    def _step_payload(self, action: TaskAction) -> dict[str, Any]:
        return action.model_dump(exclude_none=True, exclude={"metadata"})

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[TaskObservation]:
        observation = _observation(payload)
        return StepResult(observation, reward=observation.reward, done=observation.done)

    def _parse_state(self, payload: dict[str, Any]) -> TaskState:
        return TaskState(**payload)


class ToolsEnv(MCPToolClient):
    """Episodes of tool calls and a ``submit`` tool call."""

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[Observation]:
        if "prompt" in payload.get("observation", {}):  # a reset
            observation = _observation(payload)
            return StepResult(observation, reward=observation.reward, done=observation.done)
        return super()._parse_result(payload)

    def _parse_state(self, payload: dict[str, Any]) -> TaskState:
        return TaskState(**payload)
