"""Readability formulas built on the counts from :mod:`textstats.tokenize`."""

from __future__ import annotations

from dataclasses import dataclass

from .tokenize import count_syllables, sentences, words


@dataclass(frozen=True)
class TextStats:
    """Counts and scores for one text."""

    words: int
    sentences: int
    syllables: int
    characters: int

    @property
    def words_per_sentence(self) -> float:
        return self.words / self.sentences

    @property
    def syllables_per_word(self) -> float:
        return self.syllables / self.words

    @property
    def flesch_reading_ease(self) -> float:
        """206.835 - 1.015 * words/sentence - 84.6 * syllables/word."""
        return round(206.835 - 1.015 * self.words_per_sentence
                     - 84.6 * self.syllables_per_word, 2)

    @property
    def flesch_kincaid_grade(self) -> float:
        """0.39 * words/sentence + 11.8 * syllables/word - 15.59."""
        return round(0.39 * self.words_per_sentence
                     + 11.8 * self.syllables_per_word - 15.59, 2)


def analyze(text: str) -> TextStats:
    """Count words, sentences, syllables and letters in ``text``.

    Raises :class:`ValueError` if the text contains no words.
    """
    word_list = words(text)
    if not word_list:
        raise ValueError("text contains no words")
    return TextStats(
        words=len(word_list),
        sentences=len(sentences(text)),
        syllables=sum(count_syllables(w) for w in word_list),
        characters=sum(len(w) for w in word_list),
    )


def flesch_reading_ease(text: str) -> float:
    """Flesch reading ease of ``text`` (higher is easier, ~60-70 is plain English)."""
    return analyze(text).flesch_reading_ease


def flesch_kincaid_grade(text: str) -> float:
    """Flesch-Kincaid grade level of ``text`` (a US school grade)."""
    return analyze(text).flesch_kincaid_grade
