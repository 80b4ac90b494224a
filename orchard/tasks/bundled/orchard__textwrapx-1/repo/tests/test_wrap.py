import pytest

from textwrapx import fill, shorten, split_long_word, wrap

TEXT = "The quick brown fox jumps over the lazy dog"


def test_wrap_breaks_on_word_boundaries():
    assert wrap(TEXT, 13) == ["The quick", "brown fox", "jumps over", "the lazy dog"]


def test_lines_never_exceed_width():
    for width in range(5, 30):
        assert all(len(line) <= width for line in wrap(TEXT, width))


def test_whitespace_is_collapsed():
    assert wrap("  a\n\tb   c  ", 20) == ["a b c"]
    assert wrap("   ", 10) == []


def test_long_word_is_split():
    assert wrap("see abcdefghijkl ok go", 6) == ["see", "abcdef", "ghijkl", "ok go"]


def test_long_word_split_with_hyphen():
    assert split_long_word("abcdefgh", 4, "-") == ["abc-", "def-", "gh"]
    assert wrap("x abcdefgh", 4, hyphen="-") == ["x", "abc-", "def-", "gh"]


def test_long_words_kept_when_not_breaking():
    assert wrap("a supercalifragilistic word", 10, break_long_words=False) == [
        "a", "supercalifragilistic", "word"]


def test_fill_with_indent():
    assert fill("one two three four", 11, indent="> ") == "> one two\n> three\n> four"


def test_invalid_width():
    with pytest.raises(ValueError):
        wrap("abc", 0)
    with pytest.raises(ValueError, match="no room"):
        split_long_word("abcdef", 1, "-")


def test_shorten():
    assert shorten("Hello  world!", 20) == "Hello world!"
    assert shorten("Hello world, how are you?", 18) == "Hello world, [...]"
    assert shorten("Supercalifragilistic", 8) == "[...]"
