"""A Dockerfile FROM a registry image (section 1's pulls, tests/registry.py's loopback
registry): the build pulls the base once, and a sandbox of the result has the base's files
and env under the build's."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from orchard.env.build import build_image
from orchard.env.client import SandboxClient
from tests.conftest import needs_root

pytestmark = [needs_root, pytest.mark.root]


def test_from_a_registry_image(orchestrator: str, busybox_image: str, tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    (tmp_path / "Dockerfile").write_text(
        f"FROM {busybox_image}\nENV MARK={marker}\nRUN echo $MARK > /mark && ls /bin/busybox\n")
    with SandboxClient(orchestrator) as client:
        image = build_image(client, tmp_path, tag="test/from-registry")
        assert image.run_steps == 1
        again = build_image(client, tmp_path, tag="test/from-registry")
        assert (again.cached_steps, again.run_steps) == (1, 0)
        with client.create_sandbox("test/from-registry") as sb:
            assert sb.info.from_snapshot == image.snapshot_id
            r = sb.exec("cat /mark; echo $MARK; ls /bin/busybox")
        assert r.stdout == f"{marker}\n{marker}\n/bin/busybox\n", r.stderr
