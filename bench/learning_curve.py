"""The learning curve of BAR RL after SFT: held-out success against RL step, over seeds, with
paired standard errors.

One teacher run, one set of values and one SFT checkpoint are shared by every seed, so seeds
vary RL only. The untrained policy (base) and the SFT policy are evaluated once; each seed then
runs ``--steps`` BAR steps from the SFT checkpoint and is evaluated on the held-out tasks every
``--eval-every`` steps. Every evaluation gives each (task, sample) the same request seed
(common random numbers), so a stage's difference to SFT is paired per rollout: the table gives
it with its standard error over (seed, task) units, and says whether it is significant
(|mean| > 2 SE).

Each RL step is checkpointed (model, optimizer, prompt order), and the shared stages and the
evaluations are recorded in ``OUT/curve.json`` as they finish: ``--resume`` carries on a run
that was cut short, so a long curve can be split across sessions. The PNG (held-out success
with its SE band beside the SFT line; each step's final-epoch approx KL against the target
band) and the JSON go to bench/results/.

    .venv/bin/python bench/learning_curve.py --domain swe --seeds 0 1 2 --steps 20 \\
        --out runs/curve-swe --tag swe [--resume]
    .venv/bin/python bench/learning_curve.py --domain bugfix --model smollm2 ... --tag smollm2
    .venv/bin/python bench/learning_curve.py --sweep --rl lr=1e-5 --rl lr=3e-5 --steps 2 ...

A run whose SFT checkpoint was lost (with the machine that held ``OUT/``) cannot add seeds
from that checkpoint. Its remaining seeds then run in a new ``--out`` on a rebuilt checkpoint,
which is evaluated there; ``--report-only --merge NEW_OUT`` adds them to the curve, each
paired against its own checkpoint's SFT evaluation (the per-seed rows say which).

``--sweep`` runs each ``--rl`` setting (see bench/learning.py) for ``--steps`` steps from the
SFT checkpoint without evaluations, and reports each step's final-epoch KL and clip fraction.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import statistics
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from common import (  # noqa: E402
    RESULTS_DIR,
    BenchServer,
    base_parser,
    finish,
    print_table,
    write_json,
)
from learning import Clock, pct, rl_setting  # noqa: E402

from orchard.domains import demo_domain  # noqa: E402
from orchard.env.client import SandboxClient  # noqa: E402
from orchard.eval.paired import paired_difference, pooled_difference, rollout_outcomes  # noqa: E402
from orchard.recipes.demo import Demo, DemoConfig, copy_model, pretrained  # noqa: E402
from orchard.recipes.models import served_weights, with_lora  # noqa: E402
from orchard.recipes.policy_server.server import PolicyServer  # noqa: E402
from orchard.recipes.policy_server.weight_sync import (  # noqa: E402
    FolderSync,
    RemotePolicy,
    ServedPolicy,
)

KL_BAND = (1e-3, 3e-2)
"""Where a step's final-epoch approx KL should land (the sweep's target)."""
STEP_KEYS = ("step", "groups", "rollouts", "resolved_rate", "approx_kl", "clip_fraction",
             "ratio_std", "entropy", "grad_norm", "seconds", "warnings")


class Curve:
    """The run's stages, each recorded in OUT/curve.json once done, so a resumed run skips it."""

    def __init__(self, args: Any, client: SandboxClient) -> None:
        self.args, self.client, self.clock = args, client, Clock()
        self.path = args.out / "curve.json"
        self.state: dict[str, Any] = (json.loads(self.path.read_text()) if self.path.exists()
                                      else {"shared": {}, "seeds": {}, "sweep": {}})
        config = DemoConfig(domain=args.domain, seed=args.data_seed, lora_rank=args.lora_rank,
                            device=args.device, concurrency=args.concurrency)
        if args.model:
            config = pretrained(replace(config, model=args.model))
        config = replace(config, n_train=args.n_train, n_test=args.n_test, eval_n=args.eval_n)
        if args.sft_steps:
            config.sft = replace(config.sft, max_steps=args.sft_steps)
        self.config = config
        self.log = print if not args.quiet else (lambda _: None)

    def save(self) -> None:
        self.path.write_text(json.dumps(self.state, indent=1))

    def demo(self, folder: str, **changes: Any) -> Demo:
        (self.args.out / folder).mkdir(parents=True, exist_ok=True)
        return Demo(self.args.out / folder, replace(self.config, **changes), self.client,
                    self.log, domain=demo_domain(self.config.domain))

    @contextlib.contextmanager
    def serving(self, demo: Demo, model: torch.nn.Module, served: torch.nn.Module,
                tokenizer: Any, seed: int) -> Iterator[ServedPolicy]:
        """The policy's server: in-process over ``served``, or with --engine-url the engine
        in another process (SGLang, an orchard policy server), given ``model``'s weights."""
        args = self.args
        if not args.engine_url:
            with PolicyServer(served, tokenizer, seed=seed) as server:
                yield server
            return
        sync = FolderSync(args.engine_url, args.out / "weights", kind=args.engine_kind,
                          tokenizer_dir=demo.tokenizer_dir, key=args.engine_key)
        remote = RemotePolicy(args.engine_url, args.engine_model, sync)
        remote.update(model)
        yield remote

    def model(self, demo: Demo) -> tuple[torch.nn.Module, torch.nn.Module, Any]:
        """(the model to train, the server's copy, the tokenizer), untrained."""
        model, tokenizer = demo.load_model()
        served = copy_model(model)
        if self.config.lora_rank:
            model = with_lora(model, self.config.lora_rank)
        return model, served, tokenizer

    def evaluate(self, demo: Demo, server: ServedPolicy, name: str) -> dict[str, Any]:
        """A held-out evaluation with each rollout's outcome; a partial one of a dead run is
        stale (other weights), so it starts afresh."""
        shutil.rmtree(demo.out / f"eval-{name}", ignore_errors=True)
        with self.clock(f"{demo.out.name}/eval {name}"):
            stage = demo.evaluate_policy(server, name)
        stage["outcomes"] = rollout_outcomes(demo.out / f"eval-{name}")
        return stage

    def shared(self) -> dict[str, torch.Tensor]:
        """Teacher, values, SFT (its checkpoint), and the base and SFT evaluations."""
        shared, checkpoint = self.state["shared"], self.args.out / "shared" / "sft.pt"
        demo = self.demo("shared")
        model, served, tokenizer = self.model(demo)
        with self.serving(demo, model, served, tokenizer, self.config.seed) as server:
            if "base" not in shared and not self.args.sweep:
                shared["base"] = self.evaluate(demo, server, "base")
                self.save()
            if not checkpoint.exists():
                with self.clock("teacher"):
                    run = demo.teacher()
                with self.clock("values"):
                    examples = demo.sft_data(run, demo.values(run), tokenizer)
                with self.clock("sft"):
                    demo.sft(model, examples, server)
                shared["sft_run"] = {k: demo.results[k] for k in ("teacher", "values",
                                                                  "sft_data", "sft")}
                torch.save(model.state_dict(), checkpoint)
                self.save()
            state = torch.load(checkpoint, weights_only=True)
            if "sft" not in shared and not self.args.sweep:
                model.load_state_dict(state)
                server.update(model)
                shared["sft"] = self.evaluate(demo, server, "sft")
                self.save()
            if self.args.format_control and "format" not in shared and not self.args.sweep:
                shared["format"] = self.format_control(demo, server)
                self.save()
        return state

    def format_control(self, demo: Demo, server: ServedPolicy) -> dict[str, Any]:
        """The untrained policy after SFT, with SFT's settings, on format-correct calls that
        fix nothing (one a training task): what the format alone is worth."""
        from orchard.domains.swe.format_control import format_control_examples

        model, _, tokenizer = self.model(demo)
        examples = format_control_examples(demo.train, tokenizer, seed=self.config.seed)
        with self.clock("format sft"):
            log = demo.sft(model, examples, server)
        stage = self.evaluate(demo, server, "format")
        stage["sft"] = {"examples": len(examples), "steps": len(log),
                        "last_loss": log[-1]["loss"]}
        return stage

    def seed(self, seed: int, sft: dict[str, torch.Tensor]) -> None:
        """``--steps`` RL steps of one seed from the SFT checkpoint, evaluated every
        ``--eval-every`` steps."""
        args = self.args
        record = self.state["seeds"].setdefault(str(seed), {"evals": {}, "steps": []})
        folder = f"seed-{seed}"
        demo = self.demo(folder)
        model, served, tokenizer = self.model(demo)
        model.load_state_dict(sft)
        served.load_state_dict(served_weights(model))
        config = replace(rl_setting(args.rl[0], self.config.rl), steps=args.steps, seed=seed,
                         concurrency=args.concurrency)

        def after(step: dict[str, Any]) -> None:
            record["steps"] = [r for r in record["steps"] if r["step"] < step["step"]]
            record["steps"].append({k: step[k] for k in STEP_KEYS if k in step})
            done = step["step"] + 1
            if done % args.eval_every == 0 or done == args.steps:
                record["evals"][str(done)] = self.evaluate(demo, server, f"step-{done:03d}")
                self.log(f"  seed {seed} after step {done}: held-out resolved "
                         f"{record['evals'][str(done)]['resolved_rate']:.1%}")
            self.save()

        with self.serving(demo, model, served, tokenizer, seed) as server, \
                self.clock(f"rl seed {seed}"):
            demo.rl(model, server, config, name="rl", resume=args.resume, on_step=after)

    def sweep(self, sft: dict[str, torch.Tensor]) -> None:
        """Each --rl setting for --steps steps from the SFT checkpoint, without evaluations."""
        for spec in self.args.rl:
            if spec in self.state["sweep"]:
                continue
            demo = self.demo(f"sweep-{spec or 'demo'}")
            model, served, tokenizer = self.model(demo)
            model.load_state_dict(sft)
            served.load_state_dict(served_weights(model))
            config = replace(rl_setting(spec, self.config.rl), steps=self.args.steps,
                             concurrency=self.args.concurrency)
            with self.serving(demo, model, served, tokenizer, 0) as server:
                steps = demo.rl(model, server, config, name="rl", resume=self.args.resume)
            self.state["sweep"][spec] = [{k: r[k] for k in STEP_KEYS if k in r} for r in steps]
            self.save()


# --- statistics ------------------------------------------------------------------------------


def merge(state: dict[str, Any], folders: list[Path]) -> dict[str, Any]:
    """``state`` with the seeds of the runs in ``folders``: the same setting, on an SFT
    checkpoint rebuilt after the first was lost. Each such seed carries that run's SFT
    evaluation (its reference) and SFT statistics."""
    seeds = dict(state["seeds"])
    for folder in folders:
        path = folder / "curve.json"
        if not path.is_file():
            raise SystemExit(f"--merge {folder}: no curve.json there; give the --out of a run")
        other = json.loads(path.read_text())
        sft = other["shared"].get("sft")
        if sft is None:
            raise SystemExit(f"--merge {folder}: its SFT checkpoint is not evaluated yet, so its "
                             "seeds have nothing to pair with; --resume that run first")
        for seed, record in other["seeds"].items():
            if seed in seeds:
                raise SystemExit(f"--merge {folder}: seed {seed} is in two runs; merge only "
                                 "runs of different seeds")
            seeds[seed] = {**record, "sft": sft, "sft_run": other["shared"].get("sft_run")}
    return {**state, "seeds": seeds}


def summarize(state: dict[str, Any]) -> dict[str, Any]:
    """Per evaluated step: each seed's rate, their mean and SE, and the paired gain over SFT
    (each seed against the SFT checkpoint it started from); per RL step: the update
    statistics, averaged over seeds."""
    shared, seeds = state["shared"], state["seeds"]
    sft = shared.get("sft")
    points: dict[str, Any] = {}
    for step in sorted({int(k) for s in seeds.values() for k in s["evals"]}):
        pairs = [(s["evals"][str(step)], s.get("sft", sft)) for s in seeds.values()
                 if str(step) in s["evals"]]
        rates = [e["resolved_rate"] for e, _ in pairs]
        points[str(step)] = {
            "rates": rates, "mean": statistics.fmean(rates),
            "se_seeds": statistics.stdev(rates) / math.sqrt(len(rates)) if len(rates) > 1
            else float("nan"),
            "sft": statistics.fmean(r["resolved_rate"] for _, r in pairs) if sft else None,
            "minus_sft": pooled_difference([(e["outcomes"], r["outcomes"]) for e, r in pairs])
            .as_dict() if sft else None}
    steps: dict[str, Any] = {}
    for record in (r for s in seeds.values() for r in s["steps"]):
        steps.setdefault(str(record["step"]), []).append(record)
    step_means = {step: {k: statistics.fmean(r[k] for r in rs if k in r)
                         for k in STEP_KEYS[2:-2] if any(k in r for r in rs)}
                  | {"warnings": sum(len(r.get("warnings", ())) for r in rs), "seeds": len(rs)}
                  for step, rs in steps.items()}
    out: dict[str, Any] = {"points": points, "steps": step_means}
    for name in ("base", "sft", "format"):
        if name in shared:
            out[name] = {"resolved_rate": shared[name]["resolved_rate"],
                         "rollouts": shared[name]["rollouts"]}
    out["sft_rebuilt"] = {seed: {"resolved_rate": s["sft"]["resolved_rate"],
                                 "rollouts": s["sft"]["rollouts"]}
                          for seed, s in seeds.items() if "sft" in s}
    for ref in ("base", "format"):
        if ref in shared and sft:
            out[f"sft_minus_{ref}"] = paired_difference([sft["outcomes"]],
                                                        shared[ref]["outcomes"]).as_dict()
    return out


# --- report ---------------------------------------------------------------------------------


def report(args: Any, results: dict[str, Any]) -> None:
    summary = results["summary"]
    if args.sweep:
        rows = [[spec or "demo", r["step"], f"{r.get('approx_kl', float('nan')):.1e}",
                 pct(r.get("clip_fraction", float("nan"))), f"{r.get('ratio_std', 0):.3f}",
                 f"{r.get('entropy', 0):.2f}", pct(r["resolved_rate"]), r["groups"]]
                for spec, steps in results["sweep"].items() for r in steps]
        print_table(f"RL settings for --steps {args.steps} steps from SFT (target: KL "
                    f"{KL_BAND[0]:g}..{KL_BAND[1]:g}, clip 1-10%)",
                    ["setting", "step", "final KL", "clip %", "ratio std", "entropy",
                     "sampled resolved %", "groups"], rows)
        return
    rows = []
    for name in ("base", "format", "sft"):
        if name in summary:
            rows.append([name, "", pct(summary[name]["resolved_rate"]), "", ""])
    for seed, s in summary.get("sft_rebuilt", {}).items():
        rows.append([f"sft rebuilt (seed {seed}'s)", "", pct(s["resolved_rate"]), "", ""])
    for ref in ("base", "format"):
        if d := summary.get(f"sft_minus_{ref}"):
            rows.append([f"SFT - {ref} (paired)", "", f"{pct(d['mean'])} ± {pct(d['se'])}",
                         "", "yes" if d["significant"] else "no"])
    for step, p in summary["points"].items():
        d = p["minus_sft"]
        rows.append([f"RL step {step}", " ".join(pct(r) for r in p["rates"]), pct(p["mean"]),
                     f"{pct(d['mean'])} ± {pct(d['se'])}" if d else "",
                     ("yes" if d["significant"] else "no") if d else ""])
    print_table(f"held-out {args.domain} tasks, resolved % ({args.n_test} tasks x "
                f"{args.eval_n} samples, same request seeds at every stage; RL seeds "
                f"{' '.join(map(str, args.seeds))})",
                ["stage", "each seed", "mean", "minus SFT (paired, ± SE)", "|d| > 2 SE"], rows)
    print_table("RL steps (final epoch, mean over seeds)",
                ["step", "final KL", "clip %", "ratio std", "entropy", "grad norm",
                 "sampled resolved %", "warnings"],
                [[s, f"{m.get('approx_kl', float('nan')):.1e}",
                  pct(m.get("clip_fraction", float("nan"))), f"{m.get('ratio_std', 0):.3f}",
                  f"{m.get('entropy', 0):.2f}", f"{m.get('grad_norm', 0):.2f}",
                  pct(m["resolved_rate"]), m["warnings"]]
                 for s, m in sorted(summary["steps"].items(), key=lambda kv: int(kv[0]))])


def draw(args: Any, state: dict[str, Any], summary: dict[str, Any], path: Path) -> None:
    """Held-out success against RL step (mean over seeds, paired SE band, each seed thin)
    beside the base/format/SFT lines; each step's final-epoch KL against the target band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    sft = summary.get("sft", {}).get("resolved_rate")
    for name, style in (("base", ":"), ("format", "-."), ("sft", "--")):
        if name in summary:
            a.axhline(summary[name]["resolved_rate"], ls=style, color="gray", label=name)
    for seed, s in summary.get("sft_rebuilt", {}).items():
        a.axhline(s["resolved_rate"], ls="--", lw=0.7, color="gray",
                  label=f"sft rebuilt (seed {seed})")
    points = summary["points"]
    if points and sft is not None:
        steps = [0, *map(int, points)]
        # Each point is its seeds' SFT plus their paired gain: seeds may differ in checkpoint.
        mean = [next(iter(points.values()))["sft"],
                *(p["sft"] + p["minus_sft"]["mean"] for p in points.values())]
        se = [0.0, *(p["minus_sft"]["se"] for p in points.values())]
        a.plot(steps, mean, marker="o", color="#4c72b0", label="SFT + BAR RL (mean of seeds)")
        a.fill_between(steps, [m - s for m, s in zip(mean, se, strict=True)],
                       [m + s for m, s in zip(mean, se, strict=True)], color="#4c72b0",
                       alpha=0.2, label="± 1 paired SE")
        for record in state["seeds"].values():
            evals = sorted((int(k), v["resolved_rate"]) for k, v in record["evals"].items())
            start = record.get("sft", {}).get("resolved_rate", sft)
            a.plot([0, *(k for k, _ in evals)], [start, *(v for _, v in evals)], lw=0.7,
                   alpha=0.5, color="#4c72b0")
    a.set(title=f"held-out success ({args.n_test} tasks x {args.eval_n})", xlabel="RL step",
          ylabel="resolved rate", ylim=(0, 1))
    a.legend(fontsize=8)
    b.axhspan(*KL_BAND, color="green", alpha=0.1, label="target")
    for seed, record in state["seeds"].items():
        kl = [(r["step"] + 1, r["approx_kl"]) for r in record["steps"] if "approx_kl" in r]
        b.plot([s for s, _ in kl], [max(v, 1e-8) for _, v in kl], marker=".",
               label=f"seed {seed}")
    b.set(title="final-epoch approx KL per step", xlabel="RL step", yscale="log")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--domain", choices=("swe", "bugfix", "bugfix-read"), default="swe")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--rl", action="append", help="an RL setting (bench/learning.py's "
                        "form); one for a curve, several for --sweep")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--format-control", action="store_true",
                        help="also SFT the untrained policy on format-only calls and evaluate it")
    parser.add_argument("--n-train", type=int, default=128)
    parser.add_argument("--n-test", type=int, default=48)
    parser.add_argument("--eval-n", type=int, default=2)
    parser.add_argument("--data-seed", type=int, default=0,
                        help="tasks, teacher and SFT: the part every RL seed shares")
    parser.add_argument("--sft-steps", type=int, default=0, help="0: the demo's")
    parser.add_argument("--model", help="a causal-LM folder, or smollm2 (default: the tiny "
                        "random-init Llama)")
    parser.add_argument("--lora-rank", type=int, default=0)
    parser.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda if there is one)")
    parser.add_argument("--concurrency", type=int, default=2, help="rollouts at once")
    parser.add_argument("--engine-url", help="serve the policy from this engine in another "
                        "process (its base URL) instead of in-process; weights go to it as "
                        "folders under OUT/weights")
    parser.add_argument("--engine-kind", choices=("orchard", "sglang"), default="sglang")
    parser.add_argument("--engine-model", default="policy",
                        help="the model name the engine serves")
    parser.add_argument("--engine-key", help="the engine's admin key (weight loading)")
    parser.add_argument("--out", type=Path, default=Path("runs/curve"))
    parser.add_argument("--resume", action="store_true",
                        help="carry on the run in --out where it stopped")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--report-only", action="store_true",
                        help="write the JSON and PNG of what OUT/curve.json holds, run nothing")
    parser.add_argument("--merge", type=Path, action="append", default=[],
                        help="with --report-only: add the seeds of this run (the same setting "
                        "on a rebuilt SFT checkpoint), each paired against its own SFT")
    args = parser.parse_args()
    args.rl = args.rl or [""]
    if len(args.rl) > 1 and not args.sweep:
        raise SystemExit("a curve runs one --rl setting; give several only with --sweep")
    for spec in args.rl:
        rl_setting(spec, DemoConfig().rl)  # a typo fails now, not after an hour of training
    if args.quick:
        args.seeds, args.steps, args.eval_every = args.seeds[:2], 2, 1
        args.n_train, args.n_test, args.eval_n = 16, 4, 1
        args.sft_steps = args.sft_steps or 20
    if args.model == "smollm2":
        from orchard.recipes.models import smollm2_dir

        args.model = str(smollm2_dir())
    if args.merge and not args.report_only:
        raise SystemExit("--merge combines finished runs: give it with --report-only")
    if args.out.exists() and any(args.out.iterdir()) and not (args.resume or args.report_only):
        raise SystemExit(f"{args.out} holds a run: --resume it or give a new --out")
    if args.report_only:
        if not (args.out / "curve.json").is_file():
            raise SystemExit(f"{args.out} holds no curve.json: give the --out of a run")
        state = merge(json.loads((args.out / "curve.json").read_text()), args.merge)
        publish(args, state, {})
        report(args, {**state, "summary": summarize(state)})
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    server = BenchServer()
    with server, SandboxClient(server.url, timeout=600) as client:
        torch.set_num_threads(1)
        curve = Curve(args, client)
        sft = curve.shared()
        if args.sweep:
            curve.sweep(sft)
        else:
            for seed in args.seeds:
                curve.seed(seed, sft)
    results = publish(args, curve.state, curve.clock.seconds)
    return finish("learning_curve", args, results, server, report)


def publish(args: Any, state: dict[str, Any], seconds: dict[str, float]) -> dict[str, Any]:
    """The results as far as they go: the JSON and (for a curve) the PNG."""
    results = {**state, "summary": summarize(state), "seconds": seconds}
    name = f"learning_curve-{args.tag}" if args.tag else "learning_curve"
    if not args.sweep:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        draw(args, state, results["summary"], RESULTS_DIR / f"{name}.png")
    write_json("learning_curve", args, results)
    return results


if __name__ == "__main__":
    sys.exit(main())
