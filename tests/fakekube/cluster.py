"""A whole fake cluster: the API server plus a kubelet running pods as local sandboxes.

In-process (tests)::

    with FakeCluster(data_dir) as cluster:
        cluster.kubeconfig, cluster.api, cluster.kubelet

or in its own process (benchmarks, so the cluster's work does not share the orchestrator's
interpreter)::

    python -m tests.fakekube.cluster --data-dir D --kubeconfig K   # prints the URL when ready
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from tests.fakekube.apiserver import DEFAULT_NAMESPACES, FakeApiServer
from tests.fakekube.kubelet import FakeKubelet

NAMESPACE = "orchard-sandboxes"


class FakeCluster:
    """data_dir holds the kubelet's sandboxes; keep it short (AF_UNIX paths live below it)."""

    def __init__(self, data_dir: Path, port: int = 0, images: dict[str, str] | None = None,
                 token: str | None = "fake-cluster-token") -> None:
        self.data_dir = data_dir
        self.api = FakeApiServer(port=port, token=token,
                                 namespaces=(*DEFAULT_NAMESPACES, NAMESPACE))
        self.images = images
        self.kubeconfig = data_dir / "kubeconfig"
        self.kubelet: FakeKubelet | None = None

    def start(self) -> FakeCluster:
        self.api.start()
        try:
            self.api.write_kubeconfig(self.kubeconfig, namespace=NAMESPACE)
            self.kubelet = FakeKubelet(self.api, self.data_dir / "kubelet", self.images).start()
        except BaseException:
            self.api.stop()
            raise
        return self

    def stop(self) -> None:
        if self.kubelet is not None:
            self.kubelet.stop()
        self.api.stop()

    def __enter__(self) -> FakeCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run a fake cluster until SIGTERM/SIGINT.")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--kubeconfig", type=Path, help="also write the kubeconfig here")
    args = parser.parse_args(argv)
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    with FakeCluster(args.data_dir, port=args.port) as cluster:
        if args.kubeconfig:
            args.kubeconfig.write_bytes(cluster.kubeconfig.read_bytes())
        print(cluster.api.url, flush=True)
        sys.stdout.flush()
        stopping.wait()


if __name__ == "__main__":
    main()
