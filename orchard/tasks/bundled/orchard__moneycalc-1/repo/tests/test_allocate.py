import pytest

from moneycalc import Money


def test_split_keeps_every_cent():
    parts = Money("10").split(3)
    assert parts == [Money("3.34"), Money("3.33"), Money("3.33")]
    assert sum(parts) == Money("10")


def test_split_negative_amount():
    parts = Money("-0.05").split(2)
    assert parts == [Money("-0.03"), Money("-0.02")]


def test_split_zero_decimal_currency():
    assert Money(1000, "JPY").split(3) == [Money(334, "JPY"), Money(333, "JPY"), Money(333, "JPY")]


def test_allocate_by_ratio():
    parts = Money("100").allocate([1, 1, 2])
    assert parts == [Money(25), Money(25), Money(50)]
    parts = Money("0.05").allocate([3, 7])
    assert parts == [Money("0.02"), Money("0.03")]
    assert sum(parts) == Money("0.05")


@pytest.mark.parametrize("ratios", [[], [0, 0], [1, -1]], ids=["empty", "zeros", "negative"])
def test_allocate_invalid_ratios(ratios):
    with pytest.raises(ValueError):
        Money(1).allocate(ratios)


def test_split_requires_positive_parts():
    with pytest.raises(ValueError):
        Money(1).split(0)
