import pytest
from semverlite import InvalidRange, max_satisfying, parse_range, satisfies


@pytest.mark.parametrize(
    "version,expr,expected",
    [
        ("1.2.3", "1.2.3", True),
        ("1.2.4", "=1.2.3", False),
        ("1.5.0", ">=1.2.3 <2.0.0", True),
        ("2.0.0", ">=1.2.3 <2.0.0", False),
        ("1.2.3", ">= 1.2.3", True),
        ("0.9.0", "<1.0.0 || >=3.0.0", True),
        ("3.1.0", "<1.0.0 || >=3.0.0", True),
        ("2.1.0", "<1.0.0 || >=3.0.0", False),
        ("4.5.6", "*", True),
        ("4.5.6", "", True),
    ],
    ids=["exact", "eq-other", "and-inside", "and-upper", "spaced-op",
         "or-low", "or-high", "or-gap", "star", "empty"],
)
def test_comparators(version, expr, expected):
    assert satisfies(version, expr) is expected


@pytest.mark.parametrize(
    "version,expr,expected",
    [
        ("1.2.9", "1.2", True),
        ("1.3.0", "1.2.x", False),
        ("1.9.9", "1.x", True),
        ("2.0.0", "1.*", False),
        ("1.3.0", ">1.2", True),
        ("1.2.9", ">1.2", False),
        ("1.2.9", "<=1.2", True),
        ("1.3.0", "<=1.2", False),
    ],
    ids=["minor-x", "minor-x-next", "major-x", "major-star-next",
         "gt-partial", "gt-partial-below", "le-partial", "le-partial-above"],
)
def test_x_ranges(version, expr, expected):
    assert satisfies(version, expr) is expected


@pytest.mark.parametrize(
    "version,expr,expected",
    [
        ("1.9.9", "^1.2.3", True),
        ("2.0.0", "^1.2.3", False),
        ("0.2.9", "^0.2.3", True),
        ("0.3.0", "^0.2.3", False),
        ("0.0.3", "^0.0.3", True),
        ("0.0.4", "^0.0.3", False),
        ("1.4.0", "^1.2", True),
        ("0.1.5", "^0.0", False),
    ],
    ids=["major-in", "major-out", "minor-in", "minor-out",
         "patch-in", "patch-out", "partial-in", "zero-partial-out"],
)
def test_caret(version, expr, expected):
    assert satisfies(version, expr) is expected


@pytest.mark.parametrize(
    "version,expr,expected",
    [
        ("1.2.9", "~1.2.3", True),
        ("1.3.0", "~1.2.3", False),
        ("1.2.2", "~1.2.3", False),
        ("1.9.0", "~1", True),
        ("2.0.0", "~1", False),
    ],
    ids=["full-in", "full-out", "full-below", "major-in", "major-out"],
)
def test_tilde(version, expr, expected):
    assert satisfies(version, expr) is expected


def test_max_satisfying():
    versions = ["1.2.3", "1.2.10", "1.3.0", "2.0.0", "1.2.11-beta.1"]
    assert str(max_satisfying(versions, "^1.2.0 <1.3.0")) == "1.2.11-beta.1"
    assert str(max_satisfying(versions, ">=1.2.0 <1.3.0 || >=2")) == "2.0.0"
    assert str(max_satisfying(versions, ">1")) == "2.0.0"
    assert max_satisfying(versions, ">=3") is None


def test_range_str_and_contains():
    rng = parse_range("^1.2.3 || 3.x")
    assert str(rng) == ">=1.2.3 <2.0.0 || >=3.0.0 <4.0.0"
    assert "3.4.5" in rng
    assert "2.4.5" not in rng


@pytest.mark.parametrize(
    "expr",
    ["1.2.3.4", "~a.b", ">=", "1.2.x.y"],
    ids=["four-parts", "tilde-alpha", "dangling", "x-four"],
)
def test_invalid_ranges(expr):
    with pytest.raises(InvalidRange):
        parse_range(expr)
