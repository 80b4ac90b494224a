import pytest

from textstats import analyze, flesch_kincaid_grade, flesch_reading_ease

TEXT = "The cat sat on the mat. It was a happy cat."


def test_analyze_counts():
    stats = analyze(TEXT)
    assert (stats.words, stats.sentences, stats.syllables) == (11, 2, 12)
    assert stats.characters == 31


def test_flesch_reading_ease():
    # 206.835 - 1.015 * 11/2 - 84.6 * 12/11
    assert flesch_reading_ease(TEXT) == pytest.approx(108.96, abs=0.01)


def test_flesch_kincaid_grade():
    # 0.39 * 11/2 + 11.8 * 12/11 - 15.59
    assert flesch_kincaid_grade(TEXT) == pytest.approx(-0.57, abs=0.01)


def test_no_words_is_an_error():
    with pytest.raises(ValueError):
        analyze("")
    with pytest.raises(ValueError):
        flesch_reading_ease("12, 34!")
