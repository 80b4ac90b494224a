"""A task set whose sandboxes serve tools (the assistant's), as an OpenEnv MCP environment.

The agent speaks OpenEnv's MCP actions (``ListToolsAction``, ``CallToolAction``; its
``MCPToolClient``). Each call goes to the MCP server in the episode's sandbox through the
domain's MCP session, so the tools act on that episode's world. One more tool, ``submit``,
hands in the final answer: the task grades the sandbox and the step's reward is its grade.

OpenEnv's own ``MCPEnvironment`` binds one in-process FastMCP server for the environment's
life; here the server is in a sandbox that each reset replaces, so this environment answers
the same actions itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from mcp.shared.exceptions import MCPError
from openenv.core.env_server.mcp_types import (
    CallToolAction,
    CallToolObservation,
    ListToolsAction,
    ListToolsObservation,
    Tool,
    ToolError,
    ToolErrorType,
)
from openenv.core.env_server.types import Action, Observation

from orchard.env.client import AsyncSandboxClient
from orchard.openenv.environment import McpOpener, ServedTasks, TaskEnvironment
from orchard.openenv.models import SUBMIT_TOOL

SUBMIT = Tool(name=SUBMIT_TOOL, description="Hand in your final answer and end the episode; "
              "the task is then graded.",
              input_schema={"type": "object", "properties": {"answer": {
                  "type": "string", "description": "Your final answer to the request."}},
                  "required": ["answer"]})


class ToolsEnvironment(TaskEnvironment):
    """Episodes whose actions are tool calls on the task's tools, ended by ``submit``."""

    def __init__(self, served: ServedTasks) -> None:
        if served.hooks.mcp is None:
            raise ValueError(f"the tasks of {served.name} serve no tools: serve them as a "
                             "TaskEnvironment (commands) instead")
        super().__init__(served)
        self.mcp: McpOpener = served.hooks.mcp

    def step(self, action: Action, timeout_s: float | None = None,  # type: ignore[override]
             **kwargs: Any) -> Observation:
        if isinstance(action, ListToolsAction):
            return ListToolsObservation(tools=[*self._listed(), SUBMIT])
        if not isinstance(action, CallToolAction):
            raise ValueError(f"this environment takes list_tools and call_tool actions, not "
                             f"{type(action).__name__}")
        task, _ = self._live()
        if action.tool_name == SUBMIT_TOOL:
            answer = action.arguments.get("answer")
            if not isinstance(answer, str):
                return self._refused(action, ToolErrorType.INVALID_ARGS,
                                     "submit takes {'answer': a string}")
            return self._graded(action, self._finish(answer, "submit").model_dump(mode="json"))
        observed = self._called(action, timeout_s)
        self._state.step_count += 1
        if self._steps_left():
            return observed
        grade = self._finish(None, "budget")
        return observed.model_copy(update={"done": True, "reward": grade.reward})

    def _listed(self) -> list[Tool]:
        async def listing() -> list[Any]:
            async with self._session() as session:
                return list((await session.list_tools()).tools)

        self._live()
        return [Tool(name=t.name, description=t.description or "", input_schema=t.input_schema)
                for t in asyncio.run(listing())]

    def _called(self, action: CallToolAction, timeout_s: float | None) -> CallToolObservation:
        async def call() -> Any:
            async with self._session() as session:
                return await asyncio.wait_for(
                    session.call_tool(action.tool_name, action.arguments),
                    timeout_s or self.served.command_timeout)

        try:
            result = asyncio.run(call())
        except TimeoutError:
            return self._refused(action, ToolErrorType.TIMEOUT, f"{action.tool_name} did not "
                                 "answer in time")
        except MCPError as e:
            return self._refused(action, ToolErrorType.EXECUTION_ERROR, str(e))
        texts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
        # The shape of FastMCP's CallToolResult, which OpenEnv's MCPToolClient reads ("data").
        return CallToolObservation(tool_name=action.tool_name, result={
            "content": texts, "structured_content": result.structured_content,
            "data": result.structured_content or "\n".join(texts),
            "is_error": bool(result.is_error)})

    @contextlib.asynccontextmanager
    async def _session(self) -> AsyncIterator[Any]:
        # An SDK client of its own: each call runs on an event loop of its own, in the
        # session's thread.
        client = self.served.client
        async with AsyncSandboxClient(client.base_url, api_key=client.api_key,
                                      cleanup_on_close=False) as aclient:
            sandbox = await aclient.get_sandbox(str(self._state.sandbox_id))
            async with self.mcp(sandbox) as session:
                yield session

    def _graded(self, action: CallToolAction, grade: dict[str, Any]) -> CallToolObservation:
        return CallToolObservation(tool_name=action.tool_name, done=True,
                                   reward=grade["reward"],
                                   result={"data": grade, "is_error": False})

    @staticmethod
    def _refused(action: CallToolAction, kind: ToolErrorType, why: str) -> CallToolObservation:
        return CallToolObservation(tool_name=action.tool_name,
                                   error=ToolError(error_type=kind, message=why))
