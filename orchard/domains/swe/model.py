"""The task model: a SWE-bench instance plus what Orchard needs to run it here.

The SWE-bench fields keep their upstream names and types (``FAIL_TO_PASS`` as a list, though a
JSON string as in the Hugging Face release is accepted too), so a SWE-bench row loads as is
once it names an image and how its repository reaches ``workdir``.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchard.tasks.images import TaskImage
from orchard.tasks.protocol import INSTANCE_ID_PATTERN, SandboxSpec, Submission

if TYPE_CHECKING:
    from orchard.domains.swe.grading import SweGrade
    from orchard.domains.swe.workspace import Workspace
    from orchard.env.client import Sandbox, SandboxClient

DEFAULT_TEST_COMMAND = "python3 -m pytest -rA -p no:cacheprovider"
# Bytecode caches would show up as changes in an agent's `git add -A`.
SANDBOX_ENV = {"PYTHONDONTWRITEBYTECODE": "1"}


class RepoSource(BaseModel):
    """How the repository gets into ``workdir``.

    - ``image``: it is already there in the image.
    - ``dir``: a directory shipped with the task set, copied in.
    - ``tarball``: a .tar/.tar.gz/.tgz shipped with the task set, unpacked into ``workdir``.
    - ``git_bundle``: a ``git bundle`` shipped with the task set, cloned and checked out at
      ``base_commit`` (else the bundle's HEAD).
    - ``files``: the files themselves, inline (generated task sets such as HumanEval).

    Every kind but ``image`` and ``git_bundle`` ends as a fresh git repository with one commit
    of a fixed author and date, so its ``git diff`` is the rollout's patch and the commit id is
    the same on every run.
    """

    model_config = ConfigDict(extra="forbid")

    kind: Literal["image", "dir", "tarball", "git_bundle", "files"] = "image"
    path: str | None = Field(None, description="dir/tarball/git_bundle: absolute, or relative "
                             "to the task file's directory.")
    files: dict[str, str] | None = Field(None, description="files: path in workdir -> text.")

    @model_validator(mode="after")
    def _complete(self) -> RepoSource:
        if self.kind in ("dir", "tarball", "git_bundle") and not self.path:
            raise ValueError(f"a {self.kind!r} repository source needs 'path'")
        if self.kind == "files" and not self.files:
            raise ValueError("a 'files' repository source needs a non-empty 'files' mapping")
        return self

    def resolved(self, base: Path) -> RepoSource:
        """This source with ``path`` made absolute against ``base``."""
        if self.path is None or Path(self.path).is_absolute():
            return self
        return self.model_copy(update={"path": str((base / self.path).resolve())})


class Budget(BaseModel):
    """What one rollout may spend; the sandbox lives at least ``wall_time`` plus grading."""

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(50, gt=0, le=10_000, description="Model calls.")
    wall_time: float = Field(900, gt=0, le=24 * 3600, description="Seconds for the rollout.")
    tokens: int = Field(65_536, gt=0, description="Prompt + completion tokens over the rollout.")


class SweTask(BaseModel):
    """One software-engineering task: SWE-bench's fields, then Orchard's. Its rollouts hand
    in a patch, graded after the rollout in a fresh sandbox (``grading.grade``)."""

    graded_in_rollout: ClassVar[bool] = False

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    instance_id: str = Field(pattern=INSTANCE_ID_PATTERN)
    repo: str = ""
    base_commit: str | None = None
    problem_statement: str = Field(min_length=1)
    patch: str = Field("", description="The gold patch.")
    test_patch: str = ""
    FAIL_TO_PASS: list[str] = Field(default_factory=list)
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    version: str = ""
    environment_setup_commit: str | None = None
    hints_text: str = ""
    created_at: str = ""

    image: TaskImage = Field("host", description="Any image the backend accepts, or "
                             "{build: DIR} to build one from DIR's Dockerfile.")
    source: RepoSource = Field(default_factory=RepoSource)
    workdir: str = "/workspace"
    pre_commands: list[str] = Field(default_factory=list,
                                    description="Run in workdir before the harness starts "
                                    "and before grading (installs, builds).")
    test_command: str = DEFAULT_TEST_COMMAND
    eval_script: str = Field("", description="SWE-bench's eval script (swebench 5 datasets "
                             "carry one per instance): when set, grading runs it instead of "
                             "test_patch + test_command and reads the log with swebench's "
                             "get_eval_report.")
    eval_type: Literal["pass_and_fail", "fail_only"] = Field(
        "pass_and_fail", description="How swebench scores an eval_script's log.")
    test_timeout: float = Field(300, gt=0, le=24 * 3600)
    log_parser: str = Field("parse_log_pytest",
                            description="A parser of swebench's PARSER_REGISTRY.")
    budget: Budget = Field(default_factory=Budget)
    split: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", "pre_commands", mode="before")
    @classmethod
    def _json_list(cls, v: Any) -> Any:
        # SWE-bench on the Hub stores these lists as JSON strings.
        if isinstance(v, str):
            try:
                return json.loads(v) if v.strip() else []
            except json.JSONDecodeError as e:
                raise ValueError(f"expected a list or a JSON list string, got {v[:80]!r}") from e
        return v

    @field_validator("workdir")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"workdir must be an absolute path, not {v!r}")
        return v.rstrip("/") or "/"

    @model_validator(mode="after")
    def _gradable(self) -> SweTask:
        if not self.FAIL_TO_PASS:
            raise ValueError(f"task {self.instance_id}: FAIL_TO_PASS is empty, so no patch "
                             "could ever be told apart from no patch")
        return self

    @property
    def prompt(self) -> str:
        return self.problem_statement

    def sandbox_spec(self) -> SandboxSpec:
        return SandboxSpec(image=self.image, block_network=True, env=SANDBOX_ENV)

    def set_up(self, sandbox: Sandbox) -> Workspace:
        """The repository in ``workdir`` at its base commit, ``pre_commands`` run."""
        from orchard.domains.swe.workspace import prepare_workspace

        return prepare_workspace(sandbox, self)

    def grade(self, client: SandboxClient, submission: Submission, *,
              labels: dict[str, str] | None = None) -> SweGrade:
        """The submission's patch, graded in a fresh sandbox (``grading.grade``)."""
        from orchard.domains.swe.grading import grade

        return grade(client, self, submission.patch, labels=labels)

    def test_files(self) -> set[str]:
        """Files the grading tests live in: the test patch's files and those the test ids
        name. A candidate patch that edits one of them is not graded."""
        files = set(patch_files(self.test_patch))
        for test in (*self.FAIL_TO_PASS, *self.PASS_TO_PASS):
            head = test.split("::", 1)[0]
            if "::" in test and head.endswith(".py"):
                files.add(head)
        return files


_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
_PLAIN_HEADER = re.compile(r"^(?:---|\+\+\+) (?:[ab]/)?(\S+)", re.MULTILINE)


def patch_files(patch: str) -> list[str]:
    """Paths a unified diff touches (git's or plain), both sides of a rename, in order."""
    found: list[str] = []
    for a, b in _DIFF_HEADER.findall(patch):
        found += [a, b]
    if not found:
        found = _PLAIN_HEADER.findall(patch)
    return list(dict.fromkeys(p for p in found if p != "/dev/null"))


def file_diff(path: str, old: str | None, new: str) -> str:
    """A git-style diff that turns ``old`` (None: no file) into ``new`` at ``path``."""
    header = f"diff --git a/{path} b/{path}\n"
    if old is None:
        header += "new file mode 100644\n"
    body = difflib.unified_diff((old or "").splitlines(keepends=True),
                                new.splitlines(keepends=True),
                                "/dev/null" if old is None else f"a/{path}", f"b/{path}")
    return header + "".join(body)
