"""RFC 6901 JSON Pointer: parse, resolve, set and remove."""

from jsonpointer.document import MISSING, remove, resolve, set_value
from jsonpointer.pointer import JsonPointerError, escape, parse, to_pointer, unescape

__all__ = ["MISSING", "JsonPointerError", "escape", "parse", "remove", "resolve",
           "set_value", "to_pointer", "unescape"]
__version__ = "1.1.0"
