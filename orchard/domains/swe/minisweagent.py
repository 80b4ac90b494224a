"""mini-swe-agent on Orchard: its Environment protocol over an Orchard sandbox, and `run_task`.

mini-swe-agent (the agent loop and its litellm model) runs in this process; every bash
action it takes runs in one Orchard sandbox, the way its DockerEnvironment runs them in a
container: a fresh ``bash -lc`` per action, stdout and stderr merged, a per-command timeout,
and the submission detected from the first output line ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``.

    with OrchardEnvironment(base_url="http://127.0.0.1:8000", image="host") as env:
        agent = DefaultAgent(LitellmModel(model_name=...), env, **agent_config)
        agent.run("Fix the failing test in /workspace")

Upstream configs can use it too: ``environment_class:
orchard.domains.swe.minisweagent.OrchardEnvironment``. ``run_task`` wires everything for one
rollout: the bundled tool-calling config (``mini.yaml``), a litellm model pointed at an
OpenAI-compatible URL (the recording proxy's ``http://proxy/s/<session>/v1``), and a sandbox
created for the task and deleted after it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import posixpath
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

# mini-swe-agent prints a banner to stdout on import, and litellm fetches its model price list
# from GitHub on import (hanging offline); a rollout worker wants neither. setdefault: a user
# who set them keeps their choice.
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402
import yaml  # noqa: E402
from jinja2 import StrictUndefined, Template  # noqa: E402
from minisweagent.agents.default import AgentConfig, DefaultAgent  # noqa: E402
from minisweagent.config import builtin_config_dir, get_config_from_spec  # noqa: E402
from minisweagent.exceptions import FormatError, LimitsExceeded, Submitted  # noqa: E402
from minisweagent.models.litellm_model import LitellmModel  # noqa: E402
from minisweagent.utils.serialize import recursive_merge  # noqa: E402
from pydantic import BaseModel, Field, field_validator  # noqa: E402

from orchard.env.client import (  # noqa: E402
    ConflictError,
    ConnectError,
    ExecResult,
    InvalidRequest,
    NotFoundError,
    OrchardError,
    Sandbox,
    SandboxClient,
    TransportError,
    WaitTimeout,
)
from orchard.env.schema import SESSION_PATTERN  # noqa: E402
from orchard.rollout.proxy.app import SESSION_HEADER  # noqa: E402
from orchard.rollout.seeds import call_seed  # noqa: E402
from orchard.tasks.protocol import SUBMIT_MARKER  # noqa: E402

log = logging.getLogger(__name__)

# vLLM's extension for token-exact training data; the teacher and the proxy understand it.
TOKEN_IDS_BODY = {"return_token_ids": True, "logprobs": True}
# The exec API returns stdout and stderr apart; upstream environments give the model one
# interleaved stream (stderr=STDOUT). Pointing fd 2 at fd 1 before exec'ing the interpreter
# makes both the same pipe, so the order is kept exactly, whatever the interpreter is.
_MERGE_STDERR = ["/bin/sh", "-c", 'exec "$@" 2>&1', "sh"]


class SandboxUnavailable(OrchardError):
    """The environment could not get a sandbox to run commands in."""


class OrchardEnvironmentConfig(BaseModel):
    """Settings of :class:`OrchardEnvironment`, shaped like mini-swe-agent's
    ``DockerEnvironmentConfig``."""

    base_url: str | None = None
    """Orchestrator URL; None: ``ORCHARD_URL``, else http://127.0.0.1:8000."""
    api_key: str | None = Field(None, exclude=True, repr=False)
    """Orchestrator API key (None: ``ORCHARD_API_KEY``). Never serialized into trajectories."""
    image: str = "host"
    """'host', a rootfs directory, an image tarball or an OCI layout (see the sandboxes guide)."""
    cwd: str = "/workspace"
    """Working directory of every command."""
    env: dict[str, str] = {}
    """Environment variables set for every command."""
    forward_env: list[str] = []
    """Variables copied from this process's environment when set; ``env`` wins on conflict."""
    timeout: int = 30
    """Seconds a command may run before it is killed, with everything it started."""
    interpreter: list[str] = ["bash", "-lc"]
    """The command is appended to this argv, as in DockerEnvironment."""
    cpu: str | None = None
    """CPU limit, e.g. '2' or '500m'."""
    memory: str | None = None
    """Memory limit, e.g. '4Gi'."""
    pids: int | None = None
    """Max processes in the sandbox."""
    labels: dict[str, str] = {}
    """Labels of a created sandbox (find them with ``orchard sandbox ls --label K=V``)."""
    block_network: bool = True
    """True: loopback only inside the sandbox. The model is called from this process, not
    from the sandbox, so the agent works without network in the sandbox."""
    sandbox_timeout: float | None = None
    """Time to live of a created sandbox in seconds (None: the server's default, 2 h)."""
    startup_timeout: float = 120.0
    """Seconds to wait for the sandbox to become ready."""
    sandbox_id: str | None = None
    """Attach to this existing sandbox instead of creating one; it is not deleted on close."""
    session: str | None = None
    """Rollout id: the sandbox's ``session``, so its events and the proxy's record of the
    model calls join into one trace."""

    @field_validator("session")
    @classmethod
    def _session_id(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(SESSION_PATTERN, v):
            raise ValueError(f"session id {v!r} must be 1-128 letters, digits, '.', '_' or '-', "
                             "starting with a letter or digit (the recording proxy's rule)")
        return v


class OrchardEnvironment:
    """mini-swe-agent's Environment protocol over one Orchard sandbox.

    Creates a sandbox (or attaches to ``sandbox_id``) on construction; :meth:`close`, or
    leaving a ``with`` block, deletes the sandbox if this environment created it. Ctrl-C and
    SIGTERM delete it too (the SDK's signal cleanup); a forgotten one expires after its TTL.
    """

    def __init__(self, *, config_class: type[OrchardEnvironmentConfig] = OrchardEnvironmentConfig,
                 logger: logging.Logger | None = None, **kwargs: Any) -> None:
        # Not upstream's "minisweagent.environment": that logger prints to stdout (rich).
        self.logger = logger or log
        self.config = config_class(**kwargs)
        self._platform: dict[str, str] | None = None
        self._closed = False
        self.exec_seconds = 0.0  # wall time of the agent's commands, round trip included
        self.created = self.config.sandbox_id is None
        self._client = SandboxClient(self.config.base_url, api_key=self.config.api_key)
        try:
            self.sandbox: Sandbox = self._create() if self.created else self._attach()
        except BaseException:
            self._client.close()
            raise
        self.logger.info("%s sandbox %s (image %r)", "created" if self.created else "attached to",
                         self.sandbox.id, self.config.image)

    @property
    def sandbox_id(self) -> str:
        return self.sandbox.id

    def _create(self) -> Sandbox:
        c = self.config
        try:
            return self._client.create_sandbox(
                c.image, block_network=c.block_network, cpu=c.cpu, memory=c.memory, pids=c.pids,
                ttl=c.sandbox_timeout, labels=c.labels, session=c.session,
                timeout=c.startup_timeout)
        except ConnectError as e:
            raise SandboxUnavailable(
                f"cannot reach the Orchard orchestrator at {self._client.base_url} ({e}); start "
                "one with `orchard serve` or set base_url / ORCHARD_URL to a running one") from e
        except WaitTimeout as e:
            raise SandboxUnavailable(
                f"the sandbox (image {c.image!r}) was not ready within {c.startup_timeout:g} s "
                "and was deleted; raise startup_timeout, or check the orchestrator's capacity "
                "(GET /resources)") from e
        except OrchardError as e:
            raise SandboxUnavailable(
                f"could not create a sandbox (image {c.image!r}) on {self._client.base_url}: "
                f"{e}") from e

    def _attach(self) -> Sandbox:
        sid = self.config.sandbox_id
        assert sid is not None
        try:
            sandbox = self._client.get_sandbox(sid)
            if sandbox.info.status != "running":
                sandbox.wait_ready(self.config.startup_timeout)
            return sandbox
        except NotFoundError as e:
            raise SandboxUnavailable(
                f"no sandbox {sid!r} on {self._client.base_url}: it was never created there, or "
                "it was deleted or expired; list them with `orchard sandbox ls`, or leave "
                "sandbox_id unset to create one") from e
        except ConnectError as e:
            raise SandboxUnavailable(
                f"cannot reach the Orchard orchestrator at {self._client.base_url} ({e}); start "
                "one with `orchard serve` or set base_url / ORCHARD_URL to a running one") from e
        except OrchardError as e:
            raise SandboxUnavailable(f"cannot attach to sandbox {sid!r}: {e}") from e

    # --- the Environment protocol ---

    def execute(self, action: dict, cwd: str = "", *,
                timeout: int | None = None) -> dict[str, Any]:
        """Run ``action["command"]``; raises ``Submitted`` when its output starts with the
        submission marker and it exited 0, exactly as mini-swe-agent's own environments do."""
        output = self.run_command(action.get("command", ""), cwd, timeout=timeout)
        self._check_finished(output)
        return output

    def run_command(self, command: str, cwd: str = "", *,
                    timeout: int | None = None) -> dict[str, Any]:
        """Like :meth:`execute`, without submission detection: for set-up and evaluation."""
        timeout = timeout or self.config.timeout
        start = time.monotonic()
        try:
            job = self.sandbox.exec([*_MERGE_STDERR, *self.config.interpreter, command],
                                    cwd=cwd or self.config.cwd, timeout=timeout,
                                    env=self._exec_env())
        except OrchardError as e:
            self.exec_seconds += time.monotonic() - start
            return {"output": "", "returncode": -1, "exception_info": self._explain(e),
                    "extra": {"exception_type": type(e).__name__, "exception": str(e)}}
        self.exec_seconds += time.monotonic() - start
        return self._output(job, timeout)

    def _exec_env(self) -> dict[str, str]:
        forwarded = {k: v for k in self.config.forward_env if (v := os.environ.get(k)) is not None}
        return forwarded | self.config.env

    def _output(self, job: ExecResult, timeout: float) -> dict[str, Any]:
        text = job.stdout_bytes.decode("utf-8", errors="replace")
        out: dict[str, Any] = {"output": text, "returncode": job.exit_code, "exception_info": ""}
        if job.timed_out:
            out["returncode"] = -1
            out["exception_info"] = (
                f"The command timed out after {timeout:g} seconds and was killed, with every "
                "process it started; its output so far is shown. Make it faster, or run it in "
                "the background with its output sent to a file and check on it later.")
            out["extra"] = {"exception_type": "TimeoutError", "exception": "timed out"}
        elif job.exit_code is None or job.error:
            out["returncode"] = -1 if job.exit_code is None else job.exit_code
            out["exception_info"] = f"The command could not run to completion: {job.error}"
        if job.stdout_dropped:
            out.setdefault("extra", {})["output_bytes_dropped"] = job.stdout_dropped
        return out

    def _explain(self, e: OrchardError) -> str:
        sid = self.sandbox.id
        if isinstance(e, NotFoundError):
            return (f"The sandbox {sid} no longer exists (deleted, expired or reaped), so the "
                    "command did not run; no further command can run in this environment.")
        if isinstance(e, ConflictError):
            return f"The sandbox {sid} cannot run commands: {e.detail}"
        if isinstance(e, InvalidRequest):
            return f"The command was rejected: {e.detail}"
        if isinstance(e, TransportError):
            return (f"Lost contact with the orchestrator at {self._client.base_url} ({e}); the "
                    "command may or may not have run.")
        return f"An error occurred while executing the command: {e}"

    def _check_finished(self, output: dict) -> None:
        """Raises Submitted if the output indicates task completion (as upstream does)."""
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {
                    "role": "exit",
                    "content": submission,
                    "extra": {"exit_status": "Submitted", "submission": submission},
                }
            )

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return recursive_merge(self.config.model_dump(), self._uname(),
                               {"sandbox_id": self.sandbox.id}, kwargs)

    def _uname(self) -> dict[str, str]:
        """The sandbox's own uname (the prompt tells the model what system it is on); the
        orchestrator may be another machine, so this process's platform would be wrong."""
        if self._platform is None:
            fields = ("system", "node", "release", "version", "machine", "processor")
            try:
                job = self.sandbox.exec("for f in s n r v m p; do uname -$f; done", timeout=30)
                values = job.stdout.splitlines()
                ok = job.exit_code == 0 and len(values) == len(fields)
            except OrchardError as e:
                ok, values = False, []
                self.logger.warning("uname in sandbox %s failed: %s", self.sandbox.id, e)
            # A sandbox without uname still needs every key the prompt templates use.
            self._platform = (dict(zip(fields, values, strict=True)) if ok
                              else platform.uname()._asdict())
        return self._platform

    def serialize(self) -> dict:
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{self.__class__.__module__}.{self.__class__.__name__}",
                },
                "sandbox_id": self.sandbox.id,
            }
        }

    # --- lifecycle ---

    def close(self) -> None:
        """Delete the sandbox if this environment created it (best effort); idempotent."""
        if self._closed:
            return
        self._closed = True
        # The client deletes exactly the sandboxes it created, never an attached one.
        self._client.close()

    cleanup = close  # the name upstream environments use

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Upstream runners never call cleanup() and rely on __del__ for it, as with docker.
        with contextlib.suppress(Exception):
            if getattr(self, "_client", None) is not None and hasattr(self, "sandbox"):
                self.close()


class _LitellmModel(LitellmModel):
    """LitellmModel with an API key kept out of its config, so trajectories never hold it, and
    with per-call seeds: given a rollout's ``seed``, call i sends ``call_seed(seed, i)``."""

    def __init__(self, *, api_key: str, seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._api_key = api_key
        self._seed = seed
        self.n_queries = 0

    def query(self, messages: list[dict[str, str]], **kwargs: Any) -> dict:
        # Counted here, not in _query: a retried request keeps its turn's seed.
        if self._seed is not None:
            kwargs = {"seed": call_seed(self._seed, self.n_queries), **kwargs}
        self.n_queries += 1
        return super().query(messages, **kwargs)

    def _query(self, messages: list[dict[str, str]], **kwargs: Any) -> Any:
        return super()._query(messages, api_key=self._api_key, **kwargs)

    def _parse_actions(self, response: Any) -> list[dict]:
        # Upstream checks that a "command" argument exists, not that it is a string. A model
        # that nests it ({"command": {"command": "ls"}}) must see a format error it can fix;
        # the dict would otherwise reach the sandbox and end the rollout as a harness failure.
        actions = super()._parse_actions(response)
        for action in actions:
            if not isinstance(action["command"], str):
                error = ("The bash tool's 'command' argument must be a string holding the "
                         f"shell command, not {type(action['command']).__name__} "
                         f"{json.dumps(action['command'])[:200]}.")
                content = Template(self.config.format_error_template,
                                   undefined=StrictUndefined).render(
                    error=error, actions=[], has_tool_calls=True,
                    finish_reason=response.choices[0].finish_reason)
                raise FormatError({"role": "user", "content": content,
                                   "extra": {"interrupt_type": "FormatError"}})
        return actions

    def _calculate_cost(self, response: Any) -> dict[str, float]:
        # For a model it cannot price (any self-hosted one) litellm prints a banner to stdout
        # before the error that cost_tracking="ignore_errors" then ignores: noise on every call.
        quiet, litellm.suppress_debug_info = litellm.suppress_debug_info, True
        try:
            return super()._calculate_cost(response)
        finally:
            litellm.suppress_debug_info = quiet


class BudgetedAgentConfig(AgentConfig):
    token_limit: int = 0
    """Stop once a model call held this many prompt + completion tokens: the context budget
    of a rollout (0: no limit)."""


class BudgetedAgent(DefaultAgent):
    """DefaultAgent with a token budget beside its step, cost and wall-time limits: a
    self-hosted model has no cost, and its context is what runs out."""

    def __init__(self, model: Any, env: Any, *, history: Sequence[dict[str, Any]] = (),
                 **kwargs: Any) -> None:
        super().__init__(model, env, config_class=BudgetedAgentConfig, **kwargs)
        self.n_tokens = 0  # spent over all calls
        self.context_tokens = 0  # held by the last call
        self._history = [dict(m) for m in history]

    def add_messages(self, *messages: dict) -> list[dict]:
        # DefaultAgent.run always opens with its system and user messages; a continuation
        # (Monte-Carlo value estimates branch a recorded rollout at a step) opens with the
        # recorded conversation instead, so the model sees exactly what it saw then.
        if self._history and not self.messages:
            messages, self._history = tuple(self._history), []
        return super().add_messages(*messages)

    def query(self) -> dict:
        limit = self.config.token_limit
        if 0 < limit <= self.context_tokens:
            raise LimitsExceeded({"role": "exit", "content": "LimitsExceeded",
                                  "extra": {"exit_status": "LimitsExceeded", "submission": "",
                                            "reason": f"context budget of {limit} tokens "
                                                      "reached"}})
        message = super().query()
        usage = (message.get("extra", {}).get("response") or {}).get("usage") or {}
        self.context_tokens = int(usage.get("total_tokens") or 0)
        self.n_tokens += self.context_tokens
        return message


def config_from_specs(specs: Sequence[str | Path]) -> dict[str, Any]:
    """Config overrides as mini-swe-agent's ``-c`` reads them: YAML files (a path, or a name
    of a bundled config) and ``key.path=value`` pairs, merged in order."""
    return recursive_merge(*(get_config_from_spec(spec) for spec in specs))


def default_config() -> dict[str, Any]:
    """mini-swe-agent's bundled ``mini.yaml``: the tool-calling config its ``mini`` command
    runs (a ``bash`` tool, JSON observations) that LitellmModel and DefaultAgent implement."""
    return yaml.safe_load((builtin_config_dir / "mini.yaml").read_text(encoding="utf-8"))


def run_task(
    task: str,
    *,
    orchestrator_url: str | None,
    model_base_url: str,
    model_name: str,
    image: str = "host",
    orchestrator_api_key: str | None = None,
    model_api_key: str | None = None,
    session: str | None = None,
    sandbox_id: str | None = None,
    cwd: str = "/workspace",
    files: Mapping[str, str | bytes] | None = None,
    setup_command: str | None = None,
    eval_command: str | None = None,
    step_limit: int = 250,
    token_limit: int = 0,
    wall_time_limit: float = 0,
    token_ids: bool = True,
    trajectory_path: Path | None = None,
    config_overrides: Mapping[str, Any] | None = None,
    history: Sequence[dict[str, Any]] = (),
    seed: int | None = None,
) -> dict[str, Any]:
    """Run mini-swe-agent's DefaultAgent on ``task`` in a sandbox; returns its result.

    ``model_base_url``: an OpenAI-compatible base URL, e.g. the recording proxy's
    ``http://proxy/s/<session>/v1``. ``model_name``: the name that server serves, sent as is
    (litellm gets ``openai/<model_name>``). ``session`` labels the sandbox and is sent as
    ``X-Orchard-Session``, which the proxy uses when the URL is its plain ``/v1``.
    ``token_ids`` asks for token ids and log-probs (vLLM's ``return_token_ids``); turn it off
    for servers that reject unknown request fields.

    Before the agent starts, ``files`` (path relative to ``cwd``, or absolute -> content) are
    written and ``setup_command`` is run (a failure raises RuntimeError); after it ends,
    ``eval_command`` is run and its ``{returncode, output}`` lands in ``result["eval"]``.
    ``config_overrides`` is merged over the config (keys ``agent``, ``model``,
    ``environment``), as mini-swe-agent's ``-c key=value`` does. ``history`` (OpenAI-shaped
    messages, system first) continues a recorded conversation instead of starting one: the
    agent's first model call sees exactly those messages. ``seed`` (a rollout's, see
    ``orchard.rollout.seeds``): the i-th model call sends the request seed
    ``call_seed(seed, i)``, so the same rollout seed draws the same turns; None sends none.

    The result: ``exit_status`` ("Submitted", "LimitsExceeded", ...), ``submission``,
    ``n_steps`` (model calls), ``n_tokens``, ``exec_seconds``, ``messages``, ``sandbox_id``,
    ``session``, ``eval``. A sandbox created here is deleted before returning, also when the
    agent raises.
    ``token_limit`` (tokens one call may hold) and ``wall_time_limit`` (seconds; 0: none) end
    the run with ``LimitsExceeded`` / ``TimeExceeded``, as ``step_limit`` does.
    """
    model_kwargs: dict[str, Any] = {"api_base": model_base_url}
    if token_ids:
        model_kwargs["extra_body"] = dict(TOKEN_IDS_BODY)
    if session is not None:
        model_kwargs["extra_headers"] = {SESSION_HEADER: session}
    ours = {
        "agent": {"step_limit": step_limit, "token_limit": token_limit,
                  "wall_time_limit_seconds": int(wall_time_limit), "output_path": trajectory_path},
        # An unknown (self-hosted) model has no price: costs are 0, not an error.
        "model": {"model_name": f"openai/{model_name}", "cost_tracking": "ignore_errors",
                  "model_kwargs": model_kwargs},
        "environment": {"base_url": orchestrator_url, "image": image, "cwd": cwd,
                        "session": session, "sandbox_id": sandbox_id},
    }
    config = recursive_merge(default_config(), ours, dict(config_overrides or {}))
    agent_config = {k: v for k, v in config.get("agent", {}).items()
                    if k not in ("agent_class", "mode", "confirm_exit")}  # interactive-only
    model_config = {k: v for k, v in config.get("model", {}).items() if k != "model_class"}
    env_config = {k: v for k, v in config.get("environment", {}).items()
                  if k != "environment_class"}
    # litellm's OpenAI client refuses to run without a key; local servers ignore it.
    key = model_api_key or os.environ.get("OPENAI_API_KEY") or "unused"
    model = _LitellmModel(api_key=key, seed=seed, **model_config)

    with OrchardEnvironment(api_key=orchestrator_api_key, **env_config) as env:
        for path, content in (files or {}).items():
            env.sandbox.upload_content(content, posixpath.join(env.config.cwd, path))
        if setup_command is not None:
            done = env.run_command(setup_command)
            if done["returncode"] != 0:
                why = done["exception_info"] or f"exit {done['returncode']}"
                raise RuntimeError(
                    f"the setup command failed in sandbox {env.sandbox_id} ({why}); fix it or "
                    f"the image. Its output ends:\n{done['output'][-2000:]}")
        agent = BudgetedAgent(model, env, history=history, **agent_config)
        info = agent.run(task)
        evaluation = None
        if eval_command is not None:
            done = env.run_command(eval_command)
            evaluation = {"returncode": done["returncode"], "output": done["output"],
                          "exception_info": done["exception_info"]}
        return {
            "exit_status": info.get("exit_status", ""),
            "submission": info.get("submission", ""),
            "n_steps": agent.n_calls,
            "n_tokens": agent.n_tokens,
            "exec_seconds": env.exec_seconds,
            "messages": agent.messages,
            "sandbox_id": env.sandbox_id,
            "session": session,
            "eval": evaluation,
        }
