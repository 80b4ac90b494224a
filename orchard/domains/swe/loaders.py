"""Task sets from files: JSON, JSONL, Parquet, Hugging Face datasets saved with
``save_to_disk`` or downloaded as data files, task directories (the bundled set's format), the
named sets ``bundled``, ``humaneval``, ``settings`` and ``bugfix``, and Hugging Face Hub
datasets by id (``princeton-nlp/SWE-bench_Verified``).

A task directory holds ``task.yaml`` (the task's fields), ``repo/`` (the repository at its base
state), ``gold.patch`` and ``test.patch``. Row formats accept Orchard's flat rows, the nested
``{problem_statement, patch, metadata: {...}}`` rows of the reference pipeline, and SWE-bench
instances with their test spec (``swebench_datasets``: run in their instance images).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from orchard.domains.swe.bundled_data import bundled_dir
from orchard.domains.swe.model import RepoSource, SweTask
from orchard.domains.swe.swebench_datasets import (
    InstanceImages,
    is_hub_id,
    is_swebench_row,
    load_hub_dataset,
    older_schema_hint,
    swebench_fields,
)
from orchard.tasks.images import ImageBuild
from orchard.tasks.protocol import TaskLoadError

NAMED_SETS = ("bundled", "humaneval", "settings", "bugfix")
# The reference pipeline's metadata names for SweTask fields.
_ALIASES = {"image_url": "image"}


def load_tasks(source: str | Path | None = None, *, split: str | None = None,
               ids: Iterable[str] | None = None) -> list[SweTask]:
    """Load a task set: ``None`` or ``"bundled"`` (the set shipped with Orchard),
    ``"humaneval"``, ``"settings"`` (the generated family of the tiny-model demo), ``"bugfix"``
    (the generated family whose fixes must be read in the sandbox), a path (.json, .jsonl,
    .parquet, a saved or downloaded dataset, a task directory or a directory of them), or a
    Hugging Face Hub dataset id of SWE-bench instances.
    ``split`` keeps tasks of that split (a saved DatasetDict is split by its own keys); ``ids``
    keeps those instance ids, in the set's order."""
    name = str(source) if source is not None else "bundled"
    if name == "bundled":
        tasks = _load_task_dirs(bundled_dir())
    elif name == "humaneval":
        from orchard.domains.swe.humaneval import humaneval_tasks

        tasks = humaneval_tasks()
    elif name == "settings":
        from orchard.domains.swe.family import settings_family

        tasks = settings_family()
    elif name == "bugfix":
        from orchard.domains.swe.bugfix_family import bugfix_family

        tasks = bugfix_family()
    else:
        path = Path(name).expanduser()
        if path.exists():
            tasks = _load_path(path, split)
        elif is_hub_id(name):
            tasks = _dataset_tasks(load_hub_dataset(name), split, Path.cwd(), name)
        else:
            raise TaskLoadError(f"no task set at {path}: give a .json, .jsonl or .parquet "
                                f"file, a directory, a Hugging Face dataset id (owner/name), "
                                f"or one of {', '.join(NAMED_SETS)}")
    if split is not None:
        known = {t.split for t in tasks}
        tasks = [t for t in tasks if t.split == split]
        if not tasks:
            raise TaskLoadError(f"no task of split {split!r} in {name}; its splits are "
                                f"{sorted(str(s) for s in known)}")
    if ids is not None:
        wanted = list(dict.fromkeys(ids))
        by_id = {t.instance_id: t for t in tasks}
        missing = [i for i in wanted if i not in by_id]
        if missing:
            raise TaskLoadError(f"{name} has no task {', '.join(missing[:5])}; list them with "
                                "`orchard tasks list`")
        keep = set(wanted)
        tasks = [t for t in tasks if t.instance_id in keep]
    seen: set[str] = set()
    for t in tasks:
        if t.instance_id in seen:
            raise TaskLoadError(f"{name}: instance_id {t.instance_id!r} appears twice")
        seen.add(t.instance_id)
    return tasks


def _load_path(path: Path, split: str | None) -> list[SweTask]:
    if path.is_dir():
        if (path / "task.yaml").is_file() or any(path.glob("*/task.yaml")):
            return _load_task_dirs(path)
        return _load_saved_dataset(path, split)
    suffix = path.suffix.lower()
    base = path.parent
    if suffix == ".jsonl":
        rows = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise TaskLoadError(f"{path}:{n}: not a JSON object ({e.msg})") from e
        return task_rows(rows, base, str(path))
    if suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise TaskLoadError(f"{path}: not JSON ({e})") from e
        if isinstance(data, dict) and isinstance(data.get("tasks"), list):
            data = data["tasks"]
        if not isinstance(data, list):
            raise TaskLoadError(f"{path}: expected a list of tasks or {{\"tasks\": [...]}}")
        return task_rows(data, base, str(path))
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return task_rows(pq.read_table(path).to_pylist(), base, str(path))
    raise TaskLoadError(f"{path}: unknown task file type {suffix!r}; use .json, .jsonl, "
                        ".parquet or a directory")


def _load_saved_dataset(path: Path, split: str | None) -> list[SweTask]:
    """A dataset saved with ``save_to_disk``, or a directory of data files as the Hub holds
    them (a downloaded copy): ``datasets.load_dataset`` reads those as it reads the Hub."""
    import datasets

    saved = any((path / f).is_file() for f in ("dataset_dict.json", "dataset_info.json",
                                               "state.json"))
    try:
        ds = datasets.load_from_disk(str(path)) if saved else datasets.load_dataset(str(path))
    except (FileNotFoundError, ValueError, datasets.exceptions.DatasetNotFoundError) as e:
        raise TaskLoadError(f"{path} is neither a task directory (*/task.yaml), a dataset "
                            f"saved with save_to_disk, nor a directory of data files: {e}"
                            ) from e
    return _dataset_tasks(ds, split, path, str(path))


def _dataset_tasks(ds: Any, split: str | None, base: Path, where: str) -> list[SweTask]:
    """Tasks of a ``datasets`` Dataset, or of a DatasetDict's splits (``split``, else all)."""
    import datasets

    if isinstance(ds, datasets.DatasetDict):
        if split is not None and split not in ds:
            raise TaskLoadError(f"{where} has splits {sorted(ds)}, not {split!r}")
        parts = [split] if split is not None else list(ds)
        tasks = []
        for part in parts:
            tasks += [t if t.split else t.model_copy(update={"split": part})
                      for t in task_rows(ds[part].to_list(), base, f"{where}[{part}]")]
        return tasks
    return task_rows(ds.to_list(), base, where)


def task_rows(rows: Iterable[Mapping[str, Any]], base: Path, where: str) -> list[SweTask]:
    """Tasks from rows; a relative ``source.path`` is resolved against ``base`` (a task
    file's directory, or a saved dataset's own directory). A SWE-bench instance row gets its
    instance image (``swebench_datasets``)."""
    tasks = []
    images: InstanceImages | None = None
    for n, row in enumerate(rows, 1):
        if not isinstance(row, Mapping):
            raise TaskLoadError(f"{where}: row {n} is not an object")
        fields = _flatten(row)
        if is_swebench_row(fields):
            images = images or InstanceImages.from_env()
            try:
                fields = swebench_fields(fields, images)
            except TaskLoadError as e:
                raise TaskLoadError(f"{where}: row {n}: {e}") from e
        try:
            task = SweTask.model_validate(fields)
        except ValidationError as e:
            hint = older_schema_hint(fields)
            raise TaskLoadError(f"{where}: row {n} ({row.get('instance_id', '?')}) is not a "
                                f"valid task{': ' + hint if hint else ''}:\n{_explain(e)}"
                                ) from e
        image = task.image.resolved(base) if isinstance(task.image, ImageBuild) else task.image
        tasks.append(task.model_copy(update={"source": task.source.resolved(base),
                                             "image": image}))
    return tasks


def _flatten(row: Mapping[str, Any]) -> dict[str, Any]:
    """A reference-pipeline row ``{problem_statement, patch, metadata: {...}}`` as flat
    fields; metadata keys that are not SweTask fields stay in ``metadata``."""
    out = {k: v for k, v in row.items() if v is not None}
    if isinstance(out.get("source"), str):
        with contextlib.suppress(json.JSONDecodeError):
            out["source"] = json.loads(out["source"])
    source = out.get("source")
    if isinstance(source, Mapping) and isinstance(source.get("files"), Mapping):
        # Arrow (Parquet, datasets) stores a mapping as a struct of every row's keys, filling
        # the keys a row lacks with None: those are not files of this row.
        out["source"] = {**source, "files": {k: v for k, v in source["files"].items()
                                             if v is not None}}
    meta = out.get("metadata")
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except json.JSONDecodeError:
            meta = None
    if isinstance(meta, Mapping):
        meta = {k: v for k, v in meta.items() if v is not None}
    if isinstance(meta, Mapping):
        rest = {}
        for k, v in meta.items():
            field = _ALIASES.get(k, k)
            if field in SweTask.model_fields and field != "metadata":
                out.setdefault(field, v)
            else:
                rest[k] = v
        out["metadata"] = rest
    return out


def _explain(e: ValidationError) -> str:
    return "\n".join(f"  {'.'.join(str(p) for p in err['loc']) or '(row)'}: {err['msg']}"
                     for err in e.errors())


def _load_task_dirs(root: Path) -> list[SweTask]:
    dirs = [root] if (root / "task.yaml").is_file() else sorted(
        p.parent for p in root.glob("*/task.yaml"))
    if not dirs:
        raise TaskLoadError(f"no task directories (*/task.yaml) under {root}")
    return [load_task_dir(d) for d in dirs]


def load_task_dir(d: Path) -> SweTask:
    """One task directory: ``task.yaml``, ``repo/``, ``gold.patch``, ``test.patch``."""
    try:
        fields = yaml.safe_load((d / "task.yaml").read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise TaskLoadError(f"{d / 'task.yaml'}: not valid YAML ({e})") from e
    if not isinstance(fields, dict):
        raise TaskLoadError(f"{d / 'task.yaml'}: expected a mapping of task fields")
    for key, name in (("patch", "gold.patch"), ("test_patch", "test.patch")):
        if (d / name).is_file():
            fields.setdefault(key, (d / name).read_text(encoding="utf-8"))
    if (d / "repo").is_dir():
        fields.setdefault("source", RepoSource(kind="dir", path="repo").model_dump())
    # Not a SweTask field, but what a reader of the set wants to filter on.
    if "bug_kind" in fields:
        fields.setdefault("metadata", {})["bug_kind"] = fields.pop("bug_kind")
    return task_rows([fields], d, str(d / "task.yaml"))[0]
