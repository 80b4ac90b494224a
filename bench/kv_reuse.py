"""The policy server's prefix cache: tokens/s per rollout with and without reusing the keys
and values of a rollout's earlier turns.

``--rollouts`` threads each play one mini-swe-agent-like conversation of ``--turns`` turns over
real HTTP against a ``PolicyServer``: a ChatML system prompt and task, then per turn a sampled
completion (``--max-tokens``, ``ignore_eos``, a seed per rollout and turn) and a shell-like
observation, so turn t+1's prompt is turn t's prompt + completion + observation. The same
conversations (same seeds, so the same tokens: the script checks) run against a server with
``max_cached_tokens=0`` (every prompt prefilled from scratch, as before the cache) and one with
the cache, interleaved ``--rounds`` times, for the tiny random-init Llama and, when it loads,
SmolLM2-135M (float32). The table gives the median over rollouts of generated tokens per
second of a rollout's wall time, the ratio, and the prompt tokens the cache saved.

    .venv/bin/python bench/kv_reuse.py [--models tiny,smollm2] [--quick]
"""

from __future__ import annotations

import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
import torch  # noqa: E402
from common import base_parser, print_table, write_json  # noqa: E402

from orchard.recipes.models import load_policy, smollm2_dir, tiny_llama  # noqa: E402
from orchard.recipes.policy_server.server import PolicyServer  # noqa: E402
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer  # noqa: E402

SYSTEM = (
    "You are a helpful assistant that can interact with a computer shell to solve programming "
    "tasks. Your response must contain exactly ONE bash code block with ONE command (or "
    "commands connected with && or ||). Include a THOUGHT section before your command where you "
    "explain your reasoning process. Format your response as shown in <format_example>.\n"
    "<format_example>\nTHOUGHT: Your reasoning and analysis here\n\n```bash\nyour_command_here\n"
    "```\n</format_example>\nFailure to follow these rules will cause your response to be "
    "rejected. Recommended workflow: 1. Analyze the codebase by finding and reading relevant "
    "files. 2. Create a script to reproduce the issue. 3. Edit the source code to resolve the "
    "issue. 4. Verify your fix works by running your script again. 5. Test edge cases to ensure "
    "your fix is robust. 6. Submit your changes and finish your work by issuing the following "
    "command: `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`. Do not combine it with any other "
    "command. Important boundaries: MODIFY only source files, DO NOT MODIFY tests or "
    "configuration files. Every action runs in a new subshell, so directory changes are not "
    "persistent; prefix commands with `cd /testbed &&` where needed.")
TASK = ("Please solve this issue: `parse_duration('1h30m')` returns 5400.0 but "
        "`parse_duration('90m')` raises ValueError: unknown unit 'm'. Both should return the "
        "number of seconds. The function lives in src/timeparse/core.py.")
LINES = [
    "src/timeparse/core.py:42:    units = {'h': 3600, 's': 1}",
    "Traceback (most recent call last):",
    '  File "/testbed/repro.py", line 3, in <module>',
    "    print(parse_duration('90m'))",
    "ValueError: unknown unit 'm'",
    "drwxr-xr-x 1 root root 4096 Dec  6 02:41 src",
    "-rw-r--r-- 1 root root 1187 Dec  6 02:41 pyproject.toml",
    "def parse_duration(text: str) -> float:",
    "    for number, unit in re.findall(r'(\\d+)([a-z]+)', text):",
    "        total += float(number) * units[unit]",
    "============================= 3 passed in 0.04s ==============================",
    "tests/test_core.py::test_hours PASSED                                    [ 33%]",
]


def observation(rng: random.Random) -> str:
    output = "\n".join(rng.choice(LINES) for _ in range(rng.randint(4, 12)))
    return (f"<|im_end|>\n<|im_start|>user\n<returncode>0</returncode>\n<output>\n{output}\n"
            f"</output><|im_end|>\n<|im_start|>assistant\n")


def rollout(url: str, tok: Any, index: int, turns: int, max_tokens: int,
            out: dict[int, dict[str, Any]]) -> None:
    rng = random.Random(index)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    prompt = list(tok.apply_chat_template(messages, add_generation_prompt=True)["input_ids"])
    made: list[list[int]] = []
    sent = 0
    started = time.perf_counter()
    with httpx.Client(timeout=600) as http:
        for turn in range(turns):
            body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                    "temperature": 1.0, "seed": 1000 * index + turn, "return_token_ids": True}
            sent += len(prompt)
            answer = http.post(f"{url}/v1/completions", json=body)
            answer.raise_for_status()
            ids = answer.json()["choices"][0]["token_ids"]
            made.append(ids)
            prompt = prompt + ids + tok.encode(observation(rng), add_special_tokens=False)
    out[index] = {"seconds": time.perf_counter() - started, "tokens": made,
                  "last_prompt": len(prompt), "prompt_tokens": sent}


def play(server: PolicyServer, tok: Any, rollouts: int, turns: int,
         max_tokens: int) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    threads = [threading.Thread(target=rollout, args=(server.url or "", tok, i, turns,
                                                      max_tokens, out))
               for i in range(rollouts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(out) != rollouts:
        raise RuntimeError("a rollout failed; see its traceback above")
    return out


def measure(name: str, model: Any, tok: Any, args: Any) -> dict[str, Any]:
    per_rollout: dict[str, list[float]] = {"off": [], "on": []}
    wall: dict[str, list[float]] = {"off": [], "on": []}
    samples: dict[str, list[list[list[int]]]] = {"off": [], "on": []}
    saved, prompted, last = 0, 0, 0
    for _ in range(args.rounds):
        for mode in ("off", "on"):
            budget = args.max_cached_tokens if mode == "on" else 0
            with PolicyServer(model, tok, max_batch=args.batch, max_new_tokens_limit=4096,
                              max_cached_tokens=budget) as server:
                started = time.perf_counter()
                out = play(server, tok, args.rollouts, args.turns, args.max_tokens)
                wall[mode].append(time.perf_counter() - started)
                prefix = server.engine.batcher.prefix
                if mode == "on":
                    saved += prefix.reused
                    assert prefix.tokens <= budget
            rates = [sum(map(len, r["tokens"])) / r["seconds"] for r in out.values()]
            per_rollout[mode] += rates
            print(f"{name}, cache {mode}: {statistics.median(rates):.1f} tokens/s per rollout, "
                  f"{wall[mode][-1]:.1f} s", flush=True)
            samples[mode].append([t for i in sorted(out) for t in out[i]["tokens"]])
            last = max(r["last_prompt"] for r in out.values())
            prompted = sum(r["prompt_tokens"] for r in out.values())
    same = samples["off"] == samples["on"]
    medians = {m: statistics.median(v) for m, v in per_rollout.items()}
    return {"model": name, "parameters": sum(p.numel() for p in model.parameters()),
            "tokens_per_s_per_rollout": per_rollout, "median": medians,
            "ratio": medians["on"] / medians["off"],
            "wall_s": wall, "median_wall_s": {m: statistics.median(v) for m, v in wall.items()},
            "same_tokens": same, "prompt_tokens_per_round": prompted,
            "reused_prompt_tokens_per_round": saved // args.rounds, "longest_prompt": last}


def main() -> int:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--models", default="tiny,smollm2")
    parser.add_argument("--rollouts", type=int, default=3)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-cached-tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; on a shared machine two threads wait on each other "
                             "at every operation and the times measure the scheduler")
    args = parser.parse_args()
    if args.quick:
        args.models, args.rollouts, args.turns, args.rounds = "tiny", 2, 3, 1
        args.hidden, args.layers = 128, 2
    torch.set_num_threads(args.threads)
    results: list[dict[str, Any]] = []
    for name in args.models.split(","):
        if name == "tiny":
            tok = load_tokenizer(TEST_TOKENIZER)
            model = tiny_llama(tok, hidden_size=args.hidden, layers=args.layers, heads=8)
        elif name == "smollm2":
            try:
                model, tok = load_policy(smollm2_dir(), dtype=torch.float32)
            except (RuntimeError, OSError) as e:
                print(f"SmolLM2 skipped: {e}")
                continue
        else:
            parser.error(f"unknown model {name!r}: tiny or smollm2")
        results.append(measure(name, model, tok, args))
    rows = [[r["model"], f"{r['parameters'] / 1e6:.1f} M", f"{r['median']['off']:.1f}",
             f"{r['median']['on']:.1f}", f"{r['ratio']:.2f}x",
             f"{r['median_wall_s']['off']:.1f} / {r['median_wall_s']['on']:.1f}",
             f"{r['reused_prompt_tokens_per_round']} / {r['prompt_tokens_per_round']}",
             str(r["longest_prompt"]),
             "yes" if r["same_tokens"] else "NO"] for r in results]
    print_table(f"prefix cache, {args.rollouts} rollouts x {args.turns} turns x "
                f"{args.max_tokens} tokens, max_batch {args.batch}, {args.rounds} rounds",
                ["model", "params", "tok/s/rollout off", "on", "on / off", "wall s off / on",
                 "prompt tokens reused / sent", "longest prompt", "same tokens"], rows)
    write_json("kv_reuse", args, {"models": results})
    return 0 if all(r["same_tokens"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
