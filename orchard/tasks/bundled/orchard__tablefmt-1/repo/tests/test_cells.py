import pytest

from tablefmt import display_width, pad


@pytest.mark.parametrize(
    "text,width",
    [
        ("abc", 3),
        ("", 0),
        ("東京", 4),
        ("ｶﾀｶﾅ", 4),
        ("e\u0301", 1),
        ("a\u200bb", 2),
        ("Ｆ", 2),
    ],
    ids=["ascii", "empty", "cjk", "halfwidth-kana", "combining", "zero-width", "fullwidth"],
)
def test_display_width(text, width):
    assert display_width(text) == width


def test_pad_alignments():
    assert pad("ab", 5) == "ab   "
    assert pad("ab", 5, "right") == "   ab"
    assert pad("ab", 5, "center") == " ab  "


def test_pad_wide_text():
    assert pad("東京", 6) == "東京  "
    assert pad("東京", 6, "right") == "  東京"


def test_pad_never_truncates():
    assert pad("abcdef", 3) == "abcdef"
