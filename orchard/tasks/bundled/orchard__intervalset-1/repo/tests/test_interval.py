import pytest

from intervalset import Interval


def test_of_validates_order():
    assert Interval.of((2, 5)) == Interval(2, 5)
    with pytest.raises(ValueError):
        Interval.of((5, 2))


def test_half_open_membership():
    iv = Interval(2, 5)
    assert iv.contains_point(2)
    assert iv.contains_point(4.999)
    assert not iv.contains_point(5)


def test_overlaps_excludes_touching():
    assert Interval(0, 5).overlaps(Interval(4, 8))
    assert not Interval(0, 5).overlaps(Interval(5, 8))


def test_intersection():
    assert Interval(0, 5).intersection(Interval(3, 9)) == Interval(3, 5)
    assert Interval(0, 5).intersection(Interval(5, 9)) is None
