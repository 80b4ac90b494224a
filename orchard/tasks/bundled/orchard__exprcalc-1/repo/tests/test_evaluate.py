import math

import pytest

from exprcalc import EvalError, ParseError, evaluate, parse


def test_precedence():
    assert evaluate("1 + 2 * 3") == 7
    assert evaluate("(1 + 2) * 3") == 9
    assert evaluate("7 // 2 + 7 % 2") == 4


def test_power_is_right_associative_and_binds_tighter_than_minus():
    assert evaluate("2 ^ 3 ^ 2") == 512
    assert evaluate("-2 ^ 2") == -4
    assert evaluate("2 ^ -1") == 0.5


def test_variables_and_functions():
    assert evaluate("2 * (x + 1) ^ 2", {"x": 2}) == 18
    assert evaluate("max(1, abs(-5), 3) + sqrt(16)") == 9
    assert evaluate("double(4)", functions={"double": lambda v: 2 * v}) == 8


def test_parse_tree():
    assert parse("-a * 2") == ("bin", "*", ("neg", ("var", "a")), ("num", 2))


def test_incomplete_expression():
    with pytest.raises(ParseError) as info:
        evaluate("1 +")
    assert info.value.position == 3


def test_missing_closing_paren():
    with pytest.raises(ParseError):
        evaluate("(1 + 2")


def test_multiple_trailing_numbers():
    with pytest.raises(ParseError) as info:
        evaluate("1 2 3")
    assert info.value.position == 2


def test_empty_expression():
    with pytest.raises(ParseError):
        evaluate("   ")


def test_eval_errors():
    with pytest.raises(EvalError):
        evaluate("1 / 0")
    with pytest.raises(EvalError):
        evaluate("y + 1")
    with pytest.raises(EvalError):
        evaluate("nope(1)")
    with pytest.raises(EvalError):
        evaluate("sqrt(-1)")
    assert evaluate("sqrt(2)") == pytest.approx(math.sqrt(2))
