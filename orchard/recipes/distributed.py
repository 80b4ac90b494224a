"""SFT across processes and machines with Hugging Face Accelerate (DDP; FSDP and DeepSpeed by
``accelerate config``), the same loop as ``sft_train``.

A run reads SFT examples (``save_examples`` JSONL, e.g. the demo's ``sft.jsonl``) and a policy
folder, trains on every process (each takes its rows of every batch; gradients are averaged
before each step) and the main process writes the trained policy folder. Each process writes
its metrics and a checksum of its final weights to ``out/rank-<i>.json``, which shows that
they agree. The main process also reports each step as ``--report-to`` says
(``orchard.recipes.reporting``; ``out/metrics.jsonl`` by default).

    # two processes on a machine without GPUs (what the tests run; they talk over gloo)
    accelerate launch --multi_gpu --num_processes 2 -m orchard.recipes.distributed \\
        --examples runs/demo/sft.jsonl --model MODEL_DIR --out runs/sft-ddp
    # eight GPUs on one machine
    accelerate launch --multi_gpu --num_processes 8 -m orchard.recipes.distributed \\
        --examples sft.jsonl --model MODEL_DIR --out OUT --lr 1e-5 --batch-size 64 \\
        --report-to tensorboard
    # several machines: --num_machines N --machine_rank R --main_process_ip HOST on each
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from orchard.extras import MissingExtra
from orchard.recipes.models import load_policy, save_policy, served_weights, with_lora
from orchard.recipes.reporting import CHOICES, open_reporters, parse_report_to
from orchard.recipes.sft import SFTConfig, load_examples, sft_train


def weights_digest(model: torch.nn.Module) -> str:
    """A checksum of the weights: equal across processes that hold the same model."""
    h = hashlib.sha256()
    for name, value in sorted(served_weights(model).items()):
        h.update(name.encode())
        h.update(value.detach().to(torch.float32).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def main(argv: Sequence[str] | None = None) -> None:
    from accelerate import Accelerator

    parser = argparse.ArgumentParser(prog="python -m orchard.recipes.distributed",
                                     description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--examples", type=Path, required=True,
                        help="SFT examples as save_examples writes them (JSONL)")
    parser.add_argument("--model", type=Path, required=True, help="a policy folder")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=8, help="rows per step, all processes")
    parser.add_argument("--max-steps", type=int)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--lora-rank", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report-to", action="append", metavar="BACKEND",
                        help=f"where the main process reports each step: {', '.join(CHOICES)}; "
                             "repeat it or separate by commas (default: jsonl)")
    args = parser.parse_args(argv)
    try:  # before the model loads: a typo costs no time
        parse_report_to(args.report_to)
    except (ValueError, MissingExtra) as exc:
        parser.error(str(exc))

    # Without a GPU the processes train on CPUs and talk over gloo.
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    model, tokenizer = load_policy(args.model, dtype=torch.float32)
    if args.lora_rank:
        model = with_lora(model, args.lora_rank)
    examples = load_examples(args.examples)
    config = SFTConfig(lr=args.lr, epochs=args.epochs, batch_size=args.batch_size,
                       max_steps=args.max_steps, warmup=args.warmup, seed=args.seed)
    settings = json.loads(json.dumps(vars(args), default=str))  # paths as text
    with contextlib.ExitStack() as stack:
        # One process reports: the others' metrics are their share of the same steps.
        report = (stack.enter_context(open_reporters(args.report_to, args.out, args.out.name,
                                                     settings))
                  if accelerator.is_main_process else None)
        history = sft_train(model, examples, config, accelerator=accelerator, report=report)
    trained = accelerator.unwrap_model(model)
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"rank": accelerator.process_index, "world": accelerator.num_processes,
              "steps": len(history), "first_loss": history[0]["loss"],
              "last_loss": history[-1]["loss"], "weights": weights_digest(trained),
              "history": history}
    (args.out / f"rank-{accelerator.process_index}.json").write_text(json.dumps(record))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        # A LoRA model is saved merged: the folder is a plain policy any server loads.
        policy = trained.merge_and_unload() if hasattr(trained, "merge_and_unload") else trained
        save_policy(policy, tokenizer, args.out / "policy")
    accelerator.end_training()


if __name__ == "__main__":
    main()
