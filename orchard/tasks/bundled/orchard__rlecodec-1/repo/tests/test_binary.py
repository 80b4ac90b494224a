import pytest

from rlecodec import DecodeError, decode_bytes, encode_bytes


def test_encode_bytes():
    assert encode_bytes(b"aaab") == bytes([3, 97, 1, 98])
    assert encode_bytes(b"") == b""


def test_round_trip():
    data = bytes([0, 0, 0, 255, 255, 7]) + b"xyz" * 4
    assert decode_bytes(encode_bytes(data)) == data


def test_run_of_255():
    assert encode_bytes(b"\x00" * 255) == bytes([255, 0])
    assert decode_bytes(bytes([255, 0])) == b"\x00" * 255


def test_decode_errors():
    with pytest.raises(DecodeError, match="truncated"):
        decode_bytes(bytes([3]))
    with pytest.raises(DecodeError, match="zero run length at position 2"):
        decode_bytes(bytes([1, 65, 0, 66]))
