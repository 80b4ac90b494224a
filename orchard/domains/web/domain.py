"""The web domain, bundled: goals on self-hosted sites (the bundled set, the live one, YAML
files), the browser agent and the scripted web teacher, validation by the gold run, and the
demo adapter."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from orchard.domains.domain import Domain, HarnessOptions, Listing, validate_each
from orchard.domains.web import WEB_SETS, load_web_tasks, validate_web
from orchard.domains.web.model import WebTask


class WebSource:
    """The bundled ("web") and live ("web-live") sets, and YAML files of web tasks (the
    registry asks the assistant source first: its YAML files seed a ``world:``)."""

    names: Sequence[str] = tuple(WEB_SETS)

    def accepts(self, path: Path) -> bool:
        return path.suffix.lower() in (".yaml", ".yml")

    def load(self, source: str | Path, *, split: str | None = None,
             ids: Iterable[str] | None = None) -> list[WebTask]:
        keep = set(ids) if ids else None
        return [t for t in load_web_tasks(source, split=split)
                if keep is None or t.instance_id in keep]


def _web_teacher(tasks: Sequence[Any], options: HarnessOptions) -> Any:
    from orchard.domains.web.harness import WebTeacherHarness

    return WebTeacherHarness(tasks, solve=options.teacher_solve)


def _browser_agent(tasks: Sequence[Any], options: HarnessOptions) -> Any:
    from orchard.domains.web.harness import BrowserAgentHarness

    return BrowserAgentHarness(*options.require_model("browser-agent"))


def _row(w: WebTask) -> tuple[str, ...]:
    sites = ",".join(w.sites) or ""
    if w.live:  # plainly marked: it needs the internet
        sites = f"LIVE {urlsplit(w.start_url).hostname}" + (f", {sites}" if sites else "")
    return (w.instance_id, w.split or "", sites, w.checker.name, w.goal)


def _demo(agent_config: dict[str, Any]) -> Any:
    from orchard.domains.web.demo import WebFamily

    return WebFamily()


WEB = Domain(
    name="web", task_type=WebTask, source=WebSource(),
    harnesses={"web-teacher": _web_teacher, "browser-agent": _browser_agent},
    validate=validate_each(validate_web),
    listing=Listing(("instance_id", "split", "sites", "checker", "goal"), _row,
                    frozenset({"gold"})),
    demos={"web": _demo})
