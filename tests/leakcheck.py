"""The session's leak check: nothing a test session created may outlive it.

A pytest plugin (conftest.py loads it) with one autouse session fixture. It snapshots the host
when the session starts and, after every other fixture is torn down (the orchestrators
stopped, their sandboxes deleted), fails the session if something new is still there.

What counts is only what appeared during this session: new cgroup groups of orchard, new
temp dirs with our prefixes, new mounts and uid-range claims, new loop devices, and processes
that live in, or name, one of those. Things of other orchestrators that existed before are
ignored, but another test session running on the same host at the same time is reported as
this one's leak: run one session per host (CI does).
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from orchard.env.backends.local.userns import REGISTRY

# Where tests and embedded orchestrators make their short-lived dirs (see tempfile prefixes).
TEMP_GLOBS = ("/tmp/orc-*", "/tmp/orchard-*")
SANDBOX_COMMANDS = ("bwrap", "orchard_agent", "slirp4netns", "zygote.py")


@dataclass
class HostState:
    """What of ours exists on the host at one moment."""

    groups: set[str] = field(default_factory=set)
    temp_dirs: set[str] = field(default_factory=set)
    mounts: set[str] = field(default_factory=set)
    uid_claims: set[str] = field(default_factory=set)
    loop_files: set[str] = field(default_factory=set)

    @classmethod
    def now(cls) -> HostState:
        groups = glob.glob("/sys/fs/cgroup/*/orchard/*/") + glob.glob("/sys/fs/cgroup/orchard/*/")
        mounts = [line for line in Path("/proc/self/mounts").read_text().splitlines()
                  if "orchard" in line or "/tmp/orc-" in line]
        claims = [f"{p.name} -> {os.readlink(p)}" for p in REGISTRY.iterdir()
                  if p.is_symlink()] if REGISTRY.is_dir() else []
        return cls(groups={g.rstrip("/") for g in groups},
                   temp_dirs={d for pattern in TEMP_GLOBS for d in glob.glob(pattern)},
                   mounts=set(mounts), uid_claims=set(claims),
                   loop_files=set(loop_backing_files()))


def loop_backing_files() -> list[str]:
    """The backing files of this host's attached loop devices."""
    found = []
    for path in glob.glob("/sys/block/loop*/loop/backing_file"):
        try:
            found.append(Path(path).read_text().strip())
        except OSError:  # detached while we looked
            continue
    return found


def _processes(groups: set[str], dirs: set[str]) -> list[str]:
    """Live sandbox-side processes that sit in one of ``groups`` or name one of ``dirs``."""
    rel = {g[g.index("/orchard/"):] for g in groups}  # as /proc/<pid>/cgroup shows them
    found = []
    for pid in Path("/proc").iterdir():
        if not pid.name.isdigit():
            continue
        try:
            status = (pid / "status").read_text()
            cmdline = (pid / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cgroup = (pid / "cgroup").read_text()
        except OSError:  # gone while we looked
            continue
        if "State:\tZ" in status or not any(c in cmdline for c in SANDBOX_COMMANDS):
            continue
        if any(f":{r}/" in cgroup or cgroup.rstrip().endswith(f":{r}") for r in rel) or any(
                d in cmdline for d in dirs):
            found.append(f"{pid.name}: {cmdline.strip()[:160]}")
    return found


def leaks_since(before: HostState, settle: float = 20.0) -> dict[str, list[str]]:
    """What appeared since ``before`` and is still there after up to ``settle`` seconds
    (teardown is asynchronous in places: a cgroup goes once its last process is reaped)."""
    deadline = time.monotonic() + settle
    while True:
        after = HostState.now()
        new_groups = after.groups - before.groups
        new_dirs = after.temp_dirs - before.temp_dirs
        found = {
            "processes": _processes(new_groups, new_dirs),
            "cgroup groups": sorted(new_groups),
            "temp dirs": sorted(new_dirs),
            "mounts": sorted(after.mounts - before.mounts),
            "uid-range claims": sorted(after.uid_claims - before.uid_claims),
            "loop devices": sorted(after.loop_files - before.loop_files),
        }
        found = {kind: items for kind, items in found.items() if items}
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


@pytest.fixture(scope="session", autouse=True)
def nothing_leaks() -> Iterator[None]:
    """Set up before any other session fixture, so it is torn down after all of them."""
    if os.geteuid() != 0:  # without root no test made sandboxes, mounts or cgroups
        yield
        return
    before = HostState.now()
    yield
    found = leaks_since(before)
    if found:
        lines = [f"  {kind}: {', '.join(items[:10])}" for kind, items in found.items()]
        pytest.fail("the test session left these behind:\n" + "\n".join(lines), pytrace=False)
