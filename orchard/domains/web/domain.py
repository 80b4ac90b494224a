"""The web domain, bundled: goals on self-hosted sites (the bundled set, the live one, YAML
files), MiniWoB++ (its pages served in the sandbox), the browser agent, the scripted web
teacher, the MiniWoB++ solver and the random-action baseline, validation by the gold run (or,
for MiniWoB++, the page's own episode), and the demo adapter."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from orchard.domains.domain import Domain, HarnessOptions, Listing, validate_each
from orchard.domains.web import WEB_SETS, load_web_tasks, validate_web
from orchard.domains.web.miniwob.tasks import MINIWOB_SETS, MiniWobTask, load_miniwob_tasks
from orchard.domains.web.model import WebTask
from orchard.env.client import SandboxClient


class WebSource:
    """The bundled ("web") and live ("web-live") sets, MiniWoB++ ("miniwob",
    "miniwob-untimed"), and YAML files of web tasks (the registry asks the assistant source
    first: its YAML files seed a ``world:``)."""

    names: Sequence[str] = (*WEB_SETS, *MINIWOB_SETS)

    def accepts(self, path: Path) -> bool:
        return path.suffix.lower() in (".yaml", ".yml")

    def load(self, source: str | Path, *, split: str | None = None,
             ids: Iterable[str] | None = None) -> list[WebTask]:
        if str(source) in MINIWOB_SETS:  # built from the vendored pages, not a file
            return list(load_miniwob_tasks(str(source), split=split, ids=ids))
        keep = set(ids) if ids else None
        return [t for t in load_web_tasks(source, split=split)
                if keep is None or t.instance_id in keep]


def _web_teacher(tasks: Sequence[Any], options: HarnessOptions) -> Any:
    from orchard.domains.web.harness import WebTeacherHarness

    return WebTeacherHarness(tasks, solve=options.teacher_solve)


def _browser_agent(tasks: Sequence[Any], options: HarnessOptions) -> Any:
    from orchard.domains.web.harness import BrowserAgentHarness

    return BrowserAgentHarness(*options.require_model("browser-agent"),
                               action_set=options.browser_action_set)


def _miniwob_solver(tasks: Sequence[Any], options: HarnessOptions) -> Any:
    from orchard.domains.web.harness import PolicyBrowserHarness
    from orchard.domains.web.miniwob.solver import solver_policy

    return PolicyBrowserHarness("miniwob-solver", solver_policy())


def _random_browser(tasks: Sequence[Any], options: HarnessOptions) -> Any:
    from orchard.domains.web.harness import PolicyBrowserHarness
    from orchard.domains.web.miniwob.solver import random_policy

    return PolicyBrowserHarness("random-browser", random_policy())


def _validate(client: SandboxClient, task: WebTask) -> Any:
    if isinstance(task, MiniWobTask):
        from orchard.domains.web.miniwob.validate import validate_miniwob

        return validate_miniwob(client, task)
    return validate_web(client, task)


def _row(w: WebTask) -> tuple[str, ...]:
    if isinstance(w, MiniWobTask):  # the page's clock: upstream's, or the rollout's
        return (w.instance_id, w.split or "", f"miniwob ({w.time_limit_ms / 1000:g} s)",
                w.checker.name, w.goal)
    sites = ",".join(w.sites) or ""
    if w.live:  # plainly marked: it needs the internet
        sites = f"LIVE {urlsplit(w.start_url).hostname}" + (f", {sites}" if sites else "")
    return (w.instance_id, w.split or "", sites, w.checker.name, w.goal)


def _demo(agent_config: dict[str, Any]) -> Any:
    from orchard.domains.web.demo import WebFamily

    return WebFamily()


WEB = Domain(
    name="web", task_type=WebTask, source=WebSource(),
    harnesses={"web-teacher": _web_teacher, "browser-agent": _browser_agent,
               "miniwob-solver": _miniwob_solver, "random-browser": _random_browser},
    validate=validate_each(_validate),
    listing=Listing(("instance_id", "split", "sites", "checker", "goal"), _row,
                    frozenset({"gold"})),
    demos={"web": _demo})
