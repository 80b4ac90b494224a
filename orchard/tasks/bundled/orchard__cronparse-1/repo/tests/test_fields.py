import pytest

from cronparse import CronError
from cronparse.fields import DAY_OF_MONTH, DAY_OF_WEEK, HOUR, MINUTE, MONTH, parse_field


def test_star():
    assert parse_field("*", HOUR) == frozenset(range(24))


def test_lists_and_ranges():
    assert parse_field("1,5-7,30", MINUTE) == {1, 5, 6, 7, 30}


def test_steps():
    assert parse_field("*/15", MINUTE) == {0, 15, 30, 45}
    assert parse_field("10-40/10", MINUTE) == {10, 20, 30, 40}
    assert parse_field("5/20", MINUTE) == {5, 25, 45}
    assert parse_field("*/10", DAY_OF_MONTH) == {1, 11, 21, 31}


def test_names_are_case_insensitive():
    assert parse_field("JAN,mar-May", MONTH) == {1, 3, 4, 5}
    assert parse_field("Mon-Fri", DAY_OF_WEEK) == {1, 2, 3, 4, 5}


def test_sunday_is_zero_or_seven():
    assert parse_field("7", DAY_OF_WEEK) == {0}
    assert parse_field("5-7", DAY_OF_WEEK) == {0, 5, 6}
    assert parse_field("*", DAY_OF_WEEK) == frozenset(range(7))


@pytest.mark.parametrize(
    "text,spec",
    [
        ("60", MINUTE),
        ("0", DAY_OF_MONTH),
        ("13", MONTH),
        ("5-1", HOUR),
        ("*/0", MINUTE),
        ("foo", DAY_OF_WEEK),
        ("1,,2", HOUR),
        ("-5", MINUTE),
    ],
    ids=["minute-60", "dom-0", "month-13", "backwards", "zero-step", "bad-name", "empty-item",
         "negative"],
)
def test_invalid_fields(text, spec):
    with pytest.raises(CronError):
        parse_field(text, spec)
