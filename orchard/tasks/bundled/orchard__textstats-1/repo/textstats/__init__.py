"""textstats: word/sentence counts and readability scores."""

from .readability import TextStats, analyze, flesch_kincaid_grade, flesch_reading_ease
from .tokenize import count_syllables, sentences, words

__all__ = [
    "TextStats",
    "analyze",
    "count_syllables",
    "flesch_kincaid_grade",
    "flesch_reading_ease",
    "sentences",
    "words",
]
__version__ = "0.4.1"
