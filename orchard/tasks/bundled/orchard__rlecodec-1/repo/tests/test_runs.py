import pytest

from rlecodec import expand, iter_runs


def test_iter_runs():
    assert list(iter_runs("aaabcc")) == [("a", 3), ("b", 1), ("c", 2)]
    assert list(iter_runs([1, 1, 2])) == [(1, 2), (2, 1)]
    assert list(iter_runs("")) == []


def test_expand_round_trip():
    assert "".join(expand(iter_runs("xxyzzz"))) == "xxyzzz"
    with pytest.raises(ValueError):
        list(expand([("a", -1)]))
