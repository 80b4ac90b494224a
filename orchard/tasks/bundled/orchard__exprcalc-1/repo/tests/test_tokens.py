import pytest

from exprcalc import ParseError, Token, tokenize


def test_tokenize_positions():
    assert tokenize("12 + x1") == [
        Token("number", 12, 0),
        Token("op", "+", 3),
        Token("name", "x1", 5),
    ]


def test_number_formats():
    values = [t.value for t in tokenize("3 2.5 .5 1e3 7//2")]
    assert values == [3, 2.5, 0.5, 1000.0, 7, "//", 2]


def test_bad_character():
    with pytest.raises(ParseError) as info:
        tokenize("1 + $")
    assert info.value.position == 4
