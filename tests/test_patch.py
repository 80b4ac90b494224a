"""apply_patch through the real REST API: git apply, the fuzzy patch fallback, failures."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.conftest import create_ready, needs_root, run
from tests.image_fixtures import make_busybox_rootfs

pytestmark = needs_root

LINES = [f"line {i}" for i in range(1, 31)]
ORIGINAL = "\n".join(LINES) + "\n"

# Changes line 10; context lines 7-9 and 11-13.
CLEAN = """\
diff --git a/f.txt b/f.txt
--- a/f.txt
+++ b/f.txt
@@ -7,7 +7,7 @@
 line 7
 line 8
 line 9
-line 10
+LINE TEN
 line 11
 line 12
 line 13
"""

# Claims the hunk is at line 3 (it is at 7 in the file: an offset) and its outermost context
# lines no longer match the file ('line 7' and 'line 13' were edited since the diff was made).
# git apply has no fuzz and rejects it; GNU patch --fuzz accepts it by ignoring those lines.
FUZZY = """\
--- a/f.txt
+++ b/f.txt
@@ -3,7 +3,7 @@
 line seven
 line 8
 line 9
-line 10
+LINE TEN
 line 11
 line 12
 line thirteen
"""

# Two hunks: the first applies cleanly, the second matches nothing.
HALF_GOOD = """\
--- a/f.txt
+++ b/f.txt
@@ -1,4 +1,4 @@
 line 1
-line 2
+LINE TWO
 line 3
 line 4
@@ -20,4 +20,4 @@
 no such line a
-no such line b
+replacement
 no such line c
 no such line d
"""


def patch(http: httpx.Client, sid: str, diff: str, **extra: object) -> dict:
    r = http.post(f"/sandboxes/{sid}/apply_patch", json={"patch": diff, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def read(http: httpx.Client, sid: str, path: str) -> str:
    r = http.get(f"/sandboxes/{sid}/files/raw", params={"path": path})
    assert r.status_code == 200, r.text
    return r.text


def git_repo(http: httpx.Client, sid: str) -> None:
    http.put(f"/sandboxes/{sid}/files/raw", params={"path": "f.txt"}, content=ORIGINAL)
    job = run(http, sid, command="git init -q && git config user.email t@example.com && "
                                 "git config user.name Tester && git add f.txt && "
                                 "git commit -qm init && git status --porcelain")
    assert (job["exit_code"], job["stdout"]) == (0, ""), job


def test_clean_diff_applies_with_git_apply(http: httpx.Client, sandbox: str) -> None:
    git_repo(http, sandbox)
    result = patch(http, sandbox, CLEAN)
    assert result["success"] is True, result
    assert result["method"] == "git apply"
    assert result["exit_code"] == 0
    assert result["attempts"] == []
    assert read(http, sandbox, "f.txt") == ORIGINAL.replace("line 10\n", "LINE TEN\n")
    diff = run(http, sandbox, command="git diff --stat")["stdout"]
    assert "1 insertion(+), 1 deletion(-)" in diff
    # Applying it again fails (already applied), and says why; the file is untouched.
    again = patch(http, sandbox, CLEAN)
    assert again["success"] is False
    assert read(http, sandbox, "f.txt") == ORIGINAL.replace("line 10\n", "LINE TEN\n")


def test_fuzzy_diff_falls_back_to_patch(http: httpx.Client, sandbox: str) -> None:
    git_repo(http, sandbox)
    # Prove the premise: git apply really refuses this diff.
    http.put(f"/sandboxes/{sandbox}/files/raw", params={"path": "/tmp/fuzzy.diff"},
             content=FUZZY)
    check = run(http, sandbox, command="git apply --check /tmp/fuzzy.diff")
    assert check["exit_code"] != 0
    result = patch(http, sandbox, FUZZY)
    assert result["success"] is True, result
    assert result["method"] == "patch --fuzz=5"
    assert [a.split(":")[0] for a in result["attempts"]] == ["git apply", "git apply --reject"]
    assert all("exit" in a for a in result["attempts"])
    assert "fuzz" in result["stdout"].lower() or "offset" in result["stdout"].lower(), result
    assert read(http, sandbox, "f.txt") == ORIGINAL.replace("line 10\n", "LINE TEN\n")
    # The rejected 'git apply --reject' attempt left no .rej files behind.
    assert run(http, sandbox, command="find . -name '*.rej'")["stdout"] == ""


def test_garbage_patch_reports_every_attempt(http: httpx.Client, sandbox: str) -> None:
    git_repo(http, sandbox)
    result = patch(http, sandbox, "this is not a diff at all\n")
    assert result["success"] is False
    assert result["method"] is None
    assert result["exit_code"] != 0
    names = [a.split(":")[0] for a in result["attempts"]]
    assert names == ["git apply", "git apply --reject", "patch --fuzz=5"]
    assert "no valid patches" in result["attempts"][0].lower()
    assert "garbage" in result["attempts"][2].lower()
    assert result["stderr"]
    assert read(http, sandbox, "f.txt") == ORIGINAL


def test_mismatched_patch_fails_and_leaves_the_tree_alone(http: httpx.Client,
                                                           sandbox: str) -> None:
    git_repo(http, sandbox)
    result = patch(http, sandbox, HALF_GOOD)
    assert result["success"] is False, result
    assert len(result["attempts"]) == 3
    assert all(a.startswith(("git apply", "patch")) for a in result["attempts"])
    # No method may leave half a patch applied, nor .rej/.orig litter.
    assert read(http, sandbox, "f.txt") == ORIGINAL
    status = run(http, sandbox, command="git status --porcelain --untracked-files=all")
    assert status["stdout"] == "", status


def test_failed_patch_keeps_hunks_the_tree_already_had(http: httpx.Client,
                                                       sandbox: str) -> None:
    """Undoing a failed 'git apply --reject' must not revert what was there before it."""
    git_repo(http, sandbox)
    already = ORIGINAL.replace("line 2\n", "LINE TWO\n")
    http.put(f"/sandboxes/{sandbox}/files/raw", params={"path": "f.txt"}, content=already)
    run(http, sandbox, command="git commit -qam 'hunk 1 is in already'")
    result = patch(http, sandbox, HALF_GOOD)
    assert result["success"] is False, result
    assert read(http, sandbox, "f.txt") == already
    status = run(http, sandbox, command="git status --porcelain --untracked-files=all")
    assert status["stdout"] == "", status


def test_patch_cwd(http: httpx.Client, sandbox: str) -> None:
    run(http, sandbox, command="mkdir -p /workspace/proj")
    http.put(f"/sandboxes/{sandbox}/files/raw", params={"path": "proj/f.txt"}, content=ORIGINAL)
    result = patch(http, sandbox, CLEAN, cwd="/workspace/proj")
    assert result["success"] is True, result
    assert read(http, sandbox, "proj/f.txt") == ORIGINAL.replace("line 10\n", "LINE TEN\n")
    r = http.post(f"/sandboxes/{sandbox}/apply_patch",
                  json={"patch": CLEAN, "cwd": "/workspace/missing"})
    assert r.status_code == 400
    assert "/workspace/missing" in r.json()["detail"]


def test_patch_in_unknown_sandbox(http: httpx.Client) -> None:
    r = http.post("/sandboxes/no-such-sandbox/apply_patch", json={"patch": CLEAN})
    assert r.status_code == 404


@pytest.fixture()
def busybox_sandbox(http: httpx.Client, tmp_path: Path):
    rootfs = make_busybox_rootfs(tmp_path / "busybox-rootfs")
    sid = create_ready(http, {"image": str(rootfs)})
    yield sid
    http.delete(f"/sandboxes/{sid}")


def test_busybox_image_without_git_uses_patch(http: httpx.Client, busybox_sandbox: str) -> None:
    sid = busybox_sandbox
    assert run(http, sid, command="command -v git || echo no-git")["stdout"] == "no-git\n"
    http.put(f"/sandboxes/{sid}/files/raw", params={"path": "f.txt"}, content=ORIGINAL)
    result = patch(http, sid, CLEAN)
    assert result["success"] is True, result
    assert result["method"] == "patch --fuzz=5"
    assert len(result["attempts"]) == 2
    assert all("git" in a and "not found" in a for a in result["attempts"]), result
    assert read(http, sid, "f.txt") == ORIGINAL.replace("line 10\n", "LINE TEN\n")
    # Already applied, half applicable, or no diff at all: each fails and changes nothing.
    for diff in (CLEAN, HALF_GOOD, "just some words\n"):
        bad = patch(http, sid, diff)
        assert bad["success"] is False, (diff, bad)
        assert bad["attempts"][-1].startswith("patch --fuzz=5: exit ")
        assert read(http, sid, "f.txt") == ORIGINAL.replace("line 10\n", "LINE TEN\n")
    assert run(http, sid, command="ls")["stdout"] == "f.txt\n"
