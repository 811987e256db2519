"""Unsigned varints, as Kafka's flexible versions use them (compact lengths, tagged fields)."""

from __future__ import annotations

from .errors import DecodeError


def read_uvarint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """An unsigned varint at *pos*: (value, position after it); DecodeError if malformed."""
    if pos < len(buf) and buf[pos] < 0x80:  # the common one-byte case
        return buf[pos], pos + 1
    value = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise DecodeError("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise DecodeError("varint too long")


def write_uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)
