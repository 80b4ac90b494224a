import pytest

from romanum import (
    InvalidRomanNumeralError,
    OutOfRangeError,
    from_roman,
    is_roman,
    to_roman,
)

KNOWN = [
    (1, "I"),
    (4, "IV"),
    (9, "IX"),
    (14, "XIV"),
    (40, "XL"),
    (90, "XC"),
    (400, "CD"),
    (944, "CMXLIV"),
    (1994, "MCMXCIV"),
    (2024, "MMXXIV"),
    (3999, "MMMCMXCIX"),
]


@pytest.mark.parametrize("n,numeral", KNOWN, ids=[s for _, s in KNOWN])
def test_to_roman_known_values(n, numeral):
    assert to_roman(n) == numeral


@pytest.mark.parametrize("n,numeral", KNOWN, ids=[s for _, s in KNOWN])
def test_from_roman_known_values(n, numeral):
    assert from_roman(numeral) == n


def test_roundtrip_all_values():
    for n in range(1, 4000):
        assert from_roman(to_roman(n)) == n


@pytest.mark.parametrize("n", [0, -1, 4000])
def test_to_roman_out_of_range(n):
    with pytest.raises(OutOfRangeError):
        to_roman(n)


def test_to_roman_rejects_non_integers():
    with pytest.raises(TypeError):
        to_roman(3.0)
    with pytest.raises(TypeError):
        to_roman(True)


def test_from_roman_case_and_whitespace():
    assert from_roman("mcmxciv") == 1994
    assert from_roman("  XIV\n") == 14


@pytest.mark.parametrize(
    "numeral", ["IIII", "VV", "IC", "XXXX", "MMMM", "IM", "VX", "ABC", "X I", "IXI"]
)
def test_from_roman_rejects_malformed(numeral):
    with pytest.raises(InvalidRomanNumeralError):
        from_roman(numeral)


def test_is_roman():
    assert is_roman("XLII")
    assert not is_roman("XLIIII")
    assert not is_roman("hello")
