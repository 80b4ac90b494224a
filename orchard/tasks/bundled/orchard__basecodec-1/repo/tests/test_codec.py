import pytest

from basecodec import BASE16, BASE36, BASE58, BASE62, Codec, get_codec


def test_base62_known_values():
    assert BASE62.encode(0) == "0"
    assert BASE62.encode(61) == "z"
    assert BASE62.encode(62) == "10"
    assert BASE62.encode(123456789) == "8M0kX"
    assert BASE62.decode("8M0kX") == 123456789


def test_roundtrip_many_numbers():
    for codec in (BASE16, BASE36, BASE58, BASE62, Codec("ab")):
        for n in [0, 1, 2, 57, 58, 255, 256, 10**12, 2**64 + 3]:
            assert codec.decode(codec.encode(n)) == n


def test_hex_matches_builtin():
    assert BASE16.encode(48879) == format(48879, "x") == "beef"
    assert BASE16.decode("BEEF") == 48879


def test_min_length_padding():
    assert BASE62.encode(5, min_length=4) == "0005"
    assert BASE58.encode(0, min_length=3) == "111"
    assert BASE62.decode("0005") == 5


def test_base58_has_no_ambiguous_characters():
    assert not set("0OIl") & set(BASE58.alphabet)
    assert not BASE58.is_valid("0abc")
    assert BASE58.is_valid("abc")


def test_invalid_input():
    with pytest.raises(ValueError):
        BASE62.encode(-1)
    with pytest.raises(TypeError):
        BASE62.encode(1.5)
    with pytest.raises(ValueError) as info:
        BASE36.decode("ab-c")
    assert "position 2" in str(info.value)
    with pytest.raises(ValueError):
        BASE62.decode("")


def test_alphabet_validation():
    with pytest.raises(ValueError):
        Codec("a")
    with pytest.raises(ValueError):
        Codec("abca")
    with pytest.raises(ValueError):
        Codec("aA", case_insensitive=True)


def test_get_codec():
    assert get_codec(36) is BASE36
    with pytest.raises(ValueError):
        get_codec(7)
