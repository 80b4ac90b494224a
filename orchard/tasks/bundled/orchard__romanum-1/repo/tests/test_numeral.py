import pytest

from romanum import OutOfRangeError, Roman


def test_construction_and_display():
    assert str(Roman(42)) == "XLII"
    assert int(Roman("xlii")) == 42
    assert repr(Roman(Roman(7))) == "Roman('VII')"


def test_comparisons_and_sorting():
    chapters = [Roman("X"), Roman("IX"), Roman("XI"), Roman("IV")]
    assert [str(c) for c in sorted(chapters)] == ["IV", "IX", "X", "XI"]
    assert Roman("V") == 5
    assert Roman("V") < 6


def test_arithmetic():
    assert Roman("XL") + 2 == Roman("XLII")
    assert 10 - Roman("III") == Roman("VII")
    assert Roman("MMM") + Roman("CMXCIX") == 3999


def test_arithmetic_out_of_range():
    with pytest.raises(OutOfRangeError):
        Roman("MMMCMXCIX") + 1
    with pytest.raises(OutOfRangeError):
        Roman("V") - 5


def test_usable_as_index():
    items = ["zero", "one", "two", "three"]
    assert items[Roman("III")] == "three"
