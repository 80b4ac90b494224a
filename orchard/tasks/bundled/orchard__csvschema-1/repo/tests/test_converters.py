import pytest

from csvschema.converters import date_converter, get_converter, to_bool, to_float, to_int


def test_int_accepts_underscores_and_sign():
    assert to_int("-1_000") == -1000


def test_float_rejects_nan_and_inf():
    with pytest.raises(ValueError, match="not a finite number"):
        to_float("nan")
    with pytest.raises(ValueError, match="not a finite number"):
        to_float("-inf")


@pytest.mark.parametrize("text,expected", [("YES", True), ("off", False), ("1", True), ("F", False)])
def test_bool_words(text, expected):
    assert to_bool(text) is expected


def test_custom_date_format_and_callable_types():
    to_date = date_converter("%d/%m/%Y")
    assert to_date("04/03/2021").isoformat() == "2021-03-04"
    assert get_converter(str.upper)("abc") == "ABC"
