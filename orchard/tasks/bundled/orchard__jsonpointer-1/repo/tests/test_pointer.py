import pytest

from jsonpointer import JsonPointerError, escape, parse, to_pointer, unescape


def test_escape_and_unescape():
    assert escape("a/b~c") == "a~1b~0c"
    assert unescape("a~1b~0c") == "a/b~c"
    assert unescape("~01") == "~1"


def test_invalid_escape():
    with pytest.raises(JsonPointerError, match="invalid escape"):
        unescape("a~2")
    with pytest.raises(JsonPointerError):
        parse("/a~")


def test_parse():
    assert parse("") == []
    assert parse("/foo/0") == ["foo", "0"]
    assert parse("/a~1b/m~0n") == ["a/b", "m~n"]
    assert parse("/") == [""]
    assert parse("/a//b/") == ["a", "", "b", ""]


def test_pointer_must_start_with_slash():
    with pytest.raises(JsonPointerError, match="must start with '/'"):
        parse("foo/bar")


def test_to_pointer_round_trip():
    for tokens in (["a/b", "~", "0"], ["x", "", "y"], ["k"]):
        assert parse(to_pointer(tokens)) == tokens
