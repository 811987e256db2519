import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.protocol.errors import FrameTooLarge, ProtocolError, TruncatedFrame
from proxy.protocol.framing import (
    FrameDecoder,
    Gathered,
    encode_frame,
    frame_chunks,
    payload_bytes,
)

frames = st.lists(st.binary(max_size=300), max_size=8)


@given(frames)
def test_whole_stream_roundtrip(payloads: list[bytes]) -> None:
    dec = FrameDecoder(1024)
    dec.feed(b"".join(encode_frame(p) for p in payloads))
    assert dec.frames() == payloads
    dec.close()


@given(frames)
def test_byte_by_byte_roundtrip(payloads: list[bytes]) -> None:
    dec = FrameDecoder(1024)
    stream = b"".join(encode_frame(p) for p in payloads)
    out = []
    for i in range(len(stream)):
        dec.feed(stream[i : i + 1])
        out += dec.frames()
    assert out == payloads
    dec.close()


def test_oversized_frame_rejected_before_buffering_body() -> None:
    dec = FrameDecoder(100)
    dec.feed(struct.pack(">i", 101))
    with pytest.raises(FrameTooLarge) as info:
        dec.next_frame()
    assert info.value.size == 101
    assert dec.buffered == 4  # the body was never waited for


def test_negative_size_is_a_protocol_error() -> None:
    dec = FrameDecoder(100)
    dec.feed(struct.pack(">i", -1))
    with pytest.raises(ProtocolError):
        dec.next_frame()


@pytest.mark.parametrize("cut", [1, 3, 4, 7])
def test_truncated_stream_detected_on_close(cut: int) -> None:
    dec = FrameDecoder(100)
    dec.feed(encode_frame(b"abcd")[:cut])
    assert dec.next_frame() is None
    with pytest.raises(TruncatedFrame):
        dec.close()


@pytest.mark.parametrize("assemble_from", [2, 65536])
@given(st.binary(max_size=200))
def test_garbage_raises_only_protocol_errors(assemble_from: int, data: bytes) -> None:
    dec = FrameDecoder(64, assemble_from=assemble_from)
    try:
        for i in range(len(data)):
            dec.feed(data[i : i + 1])
            dec.frames()
        dec.close()
    except ProtocolError:
        pass


@given(st.lists(st.binary(max_size=40), max_size=8), st.integers(min_value=0, max_value=30))
def test_frame_chunks_write_the_same_stream(payloads: list[bytes], copy_below: int) -> None:
    chunks = frame_chunks(payloads, copy_below=copy_below)
    assert b"".join(chunks) == b"".join(encode_frame(p) for p in payloads)
    dec = FrameDecoder(1024)
    for chunk in chunks:
        dec.feed(chunk)
    assert dec.frames() == payloads


def test_frame_chunks_pass_large_payloads_uncopied() -> None:
    small, large = b"s" * 10, b"L" * 100
    chunks = frame_chunks([small, large, small, small], copy_below=100)
    assert len(chunks) == 3
    assert chunks[1] is large  # the payload object itself, not a copy
    assert chunks[0] == struct.pack(">i", 10) + small + struct.pack(">i", 100)
    assert chunks[2] == (struct.pack(">i", 10) + small) * 2


gathered = st.lists(st.binary(max_size=40), min_size=1, max_size=5).map(Gathered)


@given(st.lists(st.binary(max_size=40) | gathered, max_size=8), st.integers(0, 30))
def test_gathered_payloads_are_written_as_one_frame(
    payloads: list[bytes | Gathered], copy_below: int
) -> None:
    chunks = frame_chunks(payloads, copy_below=copy_below)
    whole = [payload_bytes(p) for p in payloads]
    assert b"".join(chunks) == b"".join(encode_frame(p) for p in whole)
    assert all(chunks)  # no empty writes
    dec = FrameDecoder(1024)
    for chunk in chunks:
        dec.feed(chunk)
    assert dec.frames() == whole


def test_gathered_large_parts_pass_uncopied() -> None:
    head, big1, big2, tail = b"h" * 6, b"A" * 100, memoryview(b"B" * 200), b"t" * 3
    g = Gathered((head, big1, big2, tail))
    assert len(g) == 309 and g.head is head
    chunks = frame_chunks([g, b"x"], copy_below=100)
    assert chunks[0] == struct.pack(">i", 309) + head
    assert chunks[1] is big1 and chunks[2] is big2  # the very objects, back to back
    assert chunks[3] == tail + struct.pack(">i", 1) + b"x"
    assert len(chunks) == 4
    with pytest.raises(ValueError):
        Gathered(())


@given(frames, st.integers(min_value=1, max_value=64), st.integers(min_value=1, max_value=50))
def test_large_frames_assembled_from_pieces(
    payloads: list[bytes], assemble_from: int, piece: int
) -> None:
    """Bodies of assemble_from bytes or more are collected piece by piece: same frames."""
    dec = FrameDecoder(1024, assemble_from=assemble_from)
    stream = b"".join(encode_frame(p) for p in payloads)
    out = []
    for i in range(0, len(stream), piece):
        dec.feed(memoryview(stream)[i : i + piece])
        out += dec.frames()
    assert out == payloads
    assert all(type(f) is bytes for f in out)
    assert dec.buffered == 0
    dec.close()


def test_large_frame_truncated_inside_its_pieces() -> None:
    dec = FrameDecoder(1024, assemble_from=8)
    dec.feed(encode_frame(b"x" * 20)[:10])
    assert dec.next_frame() is None
    dec.feed(b"yy")
    assert dec.next_frame() is None
    assert dec.buffered == 8
    with pytest.raises(TruncatedFrame):
        dec.close()


def test_large_frame_piece_is_the_frame_when_it_arrives_whole() -> None:
    body = b"z" * 100
    dec = FrameDecoder(1024, assemble_from=10)
    dec.feed(struct.pack(">i", len(body)))
    assert dec.next_frame() is None
    dec.feed(body)
    assert dec.next_frame() is body  # one piece: no copy at all
