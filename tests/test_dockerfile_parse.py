"""Reading Dockerfiles and build contexts, without an orchestrator: what is refused and where,
substitution, and which files .dockerignore leaves to COPY."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from orchard.env.build.context import BuildContext, content_hash, write_tar
from orchard.env.build.dockerfile import (
    DockerfileError,
    Instruction,
    key_values,
    parse_dockerfile,
    substitute,
    words,
)
from orchard.env.build_schema import names_an_image, normalize_name


@pytest.mark.parametrize(("text", "needle"), [
    ("FROM a AS build\nRUN true\n", "line 1 (FROM a AS build): multi-stage"),
    ("FROM a\nRUN true\nFROM b\n", "line 3 (FROM b): multi-stage"),
    ("FROM a\nONBUILD RUN true\n", "line 2 (ONBUILD RUN true): ONBUILD is not supported"),
    ("FROM a\n\nHEALTHCHECK CMD true\n", "line 3 (HEALTHCHECK CMD true): HEALTHCHECK"),
    ("FROM --platform=linux/arm64 a\n", "line 1 (FROM --platform=linux/arm64 a): FROM flags"),
    ("RUN true\nFROM a\n", "line 1 (RUN true): only ARG may come before FROM"),
    ("FROM scratch\nCOPY x /x\n", "line 1 (FROM scratch): FROM scratch is not supported"),
    ("FROM a\nFROBNICATE x\n", "line 2 (FROBNICATE x): unknown instruction"),
    ("# just a comment\n", "no FROM instruction"),
])
def test_refused_instructions_name_themselves_and_their_line(text: str, needle: str) -> None:
    with pytest.raises(DockerfileError) as refused:
        parse_dockerfile(text)
    assert needle in str(refused.value)


def test_continuations_comments_and_the_escape_directive() -> None:
    steps = parse_dockerfile("# escape=`\nARG V=1\nFROM a\n# note\nRUN echo one `\n  two\n")
    assert [(s.keyword, s.value, s.line) for s in steps] == [
        ("ARG", "V=1", 2), ("FROM", "a", 3), ("RUN", "echo one   two", 5)]


def test_substitution() -> None:
    v = {"A": "x y", "EMPTY": ""}
    assert substitute("$A ${A} ${EMPTY:-dflt} ${A:+alt} ${EMPTY:+alt}|'$A' \\$A", v) == \
        "x y x y dflt alt |'$A' \\$A"
    assert words('"$A" ${MISSING:-d}/z /dst', v) == ["x y", "d/z", "/dst"]
    assert key_values('K=${EMPTY:-dflt} L="$A q"', v) == [("K", "dflt"), ("L", "x y q")]
    assert key_values("K $A rest", v) == [("K", "x y rest")]


def test_dockerignore_is_anchored_and_reincludes(tmp_path: Path) -> None:
    for name in ["a.pyc", "sub/b.pyc", "docs/x.md", "docs/README.md", "keep/c.log", "d.log"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    (tmp_path / ".dockerignore").write_text(
        "# comment\n*.pyc\ndocs\n!docs/README.md\n**/*.log\n")
    ctx = BuildContext(tmp_path)
    files, archives = ctx.entries(Instruction("COPY", ". /app", 1), ["."], "/app", unpack=False)
    dests = sorted(e.dest for e in files if e.source.is_file())
    assert dests == ["/app/.dockerignore", "/app/docs/README.md", "/app/sub/b.pyc"]
    assert archives == []


def test_copy_destinations_follow_dockers_rules(tmp_path: Path) -> None:
    (tmp_path / "one.txt").write_text("1")
    (tmp_path / "two.txt").write_text("2")
    ctx = BuildContext(tmp_path)
    step = Instruction("COPY", "x", 1)
    single = ctx.entries(step, ["one.txt"], "/opt/renamed", unpack=False)[0]
    assert [e.dest for e in single] == ["/opt/renamed"]
    into = ctx.entries(step, ["*.txt"], "/opt", unpack=False)[0]  # several: /opt is a dir
    assert sorted(e.dest for e in into) == ["/opt/one.txt", "/opt/two.txt"]


def test_the_content_hash_follows_bytes_not_times(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("same")
    ctx = BuildContext(tmp_path)
    files, _ = ctx.entries(Instruction("COPY", "x", 1), ["f"], "/f", unpack=False)
    before = content_hash(files, [])
    (tmp_path / "f").touch()
    assert content_hash(files, []) == before
    (tmp_path / "f").write_text("different")
    assert content_hash(files, []) != before


def test_every_member_of_the_tar_is_roots(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    files, _ = BuildContext(tmp_path).entries(Instruction("COPY", "x", 1), ["f"], "/f",
                                              unpack=False)
    buf = io.BytesIO()
    write_tar(buf, files, [], 0o640)
    buf.seek(0)
    with tarfile.open(fileobj=buf) as tar:
        [member] = tar.getmembers()
    assert (member.name, member.uid, member.gid, member.mode) == ("f", 0, 0, 0o640)


def test_image_names() -> None:
    assert normalize_name("app") == "app:latest"
    assert normalize_name("reg.local:5000/team/app") == "reg.local:5000/team/app:latest"
    assert normalize_name("app:1.0") == "app:1.0"
    with pytest.raises(ValueError, match="not an image name"):
        normalize_name("Bad Name")
    assert not names_an_image("host") and not names_an_image("/srv/images/x")
    assert names_an_image("python:3.12-slim")
