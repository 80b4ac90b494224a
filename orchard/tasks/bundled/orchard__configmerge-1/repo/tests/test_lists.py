import pytest

from configmerge import merge_lists


def test_simple_strategies():
    assert merge_lists([1, 2], [3], "replace") == [3]
    assert merge_lists([1, 2], [3], "append") == [1, 2, 3]
    assert merge_lists([1, 2], [3], "prepend") == [3, 1, 2]
    assert merge_lists([1, 2], [2, 3, 3], "unique") == [1, 2, 3]


def test_unknown_strategy():
    with pytest.raises(ValueError):
        merge_lists([], [], "zip")


def test_merge_by_key_flat_items():
    base = [{"name": "a", "x": 1}, {"name": "b", "x": 2}]
    override = [{"name": "b", "x": 20, "y": 3}, {"name": "c"}, "plain"]
    assert merge_lists(base, override, "merge_by_key") == [
        {"name": "a", "x": 1},
        {"name": "b", "x": 20, "y": 3},
        {"name": "c"},
        "plain",
    ]


def test_inputs_not_modified():
    base = [{"name": "a", "tags": ["x"]}]
    override = [{"name": "a", "tags": ["y"]}]
    result = merge_lists(base, override, "merge_by_key")
    result[0]["tags"].append("z")
    assert base == [{"name": "a", "tags": ["x"]}]
    assert override == [{"name": "a", "tags": ["y"]}]
