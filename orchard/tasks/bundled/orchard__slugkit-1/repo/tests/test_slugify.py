import pytest

from slugkit import slugify, unique_slug


def test_basic():
    assert slugify("Hello, World!") == "hello-world"


def test_unicode_title():
    assert slugify("Crème Brûlée — “Ærøskøbing”") == "creme-brulee-aeroskobing"


def test_apostrophes_are_removed_inside_words():
    assert slugify("Don’t Stop Believin'") == "dont-stop-believin"


def test_custom_separator_and_case():
    assert slugify("Hello World", separator="_", lowercase=False) == "Hello_World"
    assert slugify("Hello World", separator="") == "helloworld"


def test_replacements_applied_first():
    assert slugify("Salt & Pepper", replacements=[("&", " and ")]) == "salt-and-pepper"


def test_stopwords_removed():
    assert slugify("Crème Brûlée: a Love Story", stopwords=["a"]) == "creme-brulee-love-story"


def test_stopwords_match_whole_words_only():
    assert slugify("a theater of the absurd", stopwords=["the", "a"]) == "theater-of-absurd"


@pytest.mark.parametrize(
    "max_length,expected",
    [(12, "hello"), (15, "hello-wonderful"), (100, "hello-wonderful-world"), (3, "hel")],
)
def test_max_length_on_word_boundary(max_length, expected):
    assert slugify("Hello wonderful world", max_length=max_length) == expected


def test_max_length_without_word_boundary():
    assert slugify("Hello wonderful world", max_length=12, word_boundary=False) == "hello-wonder"


def test_negative_max_length():
    with pytest.raises(ValueError):
        slugify("abc", max_length=-1)


def test_unique_slug():
    existing = {"hello-world", "hello-world-2"}
    assert unique_slug("Hello World", existing) == "hello-world-3"
    assert unique_slug("Something else", existing) == "something-else"


def test_unique_slug_respects_max_length():
    assert unique_slug("Hello World", {"hello-world"}, max_length=11) == "hello-wor-2"
