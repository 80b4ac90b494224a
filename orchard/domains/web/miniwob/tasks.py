"""MiniWoB++ tasks: one web task per (page, seed), served in the sandbox from the vendored pages.

The task sets are built from the pages themselves, not from a file: every page of
``pages/miniwob/`` (the upstream repository's ``miniwob/html/miniwob``), with seeds 0 and 1 in
the train split (data mode ``train``, upstream's default) and seed 2 in the test split (data
mode ``test``; the few pages that read the mode draw from their test distribution).

- ``miniwob``: upstream's time limits. Each page's episode runs for its own
  ``core.EPISODE_MAX_TIME`` (10 s unless the page sets another), and the page scales a
  positive reward by the time left, as upstream does.
- ``miniwob-untimed``: the same pages and seeds with the episode clock set to the rollout's
  wall time, for agents that think between actions (a model), the way harnesses for LLM agents
  commonly run MiniWoB++. Success is the same in both: the page's raw reward is 1.

The instruction is drawn by the page's JavaScript from the seed, so it is not known before the
page runs. The goal says where to read it (the page's first line, the ``#query`` box), the agent
reads it there, and the server records the page's own words with the reward (the grade's
reason quotes them).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from orchard.domains.web.model import SITE_PORTS, Checker, GoldStep, WebBudget, WebTask
from orchard.tasks.protocol import TaskLoadError

if TYPE_CHECKING:
    from orchard.env.client import Sandbox

PAGES = Path(__file__).resolve().parent / "pages"
UPSTREAM_TIME_LIMIT_MS = 10_000  # core.EPISODE_MAX_TIME in core.js
SEEDS = {0: "train", 1: "train", 2: "test"}
MINIWOB_SETS = ("miniwob", "miniwob-untimed")
_LIMIT = re.compile(r"core\.EPISODE_MAX_TIME\s*=\s*(\d+)")


class MiniWobTask(WebTask):
    """A MiniWoB++ page with a seed: the page draws its problem from the seed, and its own
    JavaScript judges the episode (``checkers.miniwob_reward`` reads what it reported)."""

    page: str = Field(description="The page's name, e.g. click-button.")
    seed: int
    mode: Literal["train", "test"] = "train"
    time_limit_ms: int = Field(gt=0, description="The episode clock the page runs.")
    upstream_time_limit_ms: int = Field(gt=0, description="The page's own limit.")
    gold: list[GoldStep] = Field(default_factory=list,
                                 description="None: the scripted solver reads the page.")

    def set_up(self, sandbox: Sandbox) -> None:
        """Serve the vendored pages in the sandbox, with a fresh episode."""
        from orchard.domains.web.miniwob.environment import start_miniwob

        start_miniwob(sandbox)

    def url(self, *, time_limit_ms: int | None = None) -> str:
        """The page's URL in the sandbox, on another clock when given."""
        return page_url(self.page, self.seed, self.mode, time_limit_ms or self.time_limit_ms)


def page_url(page: str, seed: int, mode: str, time_limit_ms: int) -> str:
    """A page's URL in the sandbox, with its seed, data mode and clock."""
    return (f"http://127.0.0.1:{SITE_PORTS['miniwob']}/miniwob/{page}.html"
            f"?seed={seed}&mode={mode}&limit={time_limit_ms}")


@cache
def page_names() -> tuple[str, ...]:
    """Every vendored task page, by name."""
    names = tuple(sorted(p.stem for p in (PAGES / "miniwob").glob("*.html")))
    if not names:
        raise TaskLoadError(f"no MiniWoB++ pages under {PAGES / 'miniwob'}: the package data "
                            "is missing; reinstall orchard")
    return names


def upstream_time_limit_ms(page: str) -> int:
    """The episode time the page sets for itself, or core.js's default."""
    found = _LIMIT.search((PAGES / "miniwob" / f"{page}.html").read_text())
    return int(found.group(1)) if found else UPSTREAM_TIME_LIMIT_MS


def miniwob_task(page: str, seed: int, *, timed: bool = True,
                 split: str | None = None) -> MiniWobTask:
    """The task of one page and seed (``timed``: upstream's clock; else the wall time's)."""
    if page not in page_names():
        raise TaskLoadError(f"no MiniWoB++ page {page!r}; `orchard tasks list miniwob` lists "
                            f"the {len(page_names())} pages")
    upstream = upstream_time_limit_ms(page)
    budget = WebBudget(steps=30 if timed else 40, wall_time=300, action_timeout=15)
    limit = upstream if timed else int(budget.wall_time * 1000)
    split = split or SEEDS.get(seed, "train")
    prefix = "miniwob" if timed else "miniwob-untimed"
    mode = "test" if split == "test" else "train"
    return MiniWobTask(
        instance_id=f"{prefix}.{page}.{seed}", page=page, seed=seed, mode=mode,
        time_limit_ms=limit,
        upstream_time_limit_ms=upstream, sites=["miniwob"], split=split, budget=budget,
        goal=(f"MiniWoB++ task {page}: do what the instruction at the top of the page says "
              f"(the first text on the page), within {limit / 1000:g} seconds."),
        start_url=page_url(page, seed, mode, limit),
        checker=Checker(name="miniwob_reward", args={"page": page}),
        metadata={"benchmark": "miniwob++", "timed": timed})


def load_miniwob_tasks(name: str = "miniwob", *, split: str | None = None,
                       ids: Any = None) -> list[MiniWobTask]:
    """A MiniWoB++ set (``miniwob`` or ``miniwob-untimed``), of ``split`` and ``ids`` when
    given; an id that names no task is a TaskLoadError that says how ids look."""
    if name not in MINIWOB_SETS:
        raise TaskLoadError(f"no MiniWoB++ set {name!r}; one of {', '.join(MINIWOB_SETS)}")
    tasks = [miniwob_task(p, s, timed=name == "miniwob") for p in page_names() for s in SEEDS]
    if ids:
        wanted = set(ids)
        unknown = sorted(wanted - {t.instance_id for t in tasks})
        if unknown:
            raise TaskLoadError(f"no task {unknown[0]!r} in {name}: ids are "
                                f"{name}.<page>.<seed>, e.g. {tasks[0].instance_id}, with "
                                f"seeds {sorted(SEEDS)}")
        tasks = [t for t in tasks if t.instance_id in wanted]
    return [t for t in tasks if split is None or t.split == split]
