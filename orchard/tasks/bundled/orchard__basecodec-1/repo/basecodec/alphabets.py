"""Ready-made codecs for common alphabets."""

from __future__ import annotations

import string

from .codec import Codec

#: Lower-case hexadecimal; decoding accepts upper case too.
BASE16 = Codec(string.digits + "abcdef", case_insensitive=True)
#: Digits and lower-case letters; decoding accepts upper case too.
BASE36 = Codec(string.digits + string.ascii_lowercase, case_insensitive=True)
#: Bitcoin's base58: no 0, O, I or l.
BASE58 = Codec("123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz")
#: Digits, upper case, lower case (the ordering used by most short-id libraries).
BASE62 = Codec(string.digits + string.ascii_uppercase + string.ascii_lowercase)

_BY_BASE = {16: BASE16, 36: BASE36, 58: BASE58, 62: BASE62}


def get_codec(base: int) -> Codec:
    """The built-in codec for ``base`` (16, 36, 58 or 62)."""
    try:
        return _BY_BASE[base]
    except KeyError:
        raise ValueError(f"no built-in codec for base {base}") from None
