"""ISBN-10/13 validation and conversion."""

from isbnlib.checksum import isbn10_check_digit, isbn13_check_digit
from isbnlib.isbn import (InvalidISBN, canonical, clean, is_isbn10, is_isbn13, is_valid,
                          to_isbn10, to_isbn13)

__all__ = ["InvalidISBN", "canonical", "clean", "is_isbn10", "is_isbn13", "is_valid",
           "isbn10_check_digit", "isbn13_check_digit", "to_isbn10", "to_isbn13"]
__version__ = "0.9.1"
