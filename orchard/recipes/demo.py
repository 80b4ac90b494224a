"""The whole pipeline on one machine: teacher trajectories -> credit-assignment SFT -> BAR RL ->
held-out evaluation, with real sandboxes, the real harness and proxy, and real grading.

Stages (each writes under ``out``):
1. ``teacher/``: the scripted teacher through mini-swe-agent on the training tasks; it solves
   a share of them, and on the others either breaks its own fix or makes a wrong one.
2. ``values.jsonl``: Monte-Carlo value curves of the unresolved trajectories (replay to each
   step, let a teacher that solves with probability ``mc_solve`` carry on ``mc_k`` times).
3. ``sft.jsonl``: resolved trajectories whole, unresolved ones only inside rise segments.
4. ``eval-base/``, ``eval-sft/``, ``eval-sft_rl/``: the policy on the held-out tasks
   (``eval_n`` samples each) before training, after SFT, after SFT + RL; ``rl/``: the RL steps
   (none, and no ``eval-sft_rl/``, when ``rl.steps`` is 0).
5. Reranking: a value model trained on the graded rollouts of training tasks (teacher, RL)
   and the policy's own likelihood each pick one of the last stage's ``eval_n`` held-out
   candidates per task; against a random and an oracle pick.
6. ``results.json`` (per stage: resolved rate and pass@k on held-out tasks, seeds, wall
   times; the reranking report) and ``learning_curve.png``; ``metrics.jsonl`` and the other
   ``report_to`` backends' files (``orchard.recipes.reporting``) as each step ends.

The policy is a tiny random-init Llama with the project's real BPE tokenizer, or any causal LM
folder given as ``model`` (e.g. SmolLM2-135M-Instruct from ``orchard.recipes.models.
smollm2_dir()``); only the model and its serving change.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch

from orchard.env.client import SandboxClient
from orchard.eval.evaluate import evaluate
from orchard.eval.harness import Harness
from orchard.eval.paired import paired_difference, rollout_outcomes
from orchard.eval.runner import RunConfig
from orchard.recipes.bar import BARConfig
from orchard.recipes.credit import RetrospectiveAnnotator
from orchard.recipes.demo_view import PAIRS, StageProgress, draw_stages
from orchard.recipes.domains import DemoDomain
from orchard.recipes.loop import torch_threads
from orchard.recipes.models import load_policy, tiny_llama, with_lora
from orchard.recipes.montecarlo import MonteCarloAnnotator
from orchard.recipes.policy_server.server import PolicyServer
from orchard.recipes.policy_server.weight_sync import ServedPolicy
from orchard.recipes.reporting import Reporter, open_reporters, section
from orchard.recipes.rerank import (
    ValueModel,
    ValueModelConfig,
    known_fixes,
    likelihood_rerank,
    rerank_run,
    training_examples,
)
from orchard.recipes.rl import RLConfig, train_rl
from orchard.recipes.sft import (
    SFTConfig,
    build_sft_dataset,
    save_examples,
    sft_steps,
    sft_train,
)
from orchard.recipes.trajectories import load_trajectories
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
from orchard.testing.policies import Policy
from orchard.testing.teacher import FunctionPolicy, TeacherServer

COMPACT_CONFIG = Path(__file__).parent / "data" / "compact.yaml"
PRETRAINED_RL_LR = 5e-6
"""RL's rate for SmolLM2-135M (full fine-tuning, float32, 4 PPO epochs x 2 minibatches).
Swept from one SFT checkpoint, one BAR step each (bench/results/learning_curve-smollm2-
sweep.json): final-epoch KL 7.8e-3 at 2e-6, 1.2e-2 at 3.5e-6, 1.3e-2 at 5e-6, clip 0.4-0.5%;
on the demo's 16-step SFT checkpoints 5e-6 gave KL 3.0e-2 and 3.3e-2, clip 2.3% and 4.1%."""


@dataclass
class DemoConfig:
    domain: str = "swe"
    """The demo adapter's name in ``orchard.domains``' registry. swe: the generated settings
    family with mini-swe-agent; bugfix: the bug-fix family (fixes read in the sandbox) with
    mini-swe-agent; web: the bundled web tasks with the browser agent; assistant: the
    assistant tasks with the tool-calling assistant. Web and assistant Monte-Carlo
    continuations replay each state. The adapter's ``configure`` sets its measured presets."""
    n_train: int = 128
    n_test: int = 16
    seed: int = 0
    teacher_solve: float = 0.6
    values: Literal["montecarlo", "retrospective", "none"] = "montecarlo"
    """How the teacher's failed rollouts are valued: Monte-Carlo continuations, a
    retrospective LLM judge (``values_judge_url``), or not at all (SFT on resolved rollouts
    only: the ablation of credit assignment)."""
    values_judge_url: str | None = None
    """"scripted" (the domain's ``values_judge``: SWE families) or an OpenAI base URL."""
    values_judge_model: str = "judge"
    mc_k: int = 2
    """Continuations per key state."""
    mc_solve: float = 0.5
    """How often the continuation teacher solves from where it is handed over."""
    mc_max: int = 10
    """Unresolved trajectories to annotate (the rest are not trained on)."""
    mc_restore: Literal["fork", "replay"] = "fork"
    """How each continuation gets s_t: "fork" (one replay, k forks) or "replay" (k replays);
    web tasks always replay."""
    eps: float = 0.05
    eval_n: int = 4
    eval_seed: int = 0
    """Common random numbers: every held-out evaluation gives sample k of a task the same
    request seeds (``RunConfig.sampling_seed``), so stages differ only by their weights and
    their differences pair up rollout by rollout."""
    model: str | None = None
    """A causal-LM folder; None: a tiny random-init Llama with the test tokenizer."""
    tiny_hidden: int = 128
    tiny_layers: int = 2
    # Measured on the demo's data (64 held-out rollouts a run): 40 optimizer steps learn the
    # turns' shape but not which constant to fix (0%); 200 steps on 48 tasks gave 34-56%, 400
    # steps on 128 tasks 69-78% (five runs).
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(lr=3e-3, epochs=1000, max_steps=400,
                                                             batch_size=8, warmup=20))
    # lr: swept from the SFT checkpoint with 4 PPO epochs x 2 minibatches, 2 steps each
    # (bench/results/learning_curve-swe-sweep.json). The final-epoch approx KL was 7e-4 and
    # 7e-5 at 1e-5 (inert), 5e-3 and 3e-4 at 3e-5, 2.0e-2 and 1.9e-2 at 1e-4 (clip 1.4% and
    # 2.0%), 2.5e-2 and 4.9e-2 at 3e-4. 1e-4 is the rate whose steps land in KL 1e-3..3e-2
    # and clip 1-10%.
    rl: RLConfig = field(default_factory=lambda: RLConfig(
        steps=2, batch_prompts=4, bar=BARConfig(n=4, n_max=8, stride=4), lr=1e-4))
    value: ValueModelConfig = field(default_factory=lambda: ValueModelConfig(
        max_tokens=256, lr=3e-3, epochs=12, batch_size=8))
    """The value model of the reranking stage (a tiny Llama with the policy's tokenizer)."""
    concurrency: int = 2
    threads: int = 1
    """torch intra-op threads while sandboxes run (serving, RL)."""
    solo_threads: int | None = None
    """torch intra-op threads for the stages that run alone (SFT, reranking); None: every
    core."""
    device: str | None = None
    """Where the policy trains and is served ("cpu", "cuda", "cuda:1"); None: cuda when there
    is one, else cpu. The value model follows it."""
    lora_rank: int = 0
    """0: full fine-tuning; else SFT and RL train LoRA adapters of this rank (peft) on every
    linear layer, and the server serves the merged weights."""
    judge: str | None = None
    """Assistant domain: a rubric judge for the policy's rollouts (evaluation and RL), whose
    reward base + 0.5 J gives BAR's advantages. "scripted": the domain's scripted judge on a local
    server; otherwise an OpenAI base URL serving ``judge_model``."""
    judge_model: str = "judge"
    report_to: list[str] = field(default_factory=lambda: ["jsonl"])
    """Where each step's metrics go as the run goes (``orchard.recipes.reporting``): jsonl
    (``metrics.jsonl``), tensorboard, wandb, trackio, all or none."""


def pretrained(config: DemoConfig) -> DemoConfig:
    """``config`` for a pretrained policy (``config.model``), sized for `make demo`:
    SmolLM2-135M on the bug-fix family's operator and string bugs, meant to end within 15
    minutes on 2 CPU cores. 64 training tasks feed the teacher; 12 held-out tasks x 2 samples
    (two candidates for the rerank stage to pick from), the same request seeds at every stage
    (paired). 8 rollouts at once: the server decodes them as one batch, 58 tokens/s against
    32 for 4 (a decoding step reads every float32 weight, so it costs about the same for 1
    row or 8). SFT: 16 steps of batch 4 at 2e-4, the rate that teaches the tool-call format
    (20 steps of 2 teacher conversations took the loss from 1.8 to 0.05, where 3 steps at
    1e-5 left it writing prose; the tiny model's 3e-3 would wreck it).

    No RL step: on 2 cores one step of 2 prompts took 546 s, its held-out evaluation 182 s,
    and it moved held-out success by 0 of 12 (runs/demo-quiet, 2026-12-06). ``rl.steps``
    (``orchard demo --rl-steps 1``) adds it: one step of 2 prompts, 4 PPO epochs x 2
    minibatches at PRETRAINED_RL_LR. Benchmarks set their own sizes."""
    return replace(config, n_train=64, n_test=12, eval_n=2, mc_max=4, concurrency=8,
                   sft=replace(config.sft, lr=2e-4, epochs=1000, max_steps=16, batch_size=4,
                               warmup=2),
                   rl=replace(config.rl, lr=PRETRAINED_RL_LR, steps=0, batch_prompts=2,
                              ppo_epochs=4, minibatches=2, concurrency=4))


def _stage_summary(summary: dict[str, Any], seconds: float) -> dict[str, Any]:
    overall = summary["overall"]
    return {"resolved_rate": overall["resolved_rate"], "pass_at_k": overall["pass_at_k"],
            "rollouts": overall["rollouts"], "failures": overall.get("failures", {}),
            "exit_statuses": overall.get("exit_statuses", {}), "seconds": seconds}


class Demo:
    """The pipeline's stages as methods, so each can be read (and rerun) on its own."""

    def __init__(self, out: Path, config: DemoConfig, client: SandboxClient,
                 log: Callable[[str], None] = print, *, domain: DemoDomain,
                 progress: StageProgress | None = None) -> None:
        self.out, self.config, self.client, self.log = out, config, client, log
        self.progress = progress
        self.report: Reporter | None = None  # run() opens config.report_to's backends
        self._advance: Callable[..., None] = lambda n=1: None
        self.domain = domain  # config.domain's adapter: orchard.domains.demo_domain
        self.tasks = self.domain.tasks(config.n_train, config.n_test, config.seed)
        self.train = [t for t in self.tasks if t.split == "train"][:config.n_train]
        self.test = [t for t in self.tasks if t.split == "test"][:config.n_test]
        self.results: dict[str, Any] = {"config": _jsonable(asdict(config)), "stages": {},
                                        "seconds": {}}

    def _timed(self, name: str, fn: Callable[[], Any], total: int | None = None,
               unit: str = "") -> Any:
        """Run a stage: its wall time goes to the results, its units (``total`` of them)
        advance its progress bar."""
        self.log(f"[{name}] ...")
        started = time.monotonic()
        with (self.progress.stage(name, total, unit) if self.progress is not None
              else contextlib.nullcontext(lambda n=1: None)) as advance:
            self._advance = advance
            value = fn()
        self.results["seconds"][name] = round(time.monotonic() - started, 2)
        self.log(f"[{name}] done in {self.results['seconds'][name]:.1f} s")
        return value

    def _alone(self) -> contextlib.AbstractContextManager[None]:
        """torch on ``solo_threads`` (every core) for a stage that has the machine to itself."""
        return torch_threads(self.config.solo_threads or 0)

    def _policy_harness(self, server: ServedPolicy) -> Harness:
        """The harness the policy runs in, calling ``server`` through the recording proxy."""
        return self.domain.policy(server.url or "", server.model_name,
                                  self.tokenizer_dir)

    def teacher(self) -> Path:
        run = self.out / "teacher"
        harness = self.domain.teacher(self.train, self.config.teacher_solve)
        summary = evaluate(self.train, harness, run, self.client,
                           config=RunConfig(out=run, concurrency=self.config.concurrency),
                           on_result=lambda _: self._advance())
        self.results["teacher"] = _stage_summary(summary, 0.0)
        return run

    def values(self, run: Path) -> dict[str, list[tuple[int, int]]]:
        """Value curves of the teacher's failed rollouts, as ``config.values`` says, and their
        rise segments (what SFT learns from them)."""
        trajectories = [t for t in load_trajectories(run) if not t.resolved]
        trajectories = trajectories[:self.config.mc_max]
        if self.config.values == "none":  # the ablation: SFT on resolved rollouts only
            self.results["values"] = {"annotated": 0, "with_rise": 0, "source": "none"}
            return {}
        with contextlib.ExitStack() as stack:
            f = stack.enter_context((self.out / "values.jsonl").open("w", encoding="utf-8"))
            annotator = self._annotator(stack)
            segments: dict[str, list[tuple[int, int]]] = {}
            for traj in trajectories:
                curve = annotator.annotate(traj)
                self._advance()
                segments[traj.rollout_id] = curve.rise_segments(self.config.eps)
                f.write(json.dumps({"rollout_id": traj.rollout_id, "values": curve.values,
                                    "key_steps": curve.key_steps,
                                    "rise_segments": segments[traj.rollout_id]}) + "\n")
        self.results["values"] = {"annotated": len(trajectories),
                                  "with_rise": sum(1 for s in segments.values() if s),
                                  "source": self.config.values}
        return segments

    def _annotator(self, stack: contextlib.ExitStack) -> Any:
        if self.config.values == "retrospective":
            url = self.config.values_judge_url
            if not url:
                raise ValueError("values='retrospective' needs values_judge_url: 'scripted' "
                                 "or the OpenAI base URL of the judge model")
            if url == "scripted":
                url = _serve(stack, self.domain.values_judge(self.train),
                             self.config.values_judge_model)
            return RetrospectiveAnnotator(url, self.config.values_judge_model)

        policy = self.domain.continuation_policy(self.train, self.config.mc_solve,
                                                 self.config.seed)
        continuation = self.domain.continuation(self.client, _serve(stack, policy, "teacher"),
                                                "teacher")
        return MonteCarloAnnotator(
            self.client, self.train, continuation, k=self.config.mc_k,
            restore="replay" if self.domain.replays else self.config.mc_restore)

    def sft_data(self, run: Path, segments: dict[str, list[tuple[int, int]]], tokenizer: Any
                 ) -> list[Any]:
        examples, dropped = build_sft_dataset(load_trajectories(run), segments, tokenizer)
        save_examples(examples, self.out / "sft.jsonl")
        self.results["sft_data"] = {
            "examples": len(examples), "resolved": sum(e.resolved for e in examples),
            "from_rise_segments": sum(not e.resolved for e in examples),
            "dropped": len(dropped),
            "trained_tokens": sum(sum(e.loss_mask) for e in examples)}
        return examples

    def evaluate_policy(self, server: ServedPolicy, name: str) -> dict[str, Any]:
        run = self.out / f"eval-{name}"
        harness = self._policy_harness(server)
        started = time.monotonic()
        summary = evaluate(self.test, harness, run, self.client,
                           config=RunConfig(out=run, n=self.config.eval_n,
                                            concurrency=self.config.concurrency,
                                            sampling_seed=self.config.eval_seed),
                           on_result=lambda _: self._advance())
        stage = _stage_summary(summary, time.monotonic() - started)
        self.results["stages"][name] = stage
        if (reporter := section(self.report, "eval")) is not None:
            # One point per stage, in order (base 0, sft 1, sft_rl 2): a curve of the stages.
            reporter.log(stage, len(self.results["stages"]) - 1)
        self.log(f"  {name}: resolved {stage['resolved_rate']:.1%} of "
                 f"{stage['rollouts']} held-out rollouts, pass@k {stage['pass_at_k']}")
        return stage

    def rerank(self, tokenizer: Any, *, stage: str, teacher: Path | None = None,
               rl: str = "rl", policy: torch.nn.Module | None = None) -> dict[str, Any]:
        """Best-of-N over the held-out evaluation ``stage``, by a value model trained on the
        graded rollouts of training tasks only (the ``teacher`` run's and those under
        ``rl``), and by the ``policy``'s own mean log-likelihood of each candidate's actions
        (no training), against a random pick, a lookup of those runs' resolved fixes and an
        oracle pick."""
        runs = [teacher or self.out / "teacher",
                *sorted((self.out / rl).glob("step-*/round-*"))]
        value = ValueModel.tiny(tokenizer, replace(self.config.value, device=self.device))
        text_of = self.domain.text_of
        fit = value.train(training_examples(runs, self.train, text_of=text_of),
                          report=self.report)
        report = rerank_run(self.out / f"eval-{stage}", self.test, value, text_of=text_of,
                            fixes=known_fixes(runs))
        overall = report["overall"]
        if policy is not None:
            likely = likelihood_rerank(self.out / f"eval-{stage}", self.test, policy, tokenizer)
            overall["likelihood"] = likely["overall"]["value"]
            report["likelihood"] = likely
        self.results["rerank"] = {"train": fit, "runs": len(runs), **overall}
        if (reporter := section(self.report, "rerank")) is not None:
            reporter.log(overall, 0)
        likelihood = (f"policy-likelihood pick {overall['likelihood']:.1%}, "
                      if "likelihood" in overall else "")
        self.log(f"  best-of-{overall['n']} on held-out tasks: value pick "
                 f"{overall['value']:.1%}, {likelihood}random pick {overall['random']:.1%}, "
                 f"lookup of training fixes {overall['lookup']:.1%}, oracle "
                 f"{overall['oracle']:.1%} (value model: {fit['examples']} graded rollouts of "
                 f"training tasks, {fit['resolved']} resolved)")
        return report

    def run(self) -> dict[str, Any]:
        with contextlib.ExitStack() as stack:
            reporters = stack.enter_context(open_reporters(
                self.config.report_to, self.out, self.out.name, self.results["config"]))
            self.report = reporters
            self.results["reporting"] = reporters.where
            if self.config.judge is not None:
                url = self.config.judge
                if url == "scripted":
                    url = _serve(stack, self.domain.scripted_judge(), self.config.judge_model)
                self.domain = self.domain.judged(url, self.config.judge_model)
            return self._run()

    def load_model(self) -> tuple[torch.nn.Module, Any]:
        """The untrained policy on its device, and its tokenizer."""
        cfg = self.config
        torch.manual_seed(cfg.seed)
        if cfg.model is None:
            self.tokenizer_dir: str | Path = TEST_TOKENIZER
            tokenizer = load_tokenizer(TEST_TOKENIZER)
            model = tiny_llama(tokenizer, hidden_size=cfg.tiny_hidden, layers=cfg.tiny_layers,
                               max_positions=4096, seed=cfg.seed)
        else:
            self.tokenizer_dir = cfg.model
            # float32 master weights: a bf16 weight cannot take an update much below 1/256 of
            # itself, so at a pretrained model's learning rates most AdamW steps would round
            # away. The server's copy is float32 too, so sampled and trained log-probs agree.
            model, tokenizer = load_policy(cfg.model, dtype=torch.float32)
        device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.device = str(device)
        return model.to(device), tokenizer

    def sft(self, model: torch.nn.Module, examples: list[Any], server: ServedPolicy
            ) -> list[dict[str, Any]]:
        """SFT on every core (nothing else runs meanwhile); ``server`` then serves the result."""
        cfg = self.config
        with self._alone():
            log = sft_train(model, examples, cfg.sft, on_step=lambda _: self._advance(),
                            report=self.report)
        model.eval()
        server.update(model)
        self.results["sft"] = {"steps": len(log), "first_loss": log[0]["loss"],
                               "last_loss": log[-1]["loss"],
                               "tokens_per_s": _median(m["tokens_per_s"] for m in log)}
        return log

    def rl(self, model: torch.nn.Module, server: ServedPolicy, config: RLConfig | None = None,
           name: str = "rl", *, resume: bool = False,
           on_step: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        """BAR RL from ``model`` as it is (``config``: the demo's unless given), into
        ``out/name``; ``on_step`` runs after each step is logged (an evaluation), ``resume``
        continues a run from its last checkpoint."""

        def step_done(record: dict[str, Any]) -> None:
            self.log(step_line(name, record))
            self._advance()
            if on_step is not None:
                on_step(record)

        log = train_rl(
            model, self.train, self.client, server, self.out / name, config or self.config.rl,
            harness=self._policy_harness(server), on_step=step_done, resume=resume,
            report=self.report)
        self.results[name] = log
        return log

    def _run(self) -> dict[str, Any]:
        cfg = self.config
        # Sandboxes, the proxy and the harness share these cores with torch: more than one
        # intra-op thread then costs far more in contention than it gains (a tiny model's
        # decoding step: ~1 ms on one thread, ~50 ms on two under load).
        torch.set_num_threads(cfg.threads)
        model, tokenizer = self.load_model()
        held_out = len(self.test) * cfg.eval_n
        run = self._timed("teacher", self.teacher, len(self.train), "rollouts")
        segments = self._timed("values", lambda: self.values(run), cfg.mc_max, "rollouts")
        examples = self._timed("sft_data", lambda: self.sft_data(run, segments, tokenizer))
        # The server holds its own copy: generation never sees weights mid-update.
        served = copy_model(model)
        if cfg.lora_rank:
            model = with_lora(model, cfg.lora_rank)
        self.results["model"] = {
            "name": cfg.model or "tiny-llama (random init)", "device": self.device,
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "parameters": sum(p.numel() for p in served.parameters()),
            "trained_parameters": sum(p.numel() for p in model.parameters()
                                      if p.requires_grad), "lora_rank": cfg.lora_rank}
        with PolicyServer(served, tokenizer, seed=cfg.seed) as server:
            self._timed("eval_base", lambda: self.evaluate_policy(server, "base"), held_out,
                        "rollouts")
            sft_log = self._timed("sft", lambda: self.sft(model, examples, server),
                                  sft_steps(cfg.sft, len(examples)), "steps")
            self._timed("eval_sft", lambda: self.evaluate_policy(server, "sft"), held_out,
                        "rollouts")
            # No RL steps: the pipeline ends at SFT (make demo's 15 minutes hold no RL step
            # that could move held-out success measurably; see pretrained()).
            rl_log = []
            if cfg.rl.steps:
                rl_log = self._timed("rl", lambda: self.rl(model, server), cfg.rl.steps,
                                     "steps")
                self._timed("eval_rl", lambda: self.evaluate_policy(server, "sft_rl"),
                            held_out, "rollouts")
        stages = self.results["stages"]
        # Nothing else runs now: the value model and the policy's likelihoods get every core.
        with self._alone():
            self._timed("rerank", lambda: self.rerank(tokenizer, policy=served,
                                                      stage=list(stages)[-1]))
        # Every evaluation drew with the same request seeds (eval_seed): pair them by task.
        outcomes = {name: rollout_outcomes(self.out / f"eval-{name}") for name in stages}
        self.results["paired"] = {
            f"{stage}_minus_{ref}": paired_difference([outcomes[stage]], outcomes[ref]).as_dict()
            for stage, ref in PAIRS if stage in stages}
        self.results["seeds"] = {"tasks": cfg.seed, "model_init": cfg.seed,
                                 "sft": cfg.sft.seed, "rl": cfg.rl.seed, "serving": cfg.seed}
        (self.out / "results.json").write_text(json.dumps(self.results, indent=2),
                                               encoding="utf-8")
        draw_stages(sft_log, rl_log, self.results, self.out / "learning_curve.png")
        return self.results


def step_line(name: str, record: dict[str, Any]) -> str:
    """One RL step in words: its sampling, how far its update moved the policy, warnings."""
    line = (f"  {name} step {record['step']}: {record['groups']} groups, resolved "
            f"{record['resolved_rate']:.0%} of {record['rollouts']} rollouts, mean reward "
            f"{record['mean_reward'] or 0:.2f}")
    if "approx_kl" in record:
        line += (f", final-epoch KL {record['approx_kl']:.1e}, clip "
                 f"{record['clip_fraction']:.1%}")
    if "ref_kl" in record:
        line += f", KL to the reference {record['ref_kl']:.1e}"
    line += f", {record['seconds']:.0f} s"
    return "\n".join([line, *(f"  warning: {w}" for w in record.get("warnings", ()))])


def _serve(stack: contextlib.ExitStack, policy: Policy, model_name: str) -> str:
    """Serve a scripted ``policy`` as an OpenAI-compatible model until ``stack`` closes;
    returns its base URL."""
    server = stack.enter_context(TeacherServer(FunctionPolicy(policy),
                                               load_tokenizer(TEST_TOKENIZER),
                                               model_name=model_name))
    return f"{server.url}/v1"


def copy_model(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of a plain ``model``, on its device and in its dtype, in eval mode."""
    first = next(model.parameters())
    clone = type(model)(model.config)
    clone.load_state_dict(model.state_dict())
    return clone.to(device=first.device, dtype=first.dtype).eval()


def _median(values: Any) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def run_demo(out: Path, config: DemoConfig, *, domain: DemoDomain,
             client: SandboxClient | None = None, log: Callable[[str], None] = print,
             progress: StageProgress | None = None) -> dict[str, Any]:
    """Run the pipeline on ``domain`` (``config.domain``'s adapter) into ``out`` (embedded
    orchestrator unless ``client`` is given), with a bar per stage when ``progress`` is
    given. ``orchard.domains.run_demo`` finds the adapter by the config's name."""
    out.mkdir(parents=True, exist_ok=True)
    if client is not None:
        return Demo(out, config, client, log, domain=domain, progress=progress).run()
    with SandboxClient.local() as local:
        return Demo(out, config, local, log, domain=domain, progress=progress).run()
