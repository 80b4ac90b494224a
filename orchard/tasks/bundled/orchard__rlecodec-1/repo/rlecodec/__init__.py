"""Run-length encoding and decoding of strings and bytes."""

from rlecodec.binary import decode_bytes, encode_bytes
from rlecodec.errors import DecodeError
from rlecodec.runs import expand, iter_runs
from rlecodec.text import decode, encode

__all__ = ["DecodeError", "decode", "decode_bytes", "encode", "encode_bytes", "expand",
           "iter_runs"]
__version__ = "0.2.0"
