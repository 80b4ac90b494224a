"""The policy server's throughput with batched decoding against one request at a time.

``--clients`` threads each send ``--requests`` completions (prompts of different lengths,
``--max-tokens`` sampled tokens each, ``ignore_eos``) over real HTTP to a ``PolicyServer``
holding a random-init Llama of the given size. The same load runs against ``max_batch=1``
(the baseline: the server decodes one request at a time, as before batching) and against
``max_batch=--batch``, in one run, interleaved ``--rounds`` times; the table gives the median
generated tokens per second of each and their ratio, and how full the batches were.

    .venv/bin/python bench/policy_batching.py [--hidden 512 --layers 8] [--quick]
"""

from __future__ import annotations

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

from orchard.recipes.models import tiny_llama  # noqa: E402
from orchard.recipes.policy_server.server import PolicyServer  # noqa: E402
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer  # noqa: E402


def load(url: str, clients: int, requests: int, max_tokens: int) -> tuple[float, int]:
    """Seconds for every client's requests, and the tokens generated."""
    made = [0] * clients

    def client(i: int) -> None:
        with httpx.Client(timeout=600) as http:
            for r in range(requests):
                prompt = list(range(10, 10 + 40 + 37 * ((i + r) % 5)))
                body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                        "temperature": 1.0, "seed": 1000 * i + r, "return_token_ids": True}
                answer = http.post(f"{url}/v1/completions", json=body).json()
                made[i] += len(answer["choices"][0]["token_ids"])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started, sum(made)


def main() -> int:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.quick:
        args.hidden, args.layers, args.requests, args.rounds = 128, 2, 1, 1
    torch.set_num_threads(2)
    tok = load_tokenizer(TEST_TOKENIZER)
    model = tiny_llama(tok, hidden_size=args.hidden, layers=args.layers, heads=8)
    runs: dict[str, list[float]] = {"one at a time": [], "batched": []}
    fill: list[float] = []
    for _ in range(args.rounds):
        for name, batch in (("one at a time", 1), ("batched", args.batch)):
            with PolicyServer(model, tok, max_batch=batch) as server:
                seconds, tokens = load(server.url or "", args.clients, args.requests,
                                       args.max_tokens)
                runs[name].append(tokens / seconds)
                if batch > 1:
                    b = server.engine.batcher
                    fill.append(b.jobs / max(1, b.batches))
    medians = {name: statistics.median(v) for name, v in runs.items()}
    results: dict[str, Any] = {
        "model": {"hidden": args.hidden, "layers": args.layers,
                  "parameters": sum(p.numel() for p in model.parameters())},
        "load": {"clients": args.clients, "requests": args.requests,
                 "max_tokens": args.max_tokens, "max_batch": args.batch,
                 "rounds": args.rounds},
        "tokens_per_s": runs, "median_tokens_per_s": medians,
        "ratio": medians["batched"] / medians["one at a time"],
        "mean_batch": statistics.median(fill)}
    rows = [[name, f"{medians[name]:.0f}", ", ".join(f"{v:.0f}" for v in runs[name])]
            for name in runs]
    rows.append(["batched / one at a time", f"{results['ratio']:.2f}x",
                 f"median batch {results['mean_batch']:.1f} requests"])
    print_table(f"policy server, {results['model']['parameters'] / 1e6:.1f} M parameters, "
                f"{args.clients} clients", ["decoding", "tokens/s (median)", "rounds"], rows)
    write_json("policy_batching", args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
