import pytest

from pathnorm import is_within, join, relpath, split


def test_join():
    assert join("a", "b", "c") == "a/b/c"
    assert join("a/", "b") == "a/b"
    assert join("a", "/etc", "x") == "/etc/x"
    assert join("", "a") == "a"


def test_split():
    assert split("/a/b") == ("/a", "b")
    assert split("/a") == ("/", "a")
    assert split("a") == ("", "a")
    assert split("a/b/") == ("a/b", "")
    assert split("a//b") == ("a", "b")


def test_relpath():
    assert relpath("/a/b/c", "/a") == "b/c"
    assert relpath("/a/b/c", "/a/x") == "../b/c"
    assert relpath("/a", "/a/") == "."
    assert relpath("a", "a/b") == ".."
    assert relpath("src/pkg/mod.py", "src") == "pkg/mod.py"


def test_relpath_errors():
    with pytest.raises(ValueError, match="mix"):
        relpath("/a", "a")
    with pytest.raises(ValueError, match="relative to"):
        relpath("x/y", "../z")


def test_is_within():
    assert is_within("/srv/www/index.html", "/srv/www")
    assert is_within("/srv/www", "/srv/www/")
    assert is_within("/srv/www/a/../b", "/srv/www")
    assert not is_within("/srv/other", "/srv/www")
    assert not is_within("/srv/www/../other", "/srv/www")
    assert not is_within("/srv/wwwroot", "/srv/www")
