"""Per-sandbox cgroups: cpu, memory and pids limits plus reliable kill, on v1, v2 and hybrid hosts.

Layout per sandbox ``<id>`` under the manager's ``group``:

* cgroup v1 controllers: ``<mount>/<group>/<id>`` for each of memory, cpu, pids and freezer
  (``<mount>`` is normally ``<root>/<controller>``).
* cgroup v2: ``<v2 mount>/<group>/<id>``; ``<v2 mount>`` is ``<root>`` on a pure v2 host and
  ``<root>/unified`` on a hybrid one.  On hybrid hosts the v2 directory carries no limits, it
  exists for ``cgroup.kill`` / ``cgroup.freeze`` and as a membership record.

A launch puts the sandbox in every directory (see :meth:`CgroupManager.membership`: clone3 is
born into the v2 one, the v1 ones are joined) before it runs anything, so all descendants are
accounted from their first instruction.  The manager only ever
creates, writes or removes directories at or below ``<group>``; in particular it never touches
the ``cgroup.subtree_control`` of ``<group>``'s parent, so on v2 the controllers have to be
delegated to ``<group>`` by whoever owns that parent (systemd does for the root cgroup).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from orchard.env.backends.local.cgroupfs import (
    cgroup_mounts,
    keyed,
    kill_all,
    read_file,
    write_file,
)
from orchard.env.errors import OrchestratorError
from orchard.env.quantities import parse_cpu, parse_memory

__all__ = [
    "CgroupError",
    "CgroupManager",
    "LimitResult",
    "parse_cpu",
    "parse_memory",
]

# Names become directory names; keep them to one safe path component so a hostile id can never
# address a cgroup outside <group>.
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_LIMITED = ("cpu", "memory", "pids")
_CFS_PERIOD_US = 100_000
# The kernel rejects cfs quotas below 1ms and periods above 1s.
_CFS_MIN_QUOTA_US = 1_000
_CFS_MAX_PERIOD_US = 1_000_000
_POLL_S = 0.01


class CgroupError(OrchestratorError, RuntimeError):
    """The cgroup filesystem could not be used as required."""


@dataclass
class LimitResult:
    requested: str | None
    enforced: bool
    detail: str


@dataclass(frozen=True)
class _Hierarchy:
    version: int  # 1 or 2
    mount: Path

    def __str__(self) -> str:
        return f"v{self.version}:{self.mount}"


class CgroupManager:
    """Creates, limits, inspects and kills the cgroups of sandboxes below one ``group``."""

    def __init__(self, group: str = "orchard", root: Path = Path("/sys/fs/cgroup")) -> None:
        parts = Path(group).parts
        if not parts or Path(group).is_absolute() or any(p in (".", "..") for p in parts):
            raise ValueError(f"cgroup group must be a relative path without '..': {group!r}")
        self.group = Path(*parts)
        self.root = root
        self._v1: dict[str, _Hierarchy] = {}
        self._v2: _Hierarchy | None = None
        self._detect(root.resolve())
        v2_controllers = set()
        if self._v2 is not None:
            v2_controllers = set((read_file(self._v2.mount / "cgroup.controllers") or "").split())
        # A controller can be bound to one hierarchy only; v1 wins because on a hybrid host the
        # v2 tree only sees controllers nobody mounted on v1.
        self._controllers: dict[str, _Hierarchy | None] = {}
        for name in _LIMITED:
            if name in self._v1:
                self._controllers[name] = self._v1[name]
            elif self._v2 is not None and name in v2_controllers:
                self._controllers[name] = self._v2
            else:
                self._controllers[name] = None
        self._v2_controllers = v2_controllers
        # v2 cgroup.freeze is core (no controller) so a v2 mount always offers a freezer.
        self._freezer = self._v1.get("freezer", self._v2)

    def _detect(self, root: Path) -> None:
        for mount, fstype, opts in cgroup_mounts():
            if not mount.is_relative_to(root):
                continue
            if fstype == "cgroup2":
                # Prefer a v2 mount at root itself (pure v2) over a nested one (hybrid).
                if self._v2 is None or mount == root:
                    self._v2 = _Hierarchy(2, mount)
            else:
                for name in opts & {"memory", "cpu", "pids", "freezer"}:
                    self._v1[name] = _Hierarchy(1, mount)

    # -- introspection -------------------------------------------------------------------

    def layout(self) -> dict[str, str]:
        """Which hierarchy serves each function, e.g. ``{"memory": "v1:/sys/fs/cgroup/memory"}``.

        ``kill`` names the v2 tree whose ``cgroup.kill`` is used (kernel >= 5.14; older kernels
        fall back to freezing and signalling).
        """
        out = {name: str(h) if h else "unavailable" for name, h in self._controllers.items()}
        out["freezer"] = str(self._freezer) if self._freezer else "unavailable"
        out["kill"] = str(self._v2) if self._v2 else "unavailable"
        return out

    def _hierarchies(self) -> list[_Hierarchy]:
        """Every hierarchy a sandbox gets a directory in, v1 first, deduplicated."""
        seen: list[_Hierarchy] = []
        for h in [*(self._v1.get(n) for n in ("memory", "cpu", "pids", "freezer")), self._v2]:
            if h is not None and h not in seen:
                seen.append(h)
        return seen

    def _dir(self, h: _Hierarchy, sandbox_id: str) -> Path:
        if not _ID_RE.fullmatch(sandbox_id):
            raise ValueError(f"invalid sandbox id for a cgroup name: {sandbox_id!r}")
        return h.mount / self.group / sandbox_id

    def _dirs(self, sandbox_id: str) -> list[Path]:
        return [self._dir(h, sandbox_id) for h in self._hierarchies()]

    def _existing_dirs(self, sandbox_id: str) -> list[Path]:
        return [d for d in self._dirs(sandbox_id) if d.is_dir()]

    # -- creation ------------------------------------------------------------------------

    def create(
        self, sandbox_id: str, cpu: str | None, memory: str | None, pids: int | None
    ) -> dict[str, LimitResult]:
        """Create the sandbox's cgroup directories and apply the requested limits.

        Returns, per ``cpu``/``memory``/``pids``, whether the limit is enforced and why not.
        A missing controller is reported, not raised; an unwritable cgroup fs raises.
        """
        cores = parse_cpu(cpu) if cpu is not None else None
        mem_bytes = parse_memory(memory) if memory is not None else None
        if pids is not None and pids < 1:
            raise ValueError(f"pids limit must be at least 1, got {pids}")
        hierarchies = self._hierarchies()
        if not hierarchies:
            raise CgroupError(f"no cgroup filesystem is mounted under {self.root}")
        dirs = self._dirs(sandbox_id)
        if any(d.exists() for d in dirs):
            # Reusing a live directory would merge two sandboxes' accounting and kill scope.
            raise CgroupError(f"cgroup for sandbox {sandbox_id!r} already exists; kill() it first")

        created: list[Path] = []
        try:
            delegation_errors: dict[str, str] = {}
            for h in hierarchies:
                if h.version == 2:
                    delegation_errors = self._prepare_v2_group(h)
                else:
                    (h.mount / self.group).mkdir(parents=True, exist_ok=True)
                d = self._dir(h, sandbox_id)
                d.mkdir()
                created.append(d)
        except OSError as exc:
            for d in reversed(created):
                d.rmdir()
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise CgroupError(
                    f"cannot create cgroups under {self.root} ({exc.strerror}: {exc.filename}); "
                    "the local backend must run as root with a writable cgroup filesystem"
                ) from exc
            raise CgroupError(f"cannot create cgroup for sandbox {sandbox_id!r}: {exc}") from exc

        memory_writes: dict[int, list[tuple[str, str, bool]]] = {
            # memory.oom_control=0 re-enables the OOM killer should a parent have disabled it;
            # otherwise an over-limit sandbox hangs instead of dying.
            1: [("memory.limit_in_bytes", str(mem_bytes), True), ("memory.oom_control", "0", True)],
            # Without swap.max=0 a v2 sandbox could exceed memory.max by swapping.
            2: [("memory.max", str(mem_bytes), True), ("memory.swap.max", "0", False)],
        }
        quota, period = _cfs(cores) if cores is not None else (0, 0)
        cpu_writes = {
            1: [("cpu.cfs_period_us", str(period), True), ("cpu.cfs_quota_us", str(quota), True)],
            2: [("cpu.max", f"{quota} {period}", True)],
        }
        pids_writes = {v: [("pids.max", str(pids), True)] for v in (1, 2)}
        return {
            "cpu": self._apply("cpu", sandbox_id, cpu, cpu_writes, delegation_errors),
            "memory": self._apply("memory", sandbox_id, memory, memory_writes, delegation_errors),
            "pids": self._apply(
                "pids",
                sandbox_id,
                None if pids is None else str(pids),
                pids_writes,
                delegation_errors,
            ),
        }

    def _prepare_v2_group(self, h: _Hierarchy) -> dict[str, str]:
        """Create ``<group>`` in the v2 tree and delegate our controllers down to its children.

        Returns controller -> reason for those that could not be enabled.
        """
        wanted = [n for n in _LIMITED if self._controllers[n] == h]
        errors: dict[str, str] = {}
        current = h.mount
        for part in self.group.parts:
            current = current / part
            current.mkdir(exist_ok=True)
            available = set((read_file(current / "cgroup.controllers") or "").split())
            enabled = set((read_file(current / "cgroup.subtree_control") or "").split())
            for name in wanted:
                if name in enabled or name in errors:
                    continue
                if name not in available:
                    errors[name] = (
                        f"{name} controller is not delegated to {current} "
                        "(enable it in its parent's cgroup.subtree_control)"
                    )
                    continue
                try:
                    write_file(current / "cgroup.subtree_control", f"+{name}")
                except OSError as exc:
                    # EBUSY here is the v2 "no internal processes" rule: something has put
                    # processes directly into a group directory.
                    errors[name] = f"enabling +{name} in {current}/cgroup.subtree_control: {exc}"
        return errors

    def _apply(
        self,
        name: str,
        sandbox_id: str,
        requested: str | None,
        writes: dict[int, list[tuple[str, str, bool]]],
        delegation_errors: dict[str, str],
    ) -> LimitResult:
        h = self._controllers[name]
        if h is None:
            where = f"v2 controllers: {' '.join(sorted(self._v2_controllers)) or 'none'}"
            reason = f"no {name} controller on this host under {self.root} ({where})"
        elif h.version == 2 and name in delegation_errors:
            reason = delegation_errors[name]
        else:
            reason = ""
        if requested is None:
            note = f"; {reason}" if reason else f" ({h} available)"
            return LimitResult(None, False, f"no {name} limit requested{note}")
        if h is None or reason:
            return LimitResult(requested, False, reason)
        d = self._dir(h, sandbox_id)
        applied: list[str] = []
        for filename, value, required in writes[h.version]:
            path = d / filename
            if not required and not path.exists():
                continue
            try:
                write_file(path, value)
            except OSError as exc:
                return LimitResult(requested, False, f"writing {value!r} to {path} failed: {exc}")
            applied.append(f"{filename}={value}")
        return LimitResult(requested, True, f"{h}: {', '.join(applied)}")

    # -- membership ----------------------------------------------------------------------

    def membership(self, sandbox_id: str) -> tuple[Path | None, list[Path]]:
        """How a launch joins the sandbox's cgroups: the v2 directory (a clone3 is born into
        it, CLONE_INTO_CGROUP) and the ``cgroup.procs`` of each v1 hierarchy."""
        files = self.procs_files(sandbox_id)
        v2 = self._dir(self._v2, sandbox_id) if self._v2 else None
        return v2, [f for f in files if f.parent != v2]

    def procs_files(self, sandbox_id: str) -> list[Path]:
        """Every ``cgroup.procs`` a launcher must write its own pid into before exec."""
        dirs = self._dirs(sandbox_id)
        missing = [d for d in dirs if not d.is_dir()]
        if missing:
            raise CgroupError(f"sandbox {sandbox_id!r} has no cgroup at {missing[0]}; create() it")
        return [d / "cgroup.procs" for d in dirs]

    def pids(self, sandbox_id: str) -> set[int]:
        """All processes in the sandbox's cgroups, including any nested cgroups it made."""
        found: set[int] = set()
        for d in self._existing_dirs(sandbox_id):
            for dirpath, _, _ in os.walk(d):
                text = read_file(Path(dirpath) / "cgroup.procs")
                found.update(int(p) for p in (text or "").split())
        return found

    def list(self) -> set[str]:
        """Sandbox ids with a cgroup directory in any hierarchy (orphans after a crash too)."""
        ids: set[str] = set()
        for h in self._hierarchies():
            group_dir = h.mount / self.group
            if group_dir.is_dir():
                ids.update(p.name for p in group_dir.iterdir() if p.is_dir())
        return ids

    def remove_group(self) -> None:
        """Remove this manager's group directories if no sandbox cgroup is left in them (a
        standalone orchestrator's surviving sandboxes keep theirs)."""
        for h in self._hierarchies():
            with contextlib.suppress(OSError):  # not empty, or already gone
                (h.mount / self.group).rmdir()

    # -- accounting ----------------------------------------------------------------------

    def memory_usage(self, sandbox_id: str) -> int | None:
        """Current memory charge in bytes, or None without a memory controller/cgroup."""
        h = self._controllers["memory"]
        if h is None:
            return None
        filename = "memory.usage_in_bytes" if h.version == 1 else "memory.current"
        text = read_file(self._dir(h, sandbox_id) / filename)
        return int(text) if text else None

    def cpu_seconds(self, sandbox_id: str) -> float | None:
        """CPU time its processes have used, or None without a cgroup that counts it."""
        if self._v2 is not None:
            usec = keyed(read_file(self._dir(self._v2, sandbox_id) / "cpu.stat"), "usage_usec")
            return None if usec is None else usec / 1e6
        h = self._controllers["cpu"]
        text = read_file(self._dir(h, sandbox_id) / "cpuacct.usage") if h else None
        return int(text) / 1e9 if text else None

    def oom_killed(self, sandbox_id: str) -> bool:
        """Whether the kernel OOM-killed anything in the sandbox because of its memory limit."""
        h = self._controllers["memory"]
        if h is None:
            return False
        filename = "memory.oom_control" if h.version == 1 else "memory.events"
        return (keyed(read_file(self._dir(h, sandbox_id) / filename), "oom_kill") or 0) > 0

    # -- teardown ------------------------------------------------------------------------

    def send_kill(self, sandbox_id: str, timeout: float = 5.0) -> None:
        """SIGKILL every process of the sandbox and return without waiting for them to exit
        (a delete's part; :meth:`kill` waits and removes the directories). Once it returns,
        none of them runs another instruction of its own. Idempotent."""
        deadline = time.monotonic() + timeout
        if not self._existing_dirs(sandbox_id):
            return
        # A v1-frozen (paused) task would hold its SIGKILL until thawed.
        with contextlib.suppress(OSError):
            self.thaw(sandbox_id)
        v2_dir = self._dir(self._v2, sandbox_id) if self._v2 else None
        if v2_dir is not None and (v2_dir / "cgroup.kill").exists():
            # Atomic against concurrent forks, unlike any signal loop.  A concurrent kill() may
            # have removed the directory already, which is the outcome we want anyway.
            with contextlib.suppress(FileNotFoundError):
                write_file(v2_dir / "cgroup.kill", "1")
        else:
            self._freeze_and_kill(sandbox_id, deadline)
        # Processes that joined only some hierarchies (a launcher that died midway).
        kill_all(self.pids(sandbox_id))

    def kill(self, sandbox_id: str, timeout: float = 5.0) -> None:
        """SIGKILL every process of the sandbox and remove its directories.

        Idempotent; bounded by ``timeout``; raises CgroupError if processes or directories
        survive it.
        """
        deadline = time.monotonic() + timeout
        dirs = self._existing_dirs(sandbox_id)
        if not dirs:
            return
        self.send_kill(sandbox_id, timeout)
        v2_dir = self._dir(self._v2, sandbox_id) if self._v2 else None
        if v2_dir is not None and (v2_dir / "cgroup.kill").exists():
            # Every process joined this hierarchy: wait on its one file, not on every one
            # (with many teardowns at once, re-reading them all kept the GIL busy).
            while (read_file(v2_dir / "cgroup.procs") or "").strip():
                if time.monotonic() > deadline:
                    break
                time.sleep(_POLL_S)
        # Catches stragglers: of the fallback path, or forked between a listing and a signal.
        while remaining := self.pids(sandbox_id):
            if time.monotonic() > deadline:
                raise CgroupError(
                    f"processes {sorted(remaining)} of sandbox {sandbox_id!r} survived SIGKILL "
                    f"for {timeout}s (uninterruptible sleep?); cgroups left in place: "
                    f"{', '.join(map(str, dirs))}"
                )
            kill_all(remaining)
            time.sleep(_POLL_S)
        for d in dirs:
            _rmdir_tree(d, deadline)

    def _freezer_control(self, sandbox_id: str) -> tuple[Path, str, str] | None:
        """(control file, frozen value, thawed value), or None without a freezer."""
        if self._freezer is None:
            return None
        d = self._dir(self._freezer, sandbox_id)
        if self._freezer.version == 1:
            return d / "freezer.state", "FROZEN", "THAWED"
        return d / "cgroup.freeze", "1", "0"

    def freeze(self, sandbox_id: str, timeout: float = 5.0) -> None:
        """Stop every process of the sandbox where it stands; returns once all are stopped."""
        control = self._freezer_control(sandbox_id)
        if control is None or not control[0].exists():
            raise CgroupError(f"sandbox {sandbox_id!r} has no freezer cgroup (layout: "
                              f"{self.layout()}); it cannot be paused on this host")
        write_file(control[0], control[1])
        deadline = time.monotonic() + timeout
        while not self.frozen(sandbox_id):
            if time.monotonic() > deadline:
                raise CgroupError(f"sandbox {sandbox_id!r} did not freeze within {timeout}s "
                                  "(a process in uninterruptible sleep?); retry")
            time.sleep(_POLL_S)

    def thaw(self, sandbox_id: str) -> None:
        control = self._freezer_control(sandbox_id)
        if control is not None and control[0].exists():
            write_file(control[0], control[2])

    def frozen(self, sandbox_id: str) -> bool:
        if self._freezer is None:
            return False
        d = self._dir(self._freezer, sandbox_id)
        if self._freezer.version == 1:
            return (read_file(d / "freezer.state") or "").strip() == "FROZEN"
        return keyed(read_file(d / "cgroup.events"), "frozen") == 1

    def _freeze_and_kill(self, sandbox_id: str, deadline: float) -> None:
        """Freeze so the process list cannot change under us, SIGKILL it all, then thaw."""
        control = self._freezer_control(sandbox_id)
        if control is None or not control[0].exists():
            return
        write_file(control[0], control[1])
        try:
            while not self.frozen(sandbox_id) and time.monotonic() < deadline:
                time.sleep(_POLL_S)
            kill_all(self.pids(sandbox_id))
        finally:
            # Frozen tasks only act on the pending SIGKILL once thawed.
            write_file(control[0], control[2])


def _cfs(cores: float) -> tuple[int, int]:
    """(quota, period) in microseconds for a CFS bandwidth limit of ``cores``."""
    period = _CFS_PERIOD_US
    quota = round(cores * period)
    if quota < _CFS_MIN_QUOTA_US:
        # Tiny shares cannot be expressed in a 100ms period; stretch the period instead.
        period = _CFS_MAX_PERIOD_US
        quota = max(_CFS_MIN_QUOTA_US, round(cores * period))
    return quota, period


def _rmdir_tree(d: Path, deadline: float) -> None:
    """Remove ``d`` and any child cgroups, retrying while the kernel still reports it busy."""
    for dirpath, _, _ in os.walk(d, topdown=False):
        while True:
            try:
                os.rmdir(dirpath)
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                # Exiting tasks keep a cgroup busy for a moment after leaving cgroup.procs.
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise CgroupError(f"cannot remove cgroup {dirpath}: {exc}") from exc
                time.sleep(_POLL_S)
