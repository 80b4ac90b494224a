"""Two arms of a learning curve side by side, paired: held-out success at each evaluated step,
arm B minus arm A with its standard error, and how the rollouts ended.

Both arms must be ``bench/learning_curve.py`` runs from one SFT checkpoint with the same
evaluation seeds (copy ``OUT/shared/sft.pt`` and the shared stages of ``OUT/curve.json`` into
the second arm's folder before it runs). Then seed s of one arm and seed s of the other
sample the same request seeds, and their difference is paired per task, pooled over the
seeds both arms ran. A pair whose SFT evaluations differ did not start from the same
checkpoint, and is refused.

    .venv/bin/python bench/compare_curves.py bench/results/learning_curve-swe-batch16.json \\
        bench/results/learning_curve-swe-batch16-kl.json --tag batch16-kl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import print_table, write_json  # noqa: E402
from learning import pct  # noqa: E402

from orchard.eval.paired import pooled_difference  # noqa: E402
from orchard.recipes.rl import FORMAT_FAILURE  # noqa: E402


def load_arm(path: Path) -> dict[str, Any]:
    """A learning-curve result file's run state (shared stages and seeds)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        results = doc["results"]
        return {"name": doc.get("args", {}).get("tag") or path.stem,
                "sft": results["shared"]["sft"], "seeds": results["seeds"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"{path}: not a learning_curve result file ({e!r}); give the JSON "
                         f"that bench/learning_curve.py wrote under bench/results/") from None


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Per step both arms evaluated: each arm's mean over the common seeds, B - A paired,
    and the format failures of each (where the evaluations recorded exit statuses)."""
    if a["sft"]["outcomes"] != b["sft"]["outcomes"]:
        raise SystemExit(f"{a['name']} and {b['name']} have different SFT evaluations, so they "
                         f"did not start from one SFT checkpoint: a paired comparison needs "
                         f"the second arm run from a copy of the first's shared/sft.pt")
    seeds = sorted(set(a["seeds"]) & set(b["seeds"]), key=int)
    if not seeds:
        raise SystemExit(f"{a['name']} and {b['name']} share no seed; run the same --seeds")
    steps = sorted({int(k) for s in seeds for k in a["seeds"][s]["evals"]}
                   & {int(k) for s in seeds for k in b["seeds"][s]["evals"]})
    points: dict[str, Any] = {}
    for step in steps:
        both = [s for s in seeds if str(step) in a["seeds"][s]["evals"]
                and str(step) in b["seeds"][s]["evals"]]
        evals_a = [a["seeds"][s]["evals"][str(step)] for s in both]
        evals_b = [b["seeds"][s]["evals"][str(step)] for s in both]
        diff = pooled_difference([(eb["outcomes"], ea["outcomes"])
                                  for ea, eb in zip(evals_a, evals_b, strict=True)])
        points[str(step)] = {
            "seeds": [int(s) for s in both],
            "a": statistics.fmean(e["resolved_rate"] for e in evals_a),
            "b": statistics.fmean(e["resolved_rate"] for e in evals_b),
            "b_minus_a": diff.as_dict(),
            "format_failures": {"a": format_failures(evals_a), "b": format_failures(evals_b)}}
    return {"a": a["name"], "b": b["name"], "sft": a["sft"]["resolved_rate"], "points": points}


def format_failures(evals: list[dict[str, Any]]) -> int | None:
    """Held-out rollouts that ended in format errors, or None where an evaluation did not
    record exit statuses (runs before they were kept)."""
    if any("exit_statuses" not in e for e in evals):
        return None
    return sum(e["exit_statuses"].get(FORMAT_FAILURE, 0) for e in evals)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path, help="arm A's bench/results/learning_curve-*.json")
    parser.add_argument("b", type=Path, help="arm B's, from the same SFT checkpoint")
    parser.add_argument("--tag", help="write bench/results/compare_curves-<tag>.json")
    args = parser.parse_args()
    result = compare(load_arm(args.a), load_arm(args.b))
    print_table(
        f"{result['b']} minus {result['a']}, paired per task (SFT {pct(result['sft'])}%)",
        ["after step", "seeds", "A %", "B %", "B - A (± SE)", "significant",
         "format failures A / B"],
        [[step, len(p["seeds"]), pct(p["a"]), pct(p["b"]),
          f"{100 * p['b_minus_a']['mean']:+.1f} ± {100 * p['b_minus_a']['se']:.1f}",
          "yes" if p["b_minus_a"]["significant"] else "no",
          " / ".join("n/a" if n is None else str(n) for n in p["format_failures"].values())]
         for step, p in result["points"].items()])
    write_json("compare_curves", args, result)


if __name__ == "__main__":
    main()
