"""Put a task's repository into a sandbox: one upload and one exec for every source kind.

The repository arrives as an archive (built here from a ``dir`` or ``files`` source, or the
task set's own tarball or git bundle) and one shell script unpacks it, makes it a git
repository at a fixed commit when it is not one, and runs the task's ``pre_commands``. Both
the rollout's sandbox and the grader's fresh sandbox are prepared this way, so they start
from the same tree.
"""

from __future__ import annotations

import io
import shlex
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from orchard.domains.swe.model import SweTask
from orchard.env.client import Sandbox, SandboxClient
from orchard.tasks.protocol import TaskSetupError

UPLOAD_PATH = "/tmp/.orchard-task-repo"
# A fixed identity and date: the base commit of a shipped tree is the same on every run.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "orchard", "GIT_AUTHOR_EMAIL": "orchard@localhost",
    "GIT_COMMITTER_NAME": "orchard", "GIT_COMMITTER_EMAIL": "orchard@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}
_SKIP_NAMES = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


@dataclass
class Workspace:
    base_commit: str
    seconds: float


def open_task_sandbox(client: SandboxClient, task: SweTask, *, labels: dict[str, str],
                      session: str | None = None, ttl: float | None = None,
                      cpu: str | None = None, memory: str | None = None,
                      model_proxy: bool = False, startup_timeout: float = 120.0) -> Sandbox:
    """A sandbox from the task's image, network blocked, not yet prepared."""
    spec = task.sandbox_spec()
    return client.create_sandbox(
        spec.image, block_network=spec.block_network, cpu=cpu, memory=memory, ttl=ttl,
        labels=labels, env=spec.env, session=session, model_proxy=model_proxy,
        timeout=startup_timeout)


def repo_archive(task: SweTask) -> bytes | Path | None:
    """What to upload: an in-memory tar.gz, the task set's file, or None (in the image)."""
    src = task.source
    if src.kind == "image":
        return None
    if src.kind in ("tarball", "git_bundle"):
        assert src.path is not None
        path = Path(src.path)
        if not path.is_file():
            raise TaskSetupError(f"task {task.instance_id}: its {src.kind} {path} does not "
                                 "exist; the task set is incomplete or was moved")
        return path
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        if src.kind == "files":
            assert src.files is not None
            for name, text in sorted(src.files.items()):
                data = text.encode()
                info = tarfile.TarInfo(name.lstrip("/"))
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
        else:
            assert src.path is not None
            root = Path(src.path)
            if not root.is_dir():
                raise TaskSetupError(f"task {task.instance_id}: its repository directory "
                                     f"{root} does not exist; the task set is incomplete")
            for path in sorted(root.rglob("*")):
                rel = path.relative_to(root)
                if _SKIP_NAMES & set(rel.parts) or path.suffix == ".pyc":
                    continue
                tar.add(path, arcname=str(rel), recursive=False)
    return buf.getvalue()


def _script(task: SweTask) -> str:
    w = shlex.quote(task.workdir)
    kind = task.source.kind
    lines = ["set -e"]
    if kind == "git_bundle":
        checkout = shlex.quote(task.base_commit) if task.base_commit else "HEAD"
        # Cloned beside the workdir, whose directory may be a mount point and is our cwd.
        lines += [f"mkdir -p {w}", "rm -rf /tmp/.orchard-clone",
                  f"git clone -q --no-checkout {UPLOAD_PATH} /tmp/.orchard-clone",
                  f"mv /tmp/.orchard-clone/.git {w}/.git", "rm -rf /tmp/.orchard-clone",
                  f"cd {w}", f"git -c advice.detachedHead=false checkout -q -f {checkout}"]
    else:
        lines += [f"mkdir -p {w}", f"cd {w}"]
        if kind != "image":
            lines.append(f"tar -xf {UPLOAD_PATH} -C {w}")
        # A tree without history gets one commit, so `git diff` is the rollout's change.
        lines += ["if [ ! -d .git ]; then git init -q && git add -A && "
                  "git commit -q --no-verify -m base; fi"]
    if kind != "image":
        lines.append(f"rm -f {UPLOAD_PATH}")
    lines.append("git rev-parse HEAD")
    return "\n".join(lines) + "\n"


def prepare_workspace(sandbox: Sandbox, task: SweTask) -> Workspace:
    """Unpack the repository into ``task.workdir`` and run ``pre_commands``."""
    start = time.monotonic()
    archive = repo_archive(task)
    if archive is not None:
        sandbox.upload_file([archive] if isinstance(archive, bytes) else archive, UPLOAD_PATH)
    job = sandbox.exec(["/bin/sh", "-c", _script(task)], timeout=300, env=GIT_ENV)
    if not job.ok:
        raise TaskSetupError(
            f"task {task.instance_id}: could not put its repository into {task.workdir} "
            f"(exit {job.exit_code}{', timed out' if job.timed_out else ''}): "
            f"{(job.stderr or job.stdout)[-1500:]}")
    base = job.stdout.strip().splitlines()[-1] if job.stdout.strip() else ""
    for command in task.pre_commands:
        done = sandbox.exec(command, cwd=task.workdir, timeout=task.test_timeout)
        if not done.ok:
            raise TaskSetupError(
                f"task {task.instance_id}: pre_command {command!r} failed (exit "
                f"{done.exit_code}{', timed out' if done.timed_out else ''}); its output "
                f"ends:\n{(done.stdout + done.stderr)[-1500:]}")
    return Workspace(base_commit=base, seconds=time.monotonic() - start)


PATCH_LIMIT = 8 << 20


class PatchUnreadable(RuntimeError):
    """The workspace's diff could not be read; the message says why."""


def workspace_patch(sandbox: Sandbox, task: SweTask, base: str = "HEAD") -> str:
    """Everything changed in ``task.workdir`` since ``base``, new files included."""
    job = sandbox.exec(f"git add -A && git diff --cached --binary {shlex.quote(base)}",
                       cwd=task.workdir, timeout=120, max_output_bytes=PATCH_LIMIT)
    if not job.ok or job.stdout_dropped:
        raise PatchUnreadable(
            f"could not read the patch from sandbox {sandbox.id}: "
            + (f"it is over {PATCH_LIMIT} bytes" if job.stdout_dropped
               else f"git exited {job.exit_code}: {job.stderr[-500:]}"))
    return job.stdout
