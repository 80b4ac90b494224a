"""bench/gpu_recipe.sh, the GPU learning curve, in its CPU dry run: the same pipeline (SFT, BAR
steps, paired evaluations) with the tiny Llama served by an orchard policy server in another
process, new weights pushed to it as folders, as SGLang gets them on a GPU."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.conftest import needs_root

REPO = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_root
def test_the_gpu_recipe_dry_run_trains_through_an_engine_in_another_process(
        tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path / "run"), "TAG": "dry",
           "PORT": str(_free_port()), "ORCHARD_BENCH_RESULTS": str(tmp_path / "results"),
           "PY": str(REPO / ".venv" / "bin" / "python")}
    done = subprocess.run([str(REPO / "bench" / "gpu_recipe.sh"), "--dry-run"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    results = json.loads((tmp_path / "results" / "learning_curve-dry.json").read_text())
    state = results["results"]
    assert results["args"]["engine_kind"] == "orchard"
    assert {"base", "sft"} <= state["shared"].keys()
    seed = state["seeds"]["0"]
    assert [s["step"] for s in seed["steps"]] == [0] and "1" in seed["evals"]
    assert seed["evals"]["1"]["rollouts"] == 2 and len(seed["evals"]["1"]["outcomes"]) == 2
    # Every sync wrote a folder the engine loaded; the last ones are kept.
    assert sorted(p.name for p in (tmp_path / "run" / "weights").iterdir())[-1].startswith(
        "weights-")
    assert (tmp_path / "results" / "learning_curve-dry.png").read_bytes()[:4] == b"\x89PNG"
    # The engine died with the script (its command line names its port).
    assert f"--port {env['PORT']}" not in subprocess.run(["ps", "-eo", "args"],
                                                        capture_output=True, text=True).stdout
