"""Build a Dockerfile on an orchestrator, through the SDK: each step that writes files runs in
a sandbox and is kept as a snapshot, which is the step's layer and its cache entry.

A step's cache key chains, as Docker's does, the key before it with the instruction (after
substitution), the build args in effect (RUN) and the content hash of what COPY and ADD take.
Each step snapshot carries its key as a label, so a build lists the build snapshots once and
finds every step it can skip; a hit needs no sandbox at all. The first miss starts a sandbox
from the last snapshot (or the FROM image), runs the step, snapshots it and deletes the
sandbox: the next miss starts afresh from that snapshot, so each snapshot holds only its own
step's changes (a sandbox kept across steps would copy all it wrote so far at every snapshot).

``async_builder.py`` is the source of ``sync_builder.py`` (scripts/unasync.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from orchard.env.build.context import BuildContext, content_hash, write_tar
from orchard.env.build.dockerfile import (
    BuildError,
    Instruction,
    arg_words,
    json_form,
    key_values,
    parse_dockerfile,
    split_flags,
    substitute,
    substitute_word,
    words,
)
from orchard.env.build.results import BuiltImage, StepFailed, StepReport
from orchard.env.build_schema import (
    BUILD_LABEL,
    STEP_LABEL,
    TAG_PREFIX,
    names_an_image,
    normalize_name,
    tag_label,
)
from orchard.env.client import AsyncSandbox, AsyncSandboxClient, OrchardError
from orchard.env.image_schema import ImageConfig
from orchard.env.snapshot_schema import SnapshotInfo

DEFAULT_SHELL = ["/bin/sh", "-c"]
# The agent's own interpreter, mounted in every sandbox on both backends: COPY unpacks its tar
# with it, so an image needs neither tar nor a shell to be copied into.
BUNDLE_PYTHON = "/.orchard/bundle/bin/python3"
_UNPACK = """import os, sys, tarfile
path = sys.argv[1]
try:
    with tarfile.open(path) as tar:
        trusted = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
        tar.extractall("/", numeric_owner=True, **trusted)
finally:
    os.unlink(path)
"""
_OUTPUT_TAIL = 4000  # bytes of a failed RUN's output kept for its error


async def build_image(
    client: AsyncSandboxClient,
    context: str | os.PathLike[str],
    *,
    dockerfile: str | os.PathLike[str] = "Dockerfile",
    tag: str | None = None,
    build_args: Mapping[str, str] | None = None,
    network: bool = False,
    egress: Sequence[str] | None = None,
    no_cache: bool = False,
    step_timeout: float = 3600.0,
    progress: Callable[[str], None] | None = None,
) -> BuiltImage:
    """Build ``dockerfile`` (relative to ``context`` unless absolute) and tag the result.

    Without ``tag`` the image is named ``build:<first 16 hex of its key>``. RUN has no network
    unless ``network`` (the public internet) or an ``egress`` allow-list is given, as for any
    sandbox. ``progress`` gets one line per step and RUN's output as it comes."""
    builder = AsyncImageBuilder(client, Path(context), Path(dockerfile),
                                build_args=dict(build_args or {}), network=network or bool(egress),
                                egress=None if egress is None else list(egress),
                                no_cache=no_cache, step_timeout=step_timeout,
                                progress=progress or (lambda _line: None))
    return await builder.build(tag)


class AsyncImageBuilder:
    def __init__(self, client: AsyncSandboxClient, context: Path, dockerfile: Path, *,
                 build_args: dict[str, str], network: bool, egress: list[str] | None,
                 no_cache: bool, step_timeout: float, progress: Callable[[str], None]) -> None:
        self.client = client
        self.context = BuildContext(context)
        path = dockerfile if dockerfile.is_absolute() else self.context.root / dockerfile
        try:
            self.steps = parse_dockerfile(path.read_text())
        except OSError as e:
            raise BuildError(f"cannot read the Dockerfile {path}: {e.strerror}") from None
        self.build_args, self.network, self.egress = build_args, network, egress
        self.no_cache, self.step_timeout, self.progress = no_cache, step_timeout, progress
        self.config = ImageConfig()
        self.report: list[StepReport] = []
        self.warnings: list[str] = []
        self._meta_args: dict[str, str] = {}  # ARGs before FROM: for FROM only
        self._args: dict[str, str] = {}  # ARGs of the stage, with their values
        self._used_args: set[str] = set()
        self._base = "host"
        self._snapshot: str | None = None
        self._key = ""
        self._sandbox: AsyncSandbox | None = None
        self._cache: dict[str, SnapshotInfo] = {}
        self._tags: dict[str, SnapshotInfo] = {}

    # --- the build ------------------------------------------------------------------------

    async def build(self, tag: str | None) -> BuiltImage:
        started = time.monotonic()
        name = normalize_name(tag) if tag else None
        await self._read_cache()
        try:
            for n, step in enumerate(self.steps, 1):
                self.progress(f"step {n}/{len(self.steps)}: {step.keyword} "
                              f"{' '.join(step.value.split())}")
                await self._step(step)
            if self._snapshot is None:  # no step wrote files: the image is FROM's as it is
                await self._layer(self.steps[0], self._key, _nothing)
        finally:
            await self._drop_sandbox()
        unused = set(self.build_args) - self._used_args
        if unused:
            self.warnings.append(f"build args not declared by an ARG: {', '.join(sorted(unused))}")
        name = name or normalize_name(f"build:{self._key[:16]}")
        await self._tag(name)
        for warning in self.warnings:
            self.progress(f"warning: {warning}")
        assert self._snapshot is not None
        return BuiltImage(name=name, snapshot_id=self._snapshot, config=self.config,
                          steps=self.report, seconds=time.monotonic() - started,
                          warnings=self.warnings)

    async def _read_cache(self) -> None:
        health = await self.client.health()
        if health.backend == "kubernetes":
            self.warnings.append("on Kubernetes a snapshot keeps only kubernetes.snapshot_paths: "
                                 "files a step writes elsewhere are not in the image")
        # Oldest first, so the newest of two builds that raced on one key wins.
        for snap in sorted(await self.client.list_snapshots(labels={BUILD_LABEL: "step"}),
                           key=lambda s: s.created_at):
            if STEP_LABEL in snap.labels:
                self._cache[snap.labels[STEP_LABEL]] = snap
            for label in snap.labels:
                if label.startswith(TAG_PREFIX):
                    self._tags[label] = snap

    async def _step(self, step: Instruction) -> None:
        kw = step.keyword
        if self._key == "" and kw == "ARG":  # before FROM
            for name, value in self._declare(step, self._meta_args):
                self._meta_args[name] = value
            return
        if kw == "FROM":
            await self._from(step)
        elif kw == "RUN":
            await self._run(step)
        elif kw in ("COPY", "ADD"):
            await self._copy(step)
        elif kw == "WORKDIR":
            path = substitute(step.value, self._vars())
            workdir = posixpath.normpath(posixpath.join(self.config.workdir or "/", path))
            self.config.workdir = workdir
            await self._layer(step, self._chain(kw, workdir), lambda sb: sb.mkdir(workdir))
        else:
            self._configure(step)

    async def _from(self, step: Instruction) -> None:
        image = "".join(words(step.value, self._meta_args))
        if not image:
            raise step.error("FROM names no image after substitution: declare its variable "
                             "with ARG before FROM and give it a default or a build arg")
        self._used_args |= set(self._meta_args)
        tagged = self._tags.get(tag_label(image)) if names_an_image(image) else None
        if tagged is not None:  # an image built here: its files, config and key
            self._snapshot = tagged.snapshot_id
            self.config = ImageConfig.model_validate_json(tagged.labels[tag_label(image)])
            self._key = _hash(["FROM", tagged.snapshot_id])
        else:
            self._base = image
            self._key = _hash(["FROM", image])

    async def _run(self, step: Instruction) -> None:
        flags, text = split_flags(step, step.value, frozenset())
        argv = json_form(text)
        if argv is None:
            argv = [*(self.config.shell or DEFAULT_SHELL), text]
        env = {**self._args, **self.config.env}
        self._used_args |= set(self._args)
        key = self._chain("RUN", argv, sorted(self._args.items()))
        if self.config.user not in (None, "", "root", "0", "0:0"):
            self.warnings.append(f"line {step.line}: RUN runs as root, not as USER "
                                 f"{self.config.user} (sandbox commands always run as root)")

        async def run(sb: AsyncSandbox) -> None:
            tail = b""
            async for event in sb.stream(argv, env=env, cwd=self.config.workdir or "/",
                                         timeout=self.step_timeout):
                if event.type == "exit":
                    job = event.job
                    if job is None or job.exit_code != 0 or job.timed_out:
                        raise StepFailed(step, None if job is None else job.exit_code,
                                         tail.decode(errors="replace"),
                                         timed_out=job is not None and job.timed_out)
                else:
                    tail = (tail + event.data)[-_OUTPUT_TAIL:]
                    self.progress(event.data.decode(errors="replace").rstrip("\n"))

        await self._layer(step, key, run)

    async def _copy(self, step: Instruction) -> None:
        flags, text = split_flags(step, step.value, frozenset({"chown", "chmod"}))
        variables = self._vars()
        form = json_form(text)
        parts = [substitute(p, variables) for p in form] if form is not None else words(
            text, variables)
        if len(parts) < 2:
            raise step.error(f"{step.keyword} needs at least one source and a destination")
        sources, dest = parts[:-1], parts[-1]
        if step.keyword == "ADD":
            for src in sources:
                if "://" in src or src.startswith("git@"):
                    raise step.error(f"ADD of a URL ({src}) is not supported: fetch it into "
                                     "the build context, or download it in a RUN with network")
        if not dest.startswith("/"):
            dest = posixpath.join(self.config.workdir or "/", dest)
        mode = _octal(step, flags["chmod"]) if "chmod" in flags else None
        files, archives = self.context.entries(step, sources, dest,
                                               unpack=step.keyword == "ADD")
        key = self._chain(step.keyword, sorted(flags.items()), sources, dest,
                          content_hash(files, archives))

        if flags.get("chown", "0").split(":")[0] not in ("0", "root"):
            self.warnings.append(f"line {step.line}: --chown={flags['chown']} is not applied: "
                                 "the files are root's (sandbox commands run as root, without "
                                 "the capability to give files away)")

        async def copy(sb: AsyncSandbox) -> None:
            remote = f"/.orchard-build-{key[:16]}.tar"
            with tempfile.TemporaryDirectory(prefix="orchard-build-") as tmp:
                local = Path(tmp) / "copy.tar"
                with open(local, "wb") as out:
                    write_tar(out, files, archives, mode)
                await sb.upload_file(local, remote)
            done = await sb.exec([BUNDLE_PYTHON, "-I", "-S", "-B", "-c", _UNPACK, remote])
            if not done.ok:
                raise BuildError(f"Dockerfile {step.where()}: unpacking the files in the "
                                 f"sandbox failed: {(done.stderr or done.stdout).strip()}")

        await self._layer(step, key, copy)

    def _configure(self, step: Instruction) -> None:
        """An instruction that changes only the image's config (and so the keys after it)."""
        kw, variables, c = step.keyword, self._vars(), self.config
        if kw == "ARG":
            for name, value in self._declare(step, self._args):
                self._args[name] = value
        elif kw == "ENV":
            c.env.update(key_values(step.value, variables))
        elif kw == "LABEL":
            c.labels.update(key_values(step.value, variables))
        elif kw == "MAINTAINER":
            c.labels["maintainer"] = substitute(step.value, variables)
        elif kw == "USER":
            c.user = substitute(step.value, variables)
        elif kw == "EXPOSE":
            c.exposed_ports += words(step.value, variables)
        elif kw == "VOLUME":
            c.volumes += json_form(step.value) or words(step.value, variables)
            self.warnings.append(f"line {step.line}: VOLUME is recorded only: a sandbox mounts "
                                 "no volumes, the directory is part of its files")
        elif kw == "STOPSIGNAL":
            c.stop_signal = substitute(step.value, variables)
        elif kw == "SHELL":
            shell = json_form(step.value)
            if not shell:
                raise step.error('SHELL takes the JSON form, e.g. SHELL ["/bin/bash", "-c"]')
            c.shell = shell
        elif kw in ("CMD", "ENTRYPOINT"):
            argv = json_form(step.value) or [*(c.shell or DEFAULT_SHELL), step.value]
            if kw == "CMD":
                c.cmd = argv
            else:
                c.entrypoint = argv
        self._chain(kw, step.value, sorted(variables.items()))

    def _declare(self, step: Instruction, scope: dict[str, str]) -> list[tuple[str, str]]:
        """The ARGs a line declares with their values: the build arg if given, else the
        default, else (after FROM) the value of the same ARG before FROM; unset ones none."""
        declared = []
        for name, default in arg_words(step.value):
            if name in self.build_args:
                declared.append((name, self.build_args[name]))
                self._used_args.add(name)
            elif default is not None:
                declared.append((name, substitute_word(default, {**scope, **self.config.env})))
            elif name in self._meta_args:
                declared.append((name, self._meta_args[name]))
        return declared

    # --- layers ---------------------------------------------------------------------------

    async def _layer(self, step: Instruction, key: str,
                     act: Callable[[AsyncSandbox], Any]) -> None:
        """A step that writes files: the cached snapshot of ``key``, or ``act`` run in a
        sandbox and snapshotted under ``key``."""
        started = time.monotonic()
        self._key = key
        hit = None if self.no_cache else self._cache.get(key)
        if hit is not None:
            self._snapshot = hit.snapshot_id
            await self._drop_sandbox()  # one from an earlier state, if any
            self._report(step, True, started)
            return
        sb = await self._sandbox_now(step)
        await act(sb)
        snap = await sb.snapshot(keep=True, labels={BUILD_LABEL: "step", STEP_LABEL: key})
        self._snapshot, self._cache[key] = snap.snapshot_id, snap
        await self._drop_sandbox()
        self._report(step, False, started)

    async def _sandbox_now(self, step: Instruction) -> AsyncSandbox:
        if self._sandbox is None:
            try:
                self._sandbox = await self.client.create_sandbox(
                    None if self._snapshot else self._base, from_snapshot=self._snapshot,
                    block_network=not self.network, egress=self.egress,
                    labels={BUILD_LABEL: "sandbox"}, ttl=self.step_timeout + 600)
            except OrchardError as e:
                raise BuildError(f"Dockerfile {step.where()}: no sandbox to build in from "
                                 f"{self._snapshot or self._base}: {e}") from None
        return self._sandbox

    async def _drop_sandbox(self) -> None:
        if self._sandbox is not None:
            sb, self._sandbox = self._sandbox, None
            await sb.delete()

    async def _tag(self, name: str) -> None:
        """Point ``name`` at the last snapshot with this build's config, and away from any
        other snapshot that carried it."""
        assert self._snapshot is not None
        label = tag_label(name)
        await self.client.update_snapshot(
            self._snapshot, labels={label: self.config.model_dump_json(exclude_defaults=True)})
        for snap in await self.client.list_snapshots(labels={BUILD_LABEL: "step"}):
            if label in snap.labels and snap.snapshot_id != self._snapshot:
                await self.client.update_snapshot(snap.snapshot_id, labels={label: None})

    # --- helpers --------------------------------------------------------------------------

    def _vars(self) -> dict[str, str]:
        return {**self._args, **self.config.env}

    def _chain(self, *parts: object) -> str:
        self._key = _hash([self._key, *parts])
        return self._key

    def _report(self, step: Instruction, cached: bool, started: float) -> None:
        assert self._snapshot is not None
        self.report.append(StepReport(step.line, f"{step.keyword} {step.value}", cached,
                                      time.monotonic() - started, self._snapshot))
        if cached:
            self.progress(f"  cached: {self._snapshot}")


async def list_built_images(client: AsyncSandboxClient) -> dict[str, SnapshotInfo]:
    """Each name a build tagged, and the snapshot it names."""
    names: dict[str, SnapshotInfo] = {}
    for snap in sorted(await client.list_snapshots(labels={BUILD_LABEL: "step"}),
                       key=lambda s: s.created_at):
        for label in snap.labels:
            if label.startswith(TAG_PREFIX):
                names[label.removeprefix(TAG_PREFIX)] = snap
    return names


async def remove_built_image(client: AsyncSandboxClient, name: str) -> bool:
    """Untag ``name``; its steps stay in the cache until pruned. False: no such image."""
    label = tag_label(name)
    found = False
    for snap in await client.list_snapshots(labels={BUILD_LABEL: "step"}):
        if label in snap.labels:
            await client.update_snapshot(snap.snapshot_id, labels={label: None})
            found = True
    return found


async def prune_build_cache(client: AsyncSandboxClient) -> int:
    """Delete every build step snapshot that no name tags; returns how many. The files of a
    tagged image's earlier steps stay on disk while it builds on them."""
    pruned = 0
    for snap in await client.list_snapshots(labels={BUILD_LABEL: "step"}):
        if not any(label.startswith(TAG_PREFIX) for label in snap.labels):
            pruned += (await client.delete_snapshot(snap.snapshot_id)).found
    return pruned


async def _nothing(_sb: AsyncSandbox) -> None:
    return None


def _hash(parts: list[object]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _octal(step: Instruction, text: str) -> int:
    try:
        mode = int(text, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o7777:
        raise step.error(f"--chmod={text} is not an octal mode such as 755")
    return mode
