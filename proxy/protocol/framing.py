"""Size-prefixed framing (Kafka: a 4-byte big-endian length, then that many bytes).

The decoder checks the announced size against the limit *before* buffering the
body, so a hostile length prefix cannot make us allocate.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from .errors import FrameTooLarge, ProtocolError, TruncatedFrame

_SIZE = struct.Struct(">i")

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes default
COPY_BELOW = 64 * 1024
"""``frame_chunks`` joins payloads smaller than this; larger ones are written as they are."""

Buffer = bytes | bytearray | memoryview


def encode_frame(payload: Buffer) -> bytes:
    return _SIZE.pack(len(payload)) + bytes(payload)


def frame_chunks(payloads: Iterable[Buffer], copy_below: int = COPY_BELOW) -> list[Buffer]:
    """The size-prefixed frames of *payloads* as buffers to write in order.

    Length prefixes and small payloads are joined into as few buffers as
    possible (one write for a burst of small responses); a payload of
    *copy_below* bytes or more is its own buffer, the very object given, so a
    large Fetch response is never copied just to put four bytes in front of it.
    """
    out: list[Buffer] = []
    small: list[Buffer] = []
    for payload in payloads:
        small.append(_SIZE.pack(len(payload)))
        if len(payload) < copy_below:
            small.append(payload)
        else:
            out.append(b"".join(small))
            small = []
            out.append(payload)
    if small:
        out.append(b"".join(small))
    return out


class FrameDecoder:
    """Feed bytes in, take whole frames out."""

    __slots__ = ("_buf", "_need", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_frame_bytes <= 0:
            raise ValueError("max_frame_bytes must be positive")
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._need: int | None = None  # body size of the frame being assembled

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._buf += data

    def next_frame(self) -> bytes | None:
        """Return the next whole frame body, or None if more bytes are needed."""
        if self._need is None:
            if len(self._buf) < 4:
                return None
            (size,) = _SIZE.unpack_from(self._buf, 0)
            if size < 0:
                raise ProtocolError(f"negative frame size {size}")
            if size > self.max_frame_bytes:
                raise FrameTooLarge(size, self.max_frame_bytes)
            del self._buf[:4]
            self._need = size
        if len(self._buf) < self._need:
            return None
        frame = bytes(self._buf[: self._need])
        del self._buf[: self._need]
        self._need = None
        return frame

    def frames(self) -> list[bytes]:
        out = []
        while (frame := self.next_frame()) is not None:
            out.append(frame)
        return out

    def close(self) -> None:
        """The peer closed its side: complain if it left a partial frame behind."""
        if self._need is not None or self._buf:
            raise TruncatedFrame(f"stream ended inside a frame ({len(self._buf)} bytes buffered)")
