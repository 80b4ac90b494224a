import pytest

from rlecodec import DecodeError, decode, encode


def test_encode():
    assert encode("aaabccdddd") == "3ab2c4d"
    assert encode("") == ""
    assert encode("abc") == "abc"


def test_digits_and_backslashes_are_escaped():
    assert encode("1112") == "3\\1\\2"
    assert encode("a\\\\b") == "a2\\\\b"
    assert decode("3\\1\\2") == "1112"


def test_long_runs_and_unicode():
    text = "é" * 1000 + "ü" + " " * 12
    assert encode(text) == "1000éü12 "
    assert decode(encode(text)) == text


@pytest.mark.parametrize("bad", ["3", "0a", "a\\", "12"])
def test_decode_errors(bad):
    with pytest.raises(DecodeError):
        decode(bad)


def test_decode_error_position():
    with pytest.raises(DecodeError) as info:
        decode("ab0c")
    assert info.value.position == 2
