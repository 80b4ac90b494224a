"""A small Harbor dataset written by the tests (and the bench): task directories in Harbor's
format whose oracle solutions earn reward 1 and whose tests give 0 to doing nothing.

Each task's environment is either a Dockerfile ``FROM`` a base image (``build=True``: WORKDIR,
ENV and COPY come from the build) or that image named in task.toml with the same working
directory and env (``build=False``: Harbor uploads ``environment/`` into the working
directory). Three kinds of task, cycled: a greeting from the env (reward.txt, a solution that
sources a helper from a subdirectory), an executable the solution ships (reward.json, modes
kept by the transfer), and a tree of files the solution writes.
"""

from __future__ import annotations

from pathlib import Path

KINDS = ("greeting", "tool", "tree")

_SOLVE = {
    "greeting": '. /solution/lib/helper.sh\nwrite_answer\n',
    "tool": "/solution/bin/tool > /workspace/answer.txt\n",
    "tree": "for d in a b c; do mkdir -p out/$d; echo $d > out/$d/f.txt; done\n",
}
_CHECK = {
    "greeting": '[ "$(cat /workspace/answer.txt)" = "$GREETING:$(cat data.txt)" ]',
    "tool": '[ "$(cat /workspace/answer.txt)" = "tool ran in $(pwd)" ]',
    "tree": '[ "$(cat out/a/f.txt out/b/f.txt out/c/f.txt | tr -d "\\n")" = abc ]',
}


def write_task(root: Path, name: str, kind: str, image: str, *, build: bool) -> Path:
    task = root / name
    for sub in ("environment", "tests", "solution/lib", "solution/bin"):
        (task / sub).mkdir(parents=True, exist_ok=True)
    greeting = f"hello-{name}"
    env = "" if build else (f'docker_image = "{image}"\nworkdir = "/workspace"\n'
                            f'[environment.env]\nGREETING = "{greeting}"\n')
    (task / "task.toml").write_text(
        'schema_version = "1.4"\n[metadata]\nkind = "' + kind + '"\n'
        '[agent]\ntimeout_sec = 120\n[verifier]\ntimeout_sec = 120\n'
        '[environment]\nnetwork_mode = "no-network"\n' + env)
    (task / "instruction.md").write_text(f"Task {name} ({kind}): see the tests.\n")
    (task / "environment" / "data.txt").write_text(f"data of {name}\n")
    if build:
        (task / "environment" / "Dockerfile").write_text(
            f"FROM {image}\nWORKDIR /workspace\nENV GREETING={greeting}\n"
            "COPY data.txt /workspace/data.txt\n")
    (task / "solution" / "solve.sh").write_text("#!/bin/sh\nset -e\ncd /workspace\n"
                                                 + _SOLVE[kind])
    (task / "solution" / "lib" / "helper.sh").write_text(
        'write_answer() { echo "$GREETING:$(cat /workspace/data.txt)" > /workspace/answer.txt; }\n')
    tool = task / "solution" / "bin" / "tool"
    tool.write_text('#!/bin/sh\necho "tool ran in $(pwd)"\n')
    tool.chmod(0o755)
    reward = ('echo \'{"reward": 1.0}\' > /logs/verifier/reward.json' if kind == "tool"
              else "echo 1 > /logs/verifier/reward.txt")
    no_reward = ('echo \'{"reward": 0.0}\' > /logs/verifier/reward.json' if kind == "tool"
                 else "echo 0 > /logs/verifier/reward.txt")
    (task / "tests" / "test.sh").write_text(
        f"#!/bin/sh\ncd /workspace\nif {_CHECK[kind]}; then {reward}; else {no_reward}; fi\n")
    return task


def write_dataset(root: Path, image: str, *, build: bool, n: int = 3) -> Path:
    """``n`` tasks (``task-00``, ...) in ``root``, the kinds in turn."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        write_task(root, f"task-{i:02d}", KINDS[i % len(KINDS)], image, build=build)
    return root
