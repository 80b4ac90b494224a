import pytest

from inigrid import Config, ParseError
from inigrid.parser import parse

SAMPLE = """\
# global settings
[DEFAULT]
log_level = info

[server]
Host = example.org   ; the public name
port: 8080
motd = first line
    second line
    third line

; another comment
[client]
retries = 3
"""


def test_sections_and_options():
    sections = parse(SAMPLE.splitlines())
    assert list(sections) == ["DEFAULT", "server", "client"]
    assert sections["server"]["host"] == "example.org"
    assert sections["server"]["port"] == "8080"


def test_multiline_value():
    cfg = Config.from_string(SAMPLE)
    assert cfg.get("server", "motd") == "first line\nsecond line\nthird line"


def test_inline_comment_needs_whitespace():
    cfg = Config.from_string("[db]\nurl = postgres://h/db;sslmode=require\npw = a#b  # note\n")
    assert cfg.get("db", "url") == "postgres://h/db;sslmode=require"
    assert cfg.get("db", "pw") == "a#b"


def test_repeated_section_merges():
    cfg = Config.from_string("[a]\nx = 1\n[b]\ny = 2\n[a]\nx = 3\nz = 4\n")
    assert cfg.sections() == ["a", "b"]
    assert cfg.items("a") == [("x", "3"), ("z", "4")]


@pytest.mark.parametrize(
    "text,lineno",
    [("key = value\n", 1), ("[a]\nx = 1\njust words\n", 3), ("[a]\n= nothing\n", 2)],
    ids=["no-section", "no-separator", "no-key"],
)
def test_parse_errors(text, lineno):
    with pytest.raises(ParseError) as exc:
        Config.from_string(text)
    assert exc.value.lineno == lineno
