"""Dockerfile builds on the local backend: cold, cached, and the same steps without layers.

One orchestrator, one run; FROM is a busybox rootfs in its image dir. The Dockerfile has five
steps that write files (WORKDIR, COPY of a source tree of --files files / --mb MB, RUN that
writes --mb MB and hashes the tree, COPY of one file, RUN over it; ENV and CMD besides), so
it stands for a small project's image. Each of --repeat rounds:

* cold: the tag removed and the build cache pruned first, so every step runs and is
  snapshotted;
* cached: the same build again at once (every step a cache hit; no sandbox);
* by hand (the baseline): the same uploads and commands in one sandbox from the same base,
  no snapshots and no cache: what a build costs over just doing the work once;
* create: a sandbox from the built image until ready, next to one from the bare base.

Medians over the rounds. ``--quick`` is a smoke run.

    .venv/bin/python bench/image_build.py [--files 200] [--mb 20] [--repeat 5] [--quick]
"""

from __future__ import annotations

import os
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import BenchServer, base_parser, finish, print_table  # noqa: E402

from orchard.env.build import build_image, prune_build_cache, remove_built_image  # noqa: E402
from orchard.env.client import SandboxClient  # noqa: E402
from tests.image_fixtures import make_busybox_rootfs  # noqa: E402

DOCKERFILE = """\
FROM {base}
ENV APP=/app LEVEL=bench
WORKDIR /app
COPY src/ ./src/
RUN dd if=/dev/urandom of=blob bs=1048576 count={mb} 2>/dev/null && \\
    find src -type f | sort | xargs cat | sha256sum > tree.sum
COPY config.txt /etc/app.conf
RUN cat /etc/app.conf tree.sum > summary && sha256sum blob >> summary
CMD ["sh"]
"""


def make_context(root: Path, files: int, mb: int) -> None:
    """A source tree of ``files`` files, ``mb`` MB in all, and one config file."""
    size = max(1, mb * (1 << 20) // files)
    for i in range(files):
        path = root / "src" / f"pkg{i % 10}" / f"f{i}.dat"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    (root / "config.txt").write_text("level=bench\n")


def by_hand(client: SandboxClient, base: str, ctx: Path, mb: int) -> float:
    """The build's work in one sandbox: the same uploads and commands, nothing kept."""
    started = time.perf_counter()
    with client.create_sandbox(base) as sb, tempfile.TemporaryDirectory() as tmp:
        sb.mkdir("/app")
        tar = Path(tmp) / "src.tar"
        with tarfile.open(tar, "w") as t:
            t.add(ctx / "src", "app/src")
        sb.upload_file(tar, "/src.tar")
        steps = ["tar -xf /src.tar -C / && rm /src.tar",
                 f"cd /app && dd if=/dev/urandom of=blob bs=1048576 count={mb} 2>/dev/null && "
                 "find src -type f | sort | "
                 "xargs cat | sha256sum > tree.sum"]
        for command in steps:
            assert sb.exec(command).ok
        sb.upload_file(ctx / "config.txt", "/etc/app.conf")
        done = sb.exec("cd /app && cat /etc/app.conf tree.sum > summary && "
                       "sha256sum blob >> summary")
        assert done.ok, done.stderr
    return time.perf_counter() - started


def create_ready(client: SandboxClient, image: str) -> float:
    started = time.perf_counter()
    sb = client.create_sandbox(image)
    took = time.perf_counter() - started
    sb.delete()
    return took


def main() -> int:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--mb", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if args.quick:
        args.files, args.mb, args.repeat = 20, 2, 1
    server = BenchServer()
    rounds: list[dict[str, Any]] = []
    results: dict[str, Any] = {}
    with server, SandboxClient(server.url, timeout=600) as client, \
            tempfile.TemporaryDirectory(prefix="orchard-bench-ctx-") as tmp:
        base = str(make_busybox_rootfs(server.data_dir / "images" / "busybox"))
        ctx = Path(tmp)
        make_context(ctx, args.files, args.mb)
        (ctx / "Dockerfile").write_text(DOCKERFILE.format(base=base, mb=args.mb))
        for _ in range(args.repeat):
            remove_built_image(client, "bench/app")  # else its last step would be a hit
            prune_build_cache(client)
            cold = build_image(client, ctx, tag="bench/app")
            cached = build_image(client, ctx, tag="bench/app")
            assert cold.cached_steps == 0, "a cold build found cached steps"
            assert cached.run_steps == 0 and cached.snapshot_id == cold.snapshot_id
            rounds.append({
                "cold_s": cold.seconds, "cached_s": cached.seconds,
                "cold_steps": [{"line": s.line, "s": s.seconds} for s in cold.steps],
                "by_hand_s": by_hand(client, base, ctx, args.mb),
                "create_built_s": create_ready(client, "bench/app"),
                "create_base_s": create_ready(client, base),
            })
        snaps = {s.snapshot_id: s for s in client.list_snapshots()}
        results["layer_bytes"] = sum(snaps[s.snapshot_id].size_bytes for s in cold.steps)
        results["steps"] = len(cold.steps)
    results["rounds"] = rounds
    for key in ("cold_s", "cached_s", "by_hand_s", "create_built_s", "create_base_s"):
        results[key] = statistics.median(r[key] for r in rounds)
    return finish("image_build", args, results, server, report)


def report(args: Any, r: dict[str, Any]) -> None:
    ms = 1000
    rows = [
        [f"cold build ({r['steps']} file-writing steps)", f"{r['cold_s'] * ms:.0f} ms",
         f"{r['cold_s'] / r['by_hand_s']:.2f}x the same work by hand"],
        ["the same work by hand (one sandbox, no layers)", f"{r['by_hand_s'] * ms:.0f} ms", ""],
        ["cached build (no step runs)", f"{r['cached_s'] * ms:.1f} ms",
         f"{r['cold_s'] / r['cached_s']:.0f}x faster than cold"],
        ["create from the built image, until ready", f"{r['create_built_s'] * ms:.0f} ms",
         f"bare base: {r['create_base_s'] * ms:.0f} ms"],
        ["layers on disk", f"{r['layer_bytes'] / 1e6:.1f} MB",
         f"context {args.mb} MB + RUN output {args.mb} MB"],
    ]
    print_table(f"Dockerfile build, {args.files} files / {args.mb} MB context "
                f"(median of {args.repeat})", ["what", "median", "against"], rows)


if __name__ == "__main__":
    sys.exit(main())
