from decimal import Decimal

import pytest

from moneycalc import CurrencyMismatchError, Money, get_currency


def test_construction_from_various_types():
    assert Money("19.99").amount == Decimal("19.99")
    assert Money(5).amount == Decimal("5.00")
    assert Money(Decimal("1.5"), "EUR").amount == Decimal("1.50")
    assert Money(0.1).amount == Decimal("0.10")
    with pytest.raises(ValueError):
        Money("abc")
    with pytest.raises(TypeError):
        Money(True)


def test_rounds_to_minor_units():
    assert Money("1.234").amount == Decimal("1.23")
    assert Money("1.236").amount == Decimal("1.24")
    assert Money("2.675").amount == Decimal("2.68")
    assert Money("1234.4", "JPY").amount == Decimal("1234")
    assert Money("1.2344", "KWD").amount == Decimal("1.234")


def test_unknown_currency():
    with pytest.raises(ValueError):
        Money(1, "XYZ")
    assert get_currency("eur").code == "EUR"


def test_display():
    m = Money("1234.5", "EUR")
    assert repr(m) == "Money('1234.50', 'EUR')"
    assert str(m) == "EUR 1,234.50"
    assert m.format() == "€1,234.50"
    assert (-Money("3", "GBP")).format() == "-£3.00"
    assert Money(1500, "JPY").format() == "¥1,500"


def test_arithmetic():
    assert Money("1.10") + Money("2.20") == Money("3.30")
    assert Money("5") - Money("7.5") == Money("-2.50")
    assert Money("19.99") * 3 == Money("59.97")
    assert 2 * Money("0.50") == Money("1")
    assert Money("10") / 3 == Money("3.33")
    assert sum([Money("1.01"), Money("2.02")]) == Money("3.03")
    assert abs(Money("-4")) == Money("4")


def test_percent():
    assert Money("80").percent(12.5) == Money("10")
    assert Money("19.99").percent(20) == Money("4.00")


def test_currency_mismatch():
    with pytest.raises(CurrencyMismatchError):
        Money(1, "USD") + Money(1, "EUR")
    with pytest.raises(CurrencyMismatchError):
        Money(1, "USD") < Money(1, "EUR")
    assert Money(1, "USD") != Money(1, "EUR")


def test_ordering_and_hash():
    assert sorted([Money(3), Money("-1"), Money("2.5")]) == [Money(-1), Money("2.5"), Money(3)]
    assert len({Money("1.00"), Money(1), Money("1.001")}) == 1


def test_minor_units_roundtrip():
    assert Money("12.34").minor_units == 1234
    assert Money.from_minor(-505, "EUR") == Money("-5.05", "EUR")
    assert Money.from_minor(1234, "KWD").amount == Decimal("1.234")


def test_immutable():
    m = Money(1)
    with pytest.raises(AttributeError):
        m.amount = Decimal(2)
