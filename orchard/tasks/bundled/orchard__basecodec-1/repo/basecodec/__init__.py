"""basecodec: integer encoding to arbitrary bases and alphabets."""

from .alphabets import BASE16, BASE36, BASE58, BASE62, get_codec
from .codec import Codec

__all__ = ["BASE16", "BASE36", "BASE58", "BASE62", "Codec", "get_codec"]
__version__ = "0.7.0"
