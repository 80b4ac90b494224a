"""Dockerfile builds against the session orchestrator, with real sandboxes: what a sandbox of
the built image sees, the step cache, failures, the CLI and `image: {build: DIR}` in a task.

FROM is a busybox rootfs in pytest's temp dir (an image path the session allows). Every test
writes its own marker into its Dockerfile, so no test finds another's steps in the cache.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard.env.build import (
    BuildError,
    StepFailed,
    build_image,
    list_built_images,
    prune_build_cache,
    remove_built_image,
)
from orchard.env.build_schema import BUILD_LABEL
from orchard.env.client import SandboxClient
from tests.conftest import needs_root
from tests.image_fixtures import make_busybox_rootfs

pytestmark = [needs_root, pytest.mark.root]


@pytest.fixture(scope="module")
def busybox(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(make_busybox_rootfs(tmp_path_factory.mktemp("build-base") / "rootfs"))


@pytest.fixture()
def client(orchestrator: str) -> Iterator[SandboxClient]:
    with SandboxClient(orchestrator) as c:
        yield c


def context(tmp_path: Path, dockerfile: str, files: dict[str, str] | None = None) -> Path:
    root = tmp_path / f"ctx-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    (root / "Dockerfile").write_text(dockerfile)
    for name, text in (files or {}).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def build_sandboxes(client: SandboxClient) -> list[str]:
    return [sb.id for sb in client.list_sandboxes(labels={BUILD_LABEL: "sandbox"})
            if sb.info.status.value in ("pending", "running", "paused")]


def test_a_built_image_has_the_files_env_and_workdir(client: SandboxClient, busybox: str,
                                                     tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    ctx = context(tmp_path, f"""\
ARG BASE
FROM $BASE
ARG GREETING=hello
ENV APP_HOME=/app \\
    MODE="two words"
WORKDIR $APP_HOME
COPY src/ ./src/
COPY --chown=7:8 --chmod=600 notes.txt /etc/notes.txt
RUN echo "$GREETING $MODE {marker}" > greeting.txt
ENV AFTER=${{GREETING:-none}}
USER 1000
CMD ["sh", "-c", "echo hi"]
""", {"src/a.txt": "from the context\n", "src/deep/b.txt": "b\n", "src/debug.log": "no\n",
      "notes.txt": "secret\n", ".dockerignore": "src/*.log\n"})
    image = build_image(client, ctx, tag=f"test/files:{marker[:8]}",
                        build_args={"BASE": busybox, "GREETING": "hi"})
    assert image.name == f"test/files:{marker[:8]}"
    assert [s.cached for s in image.steps] == [False] * 4  # WORKDIR, COPY, COPY, RUN
    assert image.config.env == {"APP_HOME": "/app", "MODE": "two words", "AFTER": "hi"}
    assert image.config.workdir == "/app" and image.config.user == "1000"
    assert image.config.cmd == ["sh", "-c", "echo hi"]
    # USER came after the last RUN; the owner --chown names cannot be given (no CAP_CHOWN).
    assert not any("RUN runs as root" in w for w in image.warnings)
    assert any("line 8: --chown=7:8 is not applied" in w for w in image.warnings)
    with client.create_sandbox(image.name) as sb:
        assert sb.info.workdir == "/app" and sb.info.env["MODE"] == "two words"
        r = sb.exec('pwd; cat greeting.txt src/a.txt src/deep/b.txt; echo "$AFTER|$MODE"; '
                    "ls src; stat -c '%u:%g %a' /etc/notes.txt")
        assert r.exit_code == 0, r.stderr
        assert r.stdout.splitlines() == [
            "/app", f"hi two words {marker}", "from the context", "b", "hi|two words",
            "a.txt", "deep", "0:0 600"]
        # The image's env is a default: what the create asks for wins.
    with client.create_sandbox(image.name, env={"MODE": "mine"}, workdir="/") as sb:
        assert sb.exec('pwd; echo "$MODE $APP_HOME"').stdout == "/\nmine /app\n"


def test_the_second_build_runs_nothing(client: SandboxClient, busybox: str,
                                       tmp_path: Path) -> None:
    ctx = context(tmp_path, f"""\
FROM {busybox}
RUN echo {uuid.uuid4().hex} > /id && cat /proc/sys/kernel/random/uuid > /ran
COPY f.txt /f.txt
RUN cat /proc/sys/kernel/random/uuid > /ran2
""", {"f.txt": "one\n"})
    first = build_image(client, ctx, tag="test/cache")
    assert (first.cached_steps, first.run_steps) == (0, 3)
    second = build_image(client, ctx, tag="test/cache")
    assert (second.cached_steps, second.run_steps) == (3, 0)
    assert second.snapshot_id == first.snapshot_id
    with client.create_sandbox("test/cache") as sb:
        ran_first = sb.exec("cat /ran /ran2").stdout
    # Had a RUN run again, it would have drawn new uuids.
    (ctx / "f.txt").write_text("two\n")
    third = build_image(client, ctx, tag="test/cache")
    assert [s.cached for s in third.steps] == [True, False, False]
    with client.create_sandbox("test/cache") as sb:
        ran_third = sb.exec("cat /ran /ran2; cat /f.txt").stdout.splitlines()
    assert ran_third[0] == ran_first.splitlines()[0]  # the RUN before the COPY: cached
    assert ran_third[1] != ran_first.splitlines()[1]  # the RUN after it: ran again
    assert ran_third[2] == "two"
    assert build_sandboxes(client) == []


def test_a_failing_run_reports_its_exit_code_and_output(client: SandboxClient, busybox: str,
                                                        tmp_path: Path) -> None:
    ctx = context(tmp_path, f"""\
FROM {busybox}
RUN echo fine-{uuid.uuid4().hex}
RUN echo to-stdout; echo to-stderr >&2; exit 3
RUN echo never
""")
    with pytest.raises(StepFailed) as failed:
        build_image(client, ctx)
    assert failed.value.exit_code == 3
    assert "to-stdout" in failed.value.output and "to-stderr" in failed.value.output
    assert "line 3 (RUN echo to-stdout" in str(failed.value)
    assert build_sandboxes(client) == []  # the sandbox it failed in is gone


@pytest.mark.parametrize(("dockerfile", "needle"), [
    ("FROM {base}\nADD https://example.invalid/x.tar /x\n", "line 2 (ADD https://"),
    ("FROM {base}\nCOPY --from=builder /a /b\n", "line 2 (COPY --from=builder"),
    ("FROM {base}\nCOPY ../outside /x\n", "outside the build context"),
    ("FROM {base}\nCOPY missing.txt /x\n", "matches no file"),
    ("FROM {base}\nRUN --mount=type=cache,target=/c true\n", "RUN --mount is not supported"),
])
def test_what_a_build_refuses_names_itself_and_its_line(client: SandboxClient, busybox: str,
                                                        tmp_path: Path, dockerfile: str,
                                                        needle: str) -> None:
    ctx = context(tmp_path, dockerfile.format(base=busybox))
    with pytest.raises(BuildError, match="Dockerfile") as refused:
        build_image(client, ctx)
    assert needle in str(refused.value)
    assert build_sandboxes(client) == []


def test_from_a_built_image_add_of_an_archive_and_run_without_network(
        client: SandboxClient, busybox: str, tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    base = build_image(client, context(tmp_path, f"""\
FROM {busybox}
ENV BASE_VAR={marker}
WORKDIR /srv
RUN cat /proc/net/dev > /net-blocked
"""), tag="test/base")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"unpacked\n"
        info = tarfile.TarInfo("pkg/inside.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    ctx = context(tmp_path, "FROM test/base\nADD bundle.tar.gz ./\nRUN cat pkg/inside.txt\n")
    (ctx / "bundle.tar.gz").write_bytes(buf.getvalue())
    child = build_image(client, ctx, tag="test/child")
    assert child.config.env == {"BASE_VAR": marker} and child.config.workdir == "/srv"
    with client.create_sandbox("test/child") as sb:
        r = sb.exec("cat /srv/pkg/inside.txt; echo $BASE_VAR; cat /net-blocked")
    lines = r.stdout.splitlines()
    assert lines[:2] == ["unpacked", marker]
    interfaces = {line.split(":")[0].strip() for line in lines[2:] if ":" in line}
    assert interfaces == {"lo"}, r.stdout  # RUN had no network: loopback only
    assert base.snapshot_id != child.snapshot_id


def test_built_images_are_listed_removed_and_pruned(client: SandboxClient, busybox: str,
                                                   tmp_path: Path) -> None:
    ctx = context(tmp_path, f"FROM {busybox}\nRUN echo {uuid.uuid4().hex} > /x\n")
    image = build_image(client, ctx, tag="test/removed:1")
    assert list_built_images(client)["test/removed:1"].snapshot_id == image.snapshot_id
    snap = client.get_snapshot(image.snapshot_id)
    assert snap.expires_at is None  # kept until removed
    assert remove_built_image(client, "test/removed:1")
    assert "test/removed:1" not in list_built_images(client)
    assert prune_build_cache(client) >= 1
    assert all(s.snapshot_id != image.snapshot_id for s in client.list_snapshots())
    assert not remove_built_image(client, "test/removed:1")


def test_orchard_image_build_cli(orchestrator: str, busybox: str, tmp_path: Path) -> None:
    ctx = context(tmp_path, f"FROM {busybox}\nRUN echo built-by-the-cli-{uuid.uuid4().hex}\n")
    env = {**os.environ, "ORCHARD_URL": orchestrator}
    cmd = [sys.executable, "-m", "orchard", "image", "build", "-t", "test/cli", str(ctx)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "test/cli:latest\n"  # the name alone on stdout
    assert "built-by-the-cli" in r.stderr and "1 steps, 0 cached" in r.stderr
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 0 and "1 steps, 1 cached" in again.stderr, again.stderr
    (ctx / "Dockerfile").write_text(f"FROM {busybox}\nRUN exit 7\n")
    failed = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    assert "error: Dockerfile line 2 (RUN exit 7) exited with code 7" in failed.stderr
    ls = subprocess.run([*cmd[:3], "image", "ls"], capture_output=True, text=True, env=env,
                        timeout=120)
    assert ls.returncode == 0 and "test/cli:latest" in ls.stdout, (ls.stdout, ls.stderr)
    rm = subprocess.run([*cmd[:3], "image", "rm", "test/cli:latest"], capture_output=True,
                        text=True, env=env, timeout=120)
    assert rm.returncode == 0 and rm.stdout == "untagged test/cli:latest\n", rm.stderr
    ls = subprocess.run([*cmd[:3], "image", "ls"], capture_output=True, text=True, env=env,
                        timeout=120)
    assert "test/cli:latest" not in ls.stdout
    prune = subprocess.run([*cmd[:3], "image", "prune"], capture_output=True, text=True,
                           env=env, timeout=120)
    assert prune.returncode == 0 and "build steps" in prune.stderr, prune.stderr
    assert int(prune.stderr.split("removed ")[-1].split()[0]) >= 1, prune.stderr


def test_a_task_with_image_build(client: SandboxClient, busybox: str, tmp_path: Path) -> None:
    from orchard.domains.swe.loaders import load_task_dir
    from orchard.domains.swe.workspace import open_task_sandbox

    task_dir = tmp_path / "task"
    (task_dir / "env").mkdir(parents=True)
    mark = uuid.uuid4().hex
    (task_dir / "env" / "Dockerfile").write_text(
        f"FROM {busybox}\nENV TASK_MARK={mark}\nRUN echo from-build > /built\n")
    (task_dir / "task.yaml").write_text(
        "instance_id: built-task\nproblem_statement: p\nFAIL_TO_PASS: [t]\n"
        "image: {build: env}\n")
    task = load_task_dir(task_dir)
    assert task.sandbox_spec().image.build == (task_dir / "env").resolve()
    for _ in range(2):  # the second sandbox's build is all cache
        with open_task_sandbox(client, task, labels={"test": "image-build"}) as sb:
            assert sb.exec("cat /built; echo $TASK_MARK").stdout == f"from-build\n{mark}\n"


def test_run_with_network_asked_for(client: SandboxClient, busybox: str, tmp_path: Path) -> None:
    """--network gives RUN the sandbox's outbound interface (nothing is sent here)."""
    ctx = context(tmp_path, f"FROM {busybox}\nRUN cat /proc/net/dev > /net-{uuid.uuid4().hex}\n")
    image = build_image(client, ctx, network=True)
    with client.create_sandbox(image.name) as sb:
        listing = sb.exec("cat /net-*").stdout
    interfaces = {line.split(":")[0].strip() for line in listing.splitlines() if ":" in line}
    assert "lo" in interfaces and len(interfaces) > 1, listing
