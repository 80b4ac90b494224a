import pytest

from unitconv import DimensionError, Quantity, UnitError, convert, describe, parse_unit


def test_simple_lengths():
    assert convert(1, "mi", "ft") == pytest.approx(5280)
    assert convert(2.54, "cm", "in") == pytest.approx(1.0)


def test_prefixes():
    assert convert(3, "km", "m") == pytest.approx(3000)
    assert convert(1, "kg", "g") == pytest.approx(1000)
    assert convert(250, "ms", "s") == pytest.approx(0.25)
    assert convert(1, "dam", "m") == pytest.approx(10)


def test_exact_names_win_over_prefixes():
    assert convert(2, "min", "s") == pytest.approx(120)
    assert convert(1, "Pa", "N/m^2") == pytest.approx(1)


def test_compound_units():
    assert convert(90, "km/h", "m/s") == pytest.approx(25)
    assert convert(1, "kW*h", "MJ") == pytest.approx(3.6)
    assert convert(1, "N", "kg*m/s^2") == pytest.approx(1)
    assert convert(1000, "cm^3", "L") == pytest.approx(1)
    assert convert(60, "1/min", "Hz") == pytest.approx(1)
    assert convert(2, "W/(m^2*K)", "W*m^-2*K^-1") == pytest.approx(2)


def test_temperatures():
    assert convert(100, "degC", "degF") == pytest.approx(212)
    assert convert(-40, "degF", "degC") == pytest.approx(-40)
    assert convert(0, "K", "degC") == pytest.approx(-273.15)


def test_temperature_cannot_be_combined_or_prefixed():
    with pytest.raises(UnitError, match="cannot be combined"):
        parse_unit("degC/s")
    with pytest.raises(UnitError, match="does not take a prefix"):
        parse_unit("kdegC")


def test_incompatible_units():
    with pytest.raises(DimensionError) as info:
        convert(1, "m", "s")
    assert str(info.value) == "cannot convert m (length) to s (time)"
    assert describe(parse_unit("m/s^2").dims) == "length time^-2"


def test_bad_expressions():
    with pytest.raises(UnitError, match="unknown unit 'furlong'"):
        parse_unit("furlong")
    with pytest.raises(UnitError, match=r"unexpected character '\$'"):
        parse_unit("m$")
    with pytest.raises(UnitError, match="missing"):
        parse_unit("(m/s")
    with pytest.raises(UnitError, match="empty"):
        parse_unit("  ")


def test_quantity():
    q = Quantity(5, "km").to("m")
    assert q.value == pytest.approx(5000) and q.unit == "m"
    assert str(Quantity(1.5, "kg")) == "1.5 kg"
