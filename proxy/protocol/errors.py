"""The one exception family the protocol layer lets escape."""


class ProtocolError(Exception):
    """Input violated the Kafka wire protocol; the connection that sent it must close."""


class FrameTooLarge(ProtocolError):
    """A length prefix announced a frame larger than the configured maximum."""

    def __init__(self, size: int, limit: int, what: str = "") -> None:
        of = f" ({what})" if what else ""
        super().__init__(f"frame of {size} bytes{of} exceeds the maximum of {limit} bytes")
        self.size = size
        self.limit = limit


class TruncatedFrame(ProtocolError):
    """The peer closed the stream in the middle of a frame."""


class DecodeError(ProtocolError):
    """A frame's body could not be decoded at the announced API key and version."""
