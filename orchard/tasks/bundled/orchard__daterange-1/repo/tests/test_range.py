from datetime import date

import pytest

from daterange import DateRange


def test_len_is_inclusive():
    assert len(DateRange(date(2024, 1, 1), date(2024, 1, 1))) == 1
    assert len(DateRange(date(2024, 2, 1), date(2024, 3, 1))) == 30


def test_end_before_start_rejected():
    with pytest.raises(ValueError):
        DateRange(date(2024, 1, 2), date(2024, 1, 1))


def test_iteration_with_step():
    r = DateRange(date(2024, 1, 1), date(2024, 1, 10))
    assert list(r.days(4)) == [date(2024, 1, 1), date(2024, 1, 5), date(2024, 1, 9)]
    assert date(2024, 1, 10) in r
    assert date(2024, 1, 11) not in r


def test_split_within_one_month():
    r = DateRange(date(2024, 3, 5), date(2024, 3, 20))
    assert r.split_by_month() == [r]


def test_split_by_month_spring():
    r = DateRange(date(2024, 1, 15), date(2024, 3, 10))
    assert [str(p) for p in r.split_by_month()] == [
        "2024-01-15..2024-01-31",
        "2024-02-01..2024-02-29",
        "2024-03-01..2024-03-10",
    ]


def test_split_by_month_across_new_year():
    r = DateRange(date(2023, 12, 20), date(2024, 1, 5))
    assert [str(p) for p in r.split_by_month()] == [
        "2023-12-20..2023-12-31",
        "2024-01-01..2024-01-05",
    ]


def test_for_month_february():
    assert DateRange.for_month(2023, 2) == DateRange(date(2023, 2, 1), date(2023, 2, 28))
    assert len(DateRange.for_month(2024, 2)) == 29


def test_intersection():
    a = DateRange(date(2024, 1, 1), date(2024, 1, 10))
    b = DateRange(date(2024, 1, 8), date(2024, 1, 20))
    assert a.intersection(b) == DateRange(date(2024, 1, 8), date(2024, 1, 10))
    assert not a.overlaps(DateRange(date(2024, 2, 1), date(2024, 2, 2)))
