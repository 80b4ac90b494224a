"""The `orchard` command without a server: what it needs installed, and how it fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What the SDK-only install lacks: the server side, the rollout layer, grading, training.
HEAVY = ("fastapi", "uvicorn", "redis", "kubernetes_asyncio", "transformers", "torch",
         "datasets", "swebench", "minisweagent", "litellm", "matplotlib")


def orchard_without(modules: tuple[str, ...], *args: str) -> subprocess.CompletedProcess[str]:
    """`orchard ARGS` in a fresh interpreter where importing ``modules`` fails as if they were
    not installed (a None entry in sys.modules is how Python spells that)."""
    code = ("import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in modules)
            + "from orchard.cli import app\napp(prog_name='orchard')\n")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"})


def test_a_command_whose_extra_is_missing_says_so_in_one_line() -> None:
    r = orchard_without(("fastapi",), "serve")
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1, r.stderr
    assert "'fastapi'" in r.stderr and "pip install 'orchard[server]'" in r.stderr


def test_help_and_the_sandbox_commands_need_only_the_sdk() -> None:
    for args in (["--help"], ["sandbox", "--help"], ["eval", "--help"], ["demo", "--help"]):
        r = orchard_without(HEAVY, *args)
        assert r.returncode == 0 and "Usage: orchard" in r.stdout, r.stderr
    r = orchard_without(HEAVY, "--url", "http://127.0.0.1:9", "sandbox", "ls")
    assert r.returncode == 1 and r.stderr.startswith("error: GET http://127.0.0.1:9/sandboxes")
    assert "Traceback" not in r.stderr
