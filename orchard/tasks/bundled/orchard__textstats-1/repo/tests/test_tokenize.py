import pytest

from textstats import count_syllables, sentences, words


def test_words_skip_numbers_and_punctuation():
    assert words("Don't panic: 42 towels, café-au-lait!") == [
        "Don't", "panic", "towels", "café", "au", "lait",
    ]


def test_sentences_basic():
    assert sentences("Hi there. How are you? Great!") == ["Hi there.", "How are you?", "Great!"]


def test_sentences_punctuation_runs_and_quotes():
    text = 'Wait... what?! He said "stop." Then left.'
    assert sentences(text) == ["Wait...", "what?!", 'He said "stop."', "Then left."]


def test_sentences_ignore_trailing_whitespace_and_bare_punctuation():
    assert sentences("One.  ") == ["One."]
    assert sentences("... !") == []
    assert sentences("") == []


@pytest.mark.parametrize(
    "word, expected",
    [("cat", 1), ("make", 1), ("table", 2), ("happy", 2), ("beautiful", 3),
     ("readability", 5), ("the", 1)],
)
def test_count_syllables(word, expected):
    assert count_syllables(word) == expected


def test_count_syllables_contractions():
    assert count_syllables("don't") == 1
    assert count_syllables("we\u2019ll") == 1
