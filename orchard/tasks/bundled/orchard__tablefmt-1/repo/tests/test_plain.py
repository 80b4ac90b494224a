import pytest

from tablefmt import format_table


def test_basic_table_with_numbers_right_aligned():
    out = format_table([["apple", 3], ["kiwi", 12.5]], headers=["fruit", "qty"])
    assert out == (
        "fruit   qty\n"
        "-----  ----\n"
        "apple     3\n"
        "kiwi   12.5"
    )


def test_explicit_alignment():
    out = format_table([["a", "b", "c"], ["long", "longer", "longest"]], align="lcr")
    assert out == (
        "a       b           c\n"
        "long  longer  longest"
    )


def test_missing_cells_and_short_rows():
    out = format_table([["x", None], ["y"]], headers=["k", "v"], missing="-")
    assert out.splitlines() == ["k  v", "-  -", "x  -", "y  -"]


def test_floatfmt():
    out = format_table([[1.23456], [10.0]], floatfmt=".2f")
    assert out.splitlines() == [" 1.23", "10.00"]


def test_accented_text_precomposed():
    out = format_table([["Zoë", 1], ["Bob", 22]], headers=["name", "n"])
    assert out.splitlines() == ["name   n", "----  --", "Zoë    1", "Bob   22"]


def test_empty_table():
    assert format_table([]) == ""


def test_errors():
    with pytest.raises(ValueError):
        format_table([[1]], fmt="html")
    with pytest.raises(ValueError):
        format_table([[1, 2]], align="l")
    with pytest.raises(ValueError):
        format_table([[1]], align="x")
