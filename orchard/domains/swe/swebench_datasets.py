"""SWE-bench datasets as task sets: rows in SWE-bench's schema from the Hugging Face Hub by
name (``princeton-nlp/SWE-bench_Verified``), a downloaded copy, or a .jsonl/.json/.parquet
file, each instance run in its swebench instance image and graded by its own eval script.

swebench 5 keeps an instance's test spec in its dataset row: ``eval_script`` (what runs the
tests), ``log_parser`` and ``eval_type`` (how the log is read) and ``image``. A row without an
``image`` gets the name swebench's harness gives it (``ImageSpec.name``:
``<namespace>/sweb.eval.<arch>.<instance_id>:<tag>``, lowercased, ``__`` written ``_1776_``);
the namespace and tag come from ``ORCHARD_SWEBENCH_NAMESPACE`` and ``ORCHARD_SWEBENCH_TAG``.
A namespace that is an absolute directory names OCI layouts in it instead, by swebench's
file-safe name (``<dir>/sweb.eval.<arch>.<instance_id>__<tag>``).
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchard.domains.swe.model import SweTask
from orchard.tasks.protocol import TaskLoadError

NAMESPACE_ENV = "ORCHARD_SWEBENCH_NAMESPACE"
TAG_ENV = "ORCHARD_SWEBENCH_TAG"
# swebench's harness pulls its published images from Docker Hub's swebench namespace.
DEFAULT_NAMESPACE = "swebench"
# `swebench eval`'s default seconds for one instance's eval script.
EVAL_TIMEOUT = 1800
# A Hub dataset id: owner/name, neither part a path, the name not a task file's.
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
_FILE_SUFFIXES = (".json", ".jsonl", ".parquet", ".yaml", ".yml")
# What swebench 5's make_test_spec reads from a row besides SWE-bench's original columns.
SPEC_COLUMNS = ("eval_script", "log_parser", "eval_type")
# SWE-bench's original columns: a row with these and no eval_script is of an older release.
_CLASSIC_COLUMNS = {"repo", "base_commit", "version", "environment_setup_commit"}


@dataclass(frozen=True)
class InstanceImages:
    """How an instance without an ``image`` finds its image: swebench's naming scheme under
    ``namespace`` (a registry path, or an absolute directory of OCI layouts) with ``tag``."""

    namespace: str = DEFAULT_NAMESPACE
    tag: str = "latest"
    arch: str = "amd64"

    @classmethod
    def from_env(cls) -> InstanceImages:
        namespace = os.environ.get(NAMESPACE_ENV, "").strip() or DEFAULT_NAMESPACE
        tag = os.environ.get(TAG_ENV, "").strip() or "latest"
        # swebench names amd64 images x86_64; arm64 ones (built locally) arm64.
        arch = "arm64" if platform.machine().lower() in ("aarch64", "arm64") else "amd64"
        return cls(namespace=namespace.rstrip("/"), tag=tag, arch=arch)

    def name(self, instance_id: str) -> str:
        """The image of ``instance_id``, as swebench's ``ImageSpec`` names it."""
        from swebench.image_builder.image_spec import ImageSpec

        directory = self.namespace.startswith("/")
        # ImageSpec describes a build; only its name is used, so the Dockerfile is a stand-in.
        spec = ImageSpec(instance_id=instance_id, dockerfile="(not built here)",
                         namespace=None if directory else self.namespace, tag=self.tag,
                         arch=self.arch)
        return str(Path(self.namespace) / spec.filesafe_name) if directory else spec.name


def is_swebench_row(row: Mapping[str, Any]) -> bool:
    """Whether a row is a SWE-bench instance with its test spec (swebench 5's schema); an
    Orchard task written out with an empty eval_script is not."""
    return bool(row.get("eval_script"))


def swebench_fields(row: Mapping[str, Any], images: InstanceImages) -> dict[str, Any]:
    """SweTask fields of a SWE-bench row: its repository is /testbed in its instance image,
    the image named by the row or by ``images``; columns SweTask lacks go to ``metadata``."""
    from swebench.image_builder.constants import CONTAINER_WORKDIR

    iid = str(row.get("instance_id", "?"))
    missing = [c for c in ("instance_id", *SPEC_COLUMNS) if not row.get(c)]
    if missing:
        raise TaskLoadError(f"SWE-bench instance {iid} lacks {', '.join(missing)}: swebench's "
                            "make_test_spec needs them to run and read its tests")
    if _assets(row.get("image_assets")):
        raise TaskLoadError(f"SWE-bench instance {iid} has image_assets (binary files its "
                            "tests need, fetched by URL at grading time); Orchard does not "
                            "stage them, so it cannot grade this instance")
    fields: dict[str, Any] = {"metadata": dict(row.get("metadata") or {})}
    for key, value in row.items():
        if key in SweTask.model_fields and key != "metadata":
            fields[key] = value
        elif key != "image_assets":
            fields["metadata"][key] = value
    # Parquet may type these as numbers or timestamps; SWE-bench means the text.
    for key in ("version", "created_at"):
        if key in fields:
            fields[key] = str(fields[key])
    if not fields.get("image"):  # absent, or empty where another row has one
        fields["image"] = images.name(iid)
    fields.setdefault("workdir", CONTAINER_WORKDIR)
    fields.setdefault("test_timeout", EVAL_TIMEOUT)
    return fields


def older_schema_hint(row: Mapping[str, Any]) -> str:
    """Why a row of SWE-bench's original schema (no eval_script) does not load, or ''."""
    if row.keys() >= _CLASSIC_COLUMNS and not is_swebench_row(row):
        return ("it is a SWE-bench row without eval_script: swebench 5 grades an instance by "
                "the eval_script, log_parser and eval_type its row carries and keeps no "
                "per-repository specs to derive them from; use a release of the dataset with "
                "these columns, or add them")
    return ""


def _assets(value: Any) -> bool:
    """Whether an image_assets value (a JSON string on the Hub, a struct in Parquet) names
    any file."""
    if isinstance(value, str):
        return value.strip() not in ("", "{}", "null")
    if isinstance(value, Mapping):
        return any(v for v in value.values())
    return bool(value)


def is_hub_id(name: str) -> bool:
    """Whether ``name`` reads as a Hugging Face dataset id rather than a (mistyped) path."""
    return bool(HUB_ID.match(name)) and not name.lower().endswith(_FILE_SUFFIXES)


def load_hub_dataset(name: str) -> Any:
    """``datasets.load_dataset(name)``: the Hub, or its cache (``HF_HUB_OFFLINE=1`` uses the
    cache alone). A clear TaskLoadError when neither has it."""
    import datasets

    try:
        return datasets.load_dataset(name)
    except (ConnectionError, datasets.exceptions.DatasetNotFoundError) as e:
        raise TaskLoadError(
            f"could not load {name!r} from the Hugging Face Hub or its cache ({e}); no local "
            f"path of that name exists either. Where the Hub is reachable, load it once with "
            "the same HF_HOME (then HF_HUB_OFFLINE=1 reads the cache), or download it (`hf "
            f"download --repo-type dataset {name} --local-dir DIR`) and pass DIR, or pass a "
            ".parquet/.jsonl file of its rows") from e
