"""One call from tasks to results: pick the harness, put the recording proxy in front of its
model, run, grade, write. What ``orchard eval`` runs; usable from Python as is.

    from orchard.eval import evaluate, make_harness
    from orchard.tasks import load_tasks

    tasks = load_tasks("bundled", split="test")
    with SandboxClient.local() as client:
        summary = evaluate(tasks, make_harness("oracle", tasks), Path("runs/oracle"), client)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchard.env.client import SandboxClient
from orchard.eval.assistant_harness import AssistantHarness, AssistantTeacherHarness
from orchard.eval.harness import (
    HARNESSES,
    AnyTask,
    Harness,
    MiniSweAgentHarness,
    OracleHarness,
    TeacherHarness,
)
from orchard.eval.results import RolloutResult
from orchard.eval.runner import RunConfig, Runner
from orchard.eval.web_harness import BrowserAgentHarness, WebTeacherHarness
from orchard.tasks.assistant.judge import RubricJudge
from orchard.tasks.assistant.model import AssistantTask
from orchard.tasks.model import Task
from orchard.tasks.web.model import WebTask

WEB_HARNESSES = ("web-teacher", "browser-agent")
ASSISTANT_HARNESSES = ("assistant-teacher", "assistant")


def make_harness(name: str, tasks: Sequence[AnyTask], *,
                 model_url: str | None = None,
                 model: str | None = None, teacher_solve: float = 1.0,
                 config: dict[str, Any] | None = None, token_ids: bool = True,
                 render_with: str | Path | None = None, judge_url: str | None = None,
                 judge_model: str | None = None) -> Harness:
    """A bundled harness by name: ``oracle``, ``teacher`` or ``mini-swe-agent``; for web tasks
    ``web-teacher`` or ``browser-agent``; for assistant tasks ``assistant-teacher`` or
    ``assistant``, whose rubric ``judge_url`` (an OpenAI base URL) scores when given."""
    web = [t for t in tasks if isinstance(t, WebTask)]
    if web and name not in WEB_HARNESSES:
        raise ValueError(f"web tasks run with {' or '.join(WEB_HARNESSES)}, not {name!r}")
    helped = [t for t in tasks if isinstance(t, AssistantTask)]
    if helped and name not in ASSISTANT_HARNESSES:
        raise ValueError(f"assistant tasks run with {' or '.join(ASSISTANT_HARNESSES)}, not "
                         f"{name!r}")
    judge = RubricJudge(judge_url, judge_model or "judge") if judge_url else None
    if name == "assistant-teacher":
        return AssistantTeacherHarness(helped, solve=teacher_solve, judge=judge)
    if name == "assistant":
        if not model_url or not model:
            raise ValueError("the assistant harness needs --model-url and --model")
        return AssistantHarness(model_url, model, render_with=render_with, judge=judge)
    if name == "web-teacher":
        return WebTeacherHarness(web, solve=teacher_solve)
    if name == "browser-agent":
        if not model_url or not model:
            raise ValueError("the browser-agent harness needs --model-url and --model")
        return BrowserAgentHarness(model_url, model)
    swe = [t for t in tasks if isinstance(t, Task)]
    if name == "oracle":
        return OracleHarness()
    if name == "teacher":
        return TeacherHarness(swe, solve=teacher_solve, config=config)
    if name == "mini-swe-agent":
        if not model_url or not model:
            raise ValueError("the mini-swe-agent harness needs --model-url (an OpenAI-"
                             "compatible server, e.g. http://127.0.0.1:8000) and --model "
                             "(the name it serves)")
        return MiniSweAgentHarness(model_url, model, token_ids=token_ids, config=config,
                                   render_with=render_with)
    raise ValueError(f"unknown harness {name!r}; choose one of "
                     f"{', '.join((*HARNESSES, *WEB_HARNESSES, *ASSISTANT_HARNESSES))}")


def evaluate(tasks: Sequence[AnyTask], harness: Harness, out: Path,
             client: SandboxClient, *,
             config: RunConfig | None = None, proxy_url: str | None = None,
             proxy_key: str | None = None,
             on_start: Callable[[RolloutResult | None, int, int], None] | None = None,
             on_result: Callable[[RolloutResult], None] | None = None) -> dict[str, Any]:
    """Run ``harness`` on ``tasks`` into ``out`` (resuming what is there); the summary.

    A harness with a model gets a recording proxy: ``proxy_url`` if given (then it must
    forward to the harness's model, and ``proxy_key`` is its admin key, which reading the
    rollouts' calls takes), else one started here in front of ``harness.model_upstream``,
    storing its calls under ``out/calls``, whose key only this call knows."""
    config = config or RunConfig(out=out)
    with contextlib.ExitStack() as stack:
        if hasattr(harness, "__enter__"):
            stack.enter_context(harness)  # type: ignore[arg-type]
        if harness.model_upstream is not None and proxy_url is None:
            from orchard.rollout.proxy.app import ProxySettings, create_proxy_app
            from orchard.serving import ThreadedServer

            settings = ProxySettings(upstreams=[harness.model_upstream], store=out / "calls",
                                     render_with=getattr(harness, "render_with", None))
            proxy = ThreadedServer(create_proxy_app(settings), name="orchard-proxy")
            proxy_url, proxy_key = proxy.start(), settings.admin_key
            stack.callback(proxy.stop)
        elif proxy_url is not None:
            from orchard.rollout.traces.trace import check_proxy_key

            check_proxy_key(proxy_url, proxy_key)  # before any rollout, not in each trace
        runner = Runner(config, tasks, harness, client, proxy_url=proxy_url,
                        proxy_key=proxy_key, on_start=on_start, on_result=on_result)
        return runner.run()
