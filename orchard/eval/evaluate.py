"""One call from tasks to results: put the recording proxy in front of the harness's model,
run, grade, write. What ``orchard eval`` runs; usable from Python as is.

    from orchard.domains import load_tasks, make_harness
    from orchard.eval import evaluate

    domain, tasks = load_tasks("bundled", split="test")
    with SandboxClient.local() as client:
        summary = evaluate(tasks, make_harness("oracle", tasks), Path("runs/oracle"), client)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchard.env.client import SandboxClient
from orchard.eval.harness import Harness
from orchard.eval.results import RolloutResult
from orchard.eval.runner import RunConfig, Runner
from orchard.tasks.protocol import Task


def evaluate(tasks: Sequence[Task], harness: Harness, out: Path,
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
