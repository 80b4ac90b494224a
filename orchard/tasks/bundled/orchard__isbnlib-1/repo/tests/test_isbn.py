import pytest

from isbnlib import (InvalidISBN, canonical, clean, is_isbn10, is_isbn13, is_valid,
                     isbn10_check_digit, isbn13_check_digit, to_isbn10, to_isbn13)


def test_clean():
    assert clean(" 978-0-306-40615-7 ") == "9780306406157"
    assert clean("ISBN-10: 0-8044-2957-x") == "080442957X"
    assert clean("isbn 0 306 40615 2") == "0306406152"


def test_isbn10_validation():
    assert is_isbn10("0-306-40615-2")
    assert is_isbn10("0-8044-2957-X")
    assert not is_isbn10("0-306-40615-3")
    assert not is_isbn10("0-306-40615")
    assert not is_isbn10("X-306-40615-2")


def test_isbn10_check_digit():
    assert isbn10_check_digit("030640615") == "2"
    assert isbn10_check_digit("080442957") == "X"
    with pytest.raises(ValueError):
        isbn10_check_digit("12345")


def test_isbn13_validation():
    assert is_isbn13("978-0-306-40615-7")
    assert is_isbn13("9791032300824")
    assert not is_isbn13("978-0-306-40615-8")
    assert not is_isbn13("9770306406157")  # not a Bookland prefix
    assert not is_isbn13("978030640615X")


def test_isbn13_check_digit():
    assert isbn13_check_digit("978030640615") == "7"
    assert isbn13_check_digit("978186197271") == "2"
    with pytest.raises(ValueError):
        isbn13_check_digit("97803064061")


def test_is_valid_accepts_both_forms():
    assert is_valid("0-306-40615-2") and is_valid("978-0-306-40615-7")
    assert not is_valid("") and not is_valid("hello")


def test_unicode_digits_rejected():
    assert not is_isbn10("\u0660" * 9 + "0")
    assert not is_isbn13("978" + "\u0660" * 10)


def test_conversions():
    assert to_isbn13("0-306-40615-2") == "9780306406157"
    assert to_isbn13("0-8044-2957-X") == "9780804429573"
    assert to_isbn10("978-0-306-40615-7") == "0306406152"
    assert to_isbn10("9780804429573") == "080442957X"
    assert to_isbn10("0306406152") == "0306406152"
    assert canonical("0-306-40615-2") == canonical("978 0 306 40615 7")


def test_conversion_errors():
    with pytest.raises(InvalidISBN, match="no ISBN-10 form"):
        to_isbn10("9791032300824")
    with pytest.raises(InvalidISBN, match="not a valid ISBN"):
        to_isbn13("0-306-40615-3")
    with pytest.raises(InvalidISBN):
        to_isbn10("12345")
