import pytest

from pathnorm import is_absolute, normpath, parts


@pytest.mark.parametrize("path,expected", [
    ("", "."),
    (".", "."),
    ("./", "."),
    ("a/./b", "a/b"),
    ("a//b///c/", "a/b/c"),
    ("/", "/"),
    ("//a//b/", "/a/b"),
    ("a/b/../c", "a/c"),
    ("a/..", "."),
    ("a/../../b", "../b"),
    ("..", ".."),
    ("../a", "../a"),
    ("/../a", "/a"),
    ("/a/../..", "/"),
])
def test_normpath(path, expected):
    assert normpath(path) == expected


def test_is_absolute():
    assert is_absolute("/x") and not is_absolute("x/") and not is_absolute("")


def test_parts():
    assert parts("/usr//lib/") == ["/", "usr", "lib"]
    assert parts("a/./b") == ["a", "b"]
    assert parts("/") == ["/"]
    assert parts(".") == []
