import pytest

from jsonpointer import JsonPointerError, remove, resolve, set_value

# The example document of RFC 6901, section 5.
RFC_DOC = {
    "foo": ["bar", "baz"],
    "": 0,
    "a/b": 1,
    "c%d": 2,
    "e^f": 3,
    "g|h": 4,
    "i\\j": 5,
    "k\"l": 6,
    " ": 7,
    "m~n": 8,
}


@pytest.mark.parametrize("pointer,expected", [
    ("/foo", ["bar", "baz"]),
    ("/foo/0", "bar"),
    ("/", 0),
    ("/a~1b", 1),
    ("/c%d", 2),
    ("/e^f", 3),
    ("/g|h", 4),
    ("/i\\j", 5),
    ("/k\"l", 6),
    ("/ ", 7),
    ("/m~0n", 8),
], ids=["array", "array-index", "empty-key", "slash", "percent", "caret", "pipe",
        "backslash", "quote", "space", "tilde"])
def test_rfc_examples(pointer, expected):
    assert resolve(RFC_DOC, pointer) == expected


def test_whole_document():
    assert resolve(RFC_DOC, "") is RFC_DOC


def test_missing_and_default():
    with pytest.raises(JsonPointerError, match="no member 'nope'"):
        resolve(RFC_DOC, "/nope")
    assert resolve(RFC_DOC, "/foo/9", default=None) is None
    with pytest.raises(JsonPointerError, match="cannot descend into int"):
        resolve(RFC_DOC, "/a~1b/x")


def test_array_indexes():
    doc = {"xs": [1, 2, 3]}
    assert resolve(doc, "/xs/2") == 3
    for bad in ("/xs/01", "/xs/-1", "/xs/-", "/xs/3"):
        with pytest.raises(JsonPointerError):
            resolve(doc, bad)


def test_set_value():
    doc = {"a": {"b": 1}, "xs": [1]}
    set_value(doc, "/a/c", 2)
    set_value(doc, "/xs/0", 10)
    set_value(doc, "/xs/-", 11)
    set_value(doc, "/xs/2", 12)
    assert doc == {"a": {"b": 1, "c": 2}, "xs": [10, 11, 12]}
    with pytest.raises(JsonPointerError):
        set_value(doc, "/xs/4", 0)
    with pytest.raises(JsonPointerError):
        set_value(doc, "/missing/x", 0)
    with pytest.raises(JsonPointerError, match="root"):
        set_value(doc, "", {})


def test_remove():
    doc = {"a": [1, 2, 3], "b": {"": "empty"}}
    assert remove(doc, "/a/1") == 2
    assert remove(doc, "/b/") == "empty"
    assert doc == {"a": [1, 3], "b": {}}
    with pytest.raises(JsonPointerError):
        remove(doc, "/zzz")
