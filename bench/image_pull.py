"""Images by name: a cold pull through a create against ``skopeo copy`` alone, and a second
create of the same image.

A local registry (Debian's docker-registry on loopback, tests/registry.py) holds, per round,
a new image of busybox and ``--layers`` layers of incompressible random bytes (``--mb`` in
all, so no round finds the last one's blobs). Each round measures, in alternating order:

* ``skopeo copy`` of the image to an OCI directory: the transfer alone, the baseline;
* a create of a sandbox on the image until it is ready: resolve, pull (the same skopeo
  copy), unpack into the store, start the sandbox;
* a second create of the same image until ready: the store's copy, no registry.

    .venv/bin/python bench/image_pull.py [--quick] [--rounds 3] [--mb 100] [--layers 4]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from common import BenchServer, base_parser, finish, print_table, summarize_ms  # noqa: E402

from orchard.env.client import SandboxClient  # noqa: E402
from tests.image_fixtures import make_busybox_rootfs  # noqa: E402
from tests.registry import Registry, push_rootfs, running_registry  # noqa: E402


def push_round(registry: Registry, busybox: Path, n: int, mb: int, layers: int) -> str:
    per_layer = (mb << 20) // layers
    extra = [{f"data/random-{i}": os.urandom(per_layer)} for i in range(layers)]
    return push_rootfs(registry, busybox, "bench/random", str(n), extra_layers=extra)


def skopeo_copy(ref: str, tmp: Path) -> float:
    dest = tmp / f"copy-{time.monotonic_ns()}"
    t0 = time.perf_counter()
    subprocess.run(["skopeo", "--insecure-policy", "copy", "--quiet", "--src-tls-verify=false",
                    f"docker://{ref}", f"oci:{dest}:image"], check=True, timeout=600)
    took = time.perf_counter() - t0
    shutil.rmtree(dest)
    return took


def create_ready(client: SandboxClient, ref: str) -> float:
    t0 = time.perf_counter()
    sandbox = client.create_sandbox(ref, timeout=600)
    took = time.perf_counter() - t0
    assert sandbox.exec("test -s /data/random-0").ok
    sandbox.delete()
    return took


def report(args: Any, r: dict[str, Any]) -> None:
    cold, copy, warm = (r[k]["p50"] / 1000 for k in ("create_cold", "skopeo_copy",
                                                             "create_second"))
    print_table(f"image pull: {args.mb} MB in {args.layers} random layers + busybox, "
                f"{args.rounds} rounds (medians)",
                ["what", "seconds", "vs skopeo copy"],
                [["skopeo copy to an OCI dir (baseline)", f"{copy:.2f}", "1.00x"],
                 ["create -> ready, cold (pull + unpack + start)", f"{cold:.2f}",
                  f"{cold / copy:.2f}x"],
                 ["second create -> ready (from the store)", f"{warm:.2f}",
                  f"{warm / copy:.2f}x"]])


def main() -> int:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.mb = 1, 20
    server = BenchServer()
    times: dict[str, list[float]] = {"skopeo_copy": [], "create_cold": [], "create_second": []}
    with tempfile.TemporaryDirectory(prefix="orchard-bench-pull-") as tmp, \
            running_registry(Path(tmp) / "registry") as registry, server, \
            SandboxClient(server.url, timeout=600) as client:
        busybox = make_busybox_rootfs(Path(tmp) / "busybox")
        for n in range(args.rounds):
            ref = push_round(registry, busybox, n, args.mb, args.layers)
            if n % 2 == 0:
                times["skopeo_copy"].append(skopeo_copy(ref, Path(tmp)))
                times["create_cold"].append(create_ready(client, ref))
            else:
                times["create_cold"].append(create_ready(client, ref))
                times["skopeo_copy"].append(skopeo_copy(ref, Path(tmp)))
            times["create_second"].append(create_ready(client, ref))
            print(f"round {n}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()))
    results: dict[str, Any] = {k: summarize_ms(v) for k, v in times.items()}
    results["raw_s"] = times
    return finish("image_pull", args, results, server, report)


if __name__ == "__main__":
    sys.exit(main())
