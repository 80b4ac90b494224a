"""Exceptions."""


class DecodeError(ValueError):
    """The encoded data is malformed; ``position`` is where the problem was found."""

    def __init__(self, message: str, position: int):
        super().__init__(f"{message} at position {position}")
        self.position = position
