import pytest

from intervalset import Interval, IntervalSet


def test_overlapping_intervals_are_merged():
    s = IntervalSet([(5, 8), (1, 3), (2, 6)])
    assert list(s) == [Interval(1, 8)]


def test_disjoint_intervals_kept_sorted():
    s = IntervalSet([(10, 12), (1, 3), (5, 6)])
    assert list(s) == [Interval(1, 3), Interval(5, 6), Interval(10, 12)]
    assert len(s) == 3


def test_empty_intervals_dropped():
    s = IntervalSet([(4, 4), (1, 2)])
    assert list(s) == [Interval(1, 2)]
    assert not IntervalSet([(3, 3)])


def test_point_membership():
    s = IntervalSet([(0, 5), (10, 20)])
    assert 0 in s
    assert 4.5 in s
    assert 5 not in s
    assert 7 not in s
    assert 19 in s
    assert 20 not in s
    assert -1 not in s


def test_interval_containment():
    s = IntervalSet([(0, 5), (10, 20)])
    assert (1, 4) in s
    assert (10, 20) in s
    assert (4, 11) not in s
    assert (6, 6) in s


def test_union_and_add():
    a = IntervalSet([(0, 2), (6, 8)])
    b = IntervalSet([(1, 3), (9, 10)])
    assert list(a | b) == [Interval(0, 3), Interval(6, 8), Interval(9, 10)]
    assert list(a.add((1.5, 7))) == [Interval(0, 8)]


def test_intersection():
    a = IntervalSet([(0, 5), (8, 12)])
    b = IntervalSet([(3, 9), (11, 20)])
    assert list(a & b) == [Interval(3, 5), Interval(8, 9), Interval(11, 12)]
    assert not (a & IntervalSet([(5, 8)]))


def test_difference_and_remove():
    a = IntervalSet([(0, 10)])
    assert list(a - IntervalSet([(2, 3), (5, 7)])) == [
        Interval(0, 2),
        Interval(3, 5),
        Interval(7, 10),
    ]
    assert list(a.remove((0, 10))) == []
    assert list(a.remove((-5, 4))) == [Interval(4, 10)]


def test_gaps():
    s = IntervalSet([(9, 12), (13, 17)])
    assert list(s.gaps()) == [Interval(12, 13)]
    assert list(s.gaps(within=(8, 18))) == [Interval(8, 9), Interval(12, 13), Interval(17, 18)]
    assert list(s.gaps(within=(10, 14))) == [Interval(12, 13)]


def test_total_length_and_bounds():
    s = IntervalSet([(0, 2.5), (4, 5)])
    assert s.total_length == 3.5
    assert s.bounds == Interval(0, 5)
    assert IntervalSet().bounds is None


def test_equality_and_hash():
    a = IntervalSet([(1, 4), (2, 6)])
    b = IntervalSet([(1, 6)])
    assert a == b
    assert hash(a) == hash(b)
    assert repr(b) == "IntervalSet([(1, 6)])"


def test_invalid_interval_rejected():
    with pytest.raises(ValueError):
        IntervalSet([(3, 1)])
