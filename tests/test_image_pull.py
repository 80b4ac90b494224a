"""Images by name on the local backend, against a real registry the tests start."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import create_ready, needs_root, run

pytestmark = [needs_root, pytest.mark.root]


def test_pull_by_name_and_run(http: httpx.Client, busybox_image: str) -> None:
    sid = create_ready(http, {"image": busybox_image})
    try:
        r = run(http, sid, command="echo hi from $(cat /etc/group); echo $PATH")
        assert r["exit_code"] == 0, r
        assert r["stdout"] == "hi from root:x:0:\n/usr/local/bin:/usr/bin:/bin\n", r
    finally:
        http.delete(f"/sandboxes/{sid}")


def test_bash_image(http: httpx.Client, bash_image: str) -> None:
    sid = create_ready(http, {"image": bash_image})
    try:
        r = run(http, sid, argv=["bash", "-c", "echo ${BASH_VERSINFO[0]} && ls /workspace"])
        assert r["exit_code"] == 0 and int(r["stdout"].split()[0]) >= 4, r
    finally:
        http.delete(f"/sandboxes/{sid}")
