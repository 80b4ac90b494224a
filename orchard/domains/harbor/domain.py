"""The Harbor domain, bundled: Harbor task directories and datasets as a task source, the
oracle harness, validation by the oracle solution, and the listing."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from orchard.domains.domain import Domain, HarnessOptions, Listing, validate_each
from orchard.domains.harbor import load_harbor_tasks, task_dirs, validate_harbor
from orchard.domains.harbor.task import HarborTask


class HarborSource:
    """A Harbor task directory (one with task.toml) or dataset directory (task directories
    side by side); no named sets."""

    names: Sequence[str] = ()

    def accepts(self, path: Path) -> bool:
        return path.is_dir() and bool(task_dirs(path))

    def load(self, source: str | Path, *, split: str | None = None,
             ids: Iterable[str] | None = None) -> list[HarborTask]:
        # Harbor datasets have no splits: a split asked for keeps none.
        return [t for t in load_harbor_tasks(source, ids=ids) if split in (None, t.split)]


def _oracle(tasks: Sequence[Any], options: HarnessOptions) -> Any:
    from orchard.domains.harbor.harness import HarborOracleHarness

    return HarborOracleHarness()


def _row(t: HarborTask) -> tuple[str, ...]:
    first_line = t.instruction.strip().splitlines()[0] if t.instruction.strip() else ""
    return (t.instance_id, t.image + (" (Dockerfile)" if t.build else ""), t.network_mode,
            first_line[:80])


HARBOR = Domain(
    name="harbor", task_type=HarborTask, source=HarborSource(),
    harnesses={"harbor-oracle": _oracle},
    validate=validate_each(validate_harbor),
    listing=Listing(("instance_id", "image", "network", "instruction"), _row,
                    frozenset({"instruction"})),
    demos={})
