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


@given(
    frames,
    st.integers(min_value=1, max_value=64),
    st.lists(st.tuples(st.booleans(), st.integers(min_value=1, max_value=50)), min_size=1),
)
def test_preallocated_bodies_read_in_place_or_fed_give_the_same_frames(
    payloads: list[bytes], assemble_from: int, reads: list[tuple[bool, int]]
) -> None:
    """With *preallocate*, a large body is read into its own buffer (``body_view`` then
    ``received``, as the edge does on plain TCP) or fed (TLS): the same frames, in order;
    small ones are bytes as before."""
    dec = FrameDecoder(1024, assemble_from=assemble_from, preallocate=True)
    stream = memoryview(b"".join(encode_frame(p) for p in payloads))
    out: list[bytes | bytearray] = []
    pos = turn = 0
    while pos < len(stream):
        in_place, n = reads[turn % len(reads)]
        turn += 1
        view = dec.body_view()
        if in_place and view is not None:
            with view:
                n = min(n, len(view), len(stream) - pos)
                view[:n] = stream[pos : pos + n]
            dec.received(n)
        else:
            dec.feed(stream[pos : pos + n])
            n = min(n, len(stream) - pos)
        pos += n
        while (frame := dec.next_body()) is not None:
            out.append(frame)
    assert out == payloads
    # only a large body is read in place (one that arrived whole with its prefix is cut
    # from the receive buffer, as before)
    assert all(type(f) is bytes for f in out if len(f) < assemble_from)
    assert dec.buffered == 0
    dec.close()


def test_a_preallocated_body_is_allocated_only_when_the_edge_reads_it() -> None:
    """The length prefix alone allocates nothing: the edge takes the frame's memory budget
    first, then asks for the body's place (KIP-72: memory taken before the body is read)."""
    dec = FrameDecoder(1 << 20, assemble_from=8, preallocate=True)
    dec.feed(struct.pack(">i", 100_000) + b"ab")
    assert dec.next_body() is None
    assert dec._body is None and dec.missing == 99_998 and dec.buffered == 2
    view = dec.body_view()
    assert view is not None and len(view) == 99_998
    view[:3] = b"cde"
    view.release()
    dec.received(3)
    assert dec.missing == 99_995
    with pytest.raises(ValueError):
        dec.received(99_996)  # more than the body has room for
    rest = dec.body_view()
    assert rest is not None
    rest[:] = b"f" * len(rest)
    rest.release()
    dec.received(99_995)
    frame = dec.next_body()
    assert type(frame) is bytearray and frame[:5] == b"abcde" and len(frame) == 100_000
    assert dec.body_view() is None and dec.buffered == 0
    dec.close()


def test_next_frame_refuses_a_frame_read_in_place() -> None:
    """``next_frame`` promises bytes: a preallocating decoder's large body comes from
    ``next_body``."""
    dec = FrameDecoder(1024, assemble_from=8, preallocate=True)
    dec.feed(encode_frame(b"x" * 20)[:6])
    assert dec.next_frame() is None
    dec.feed(b"x" * 18)
    with pytest.raises(TypeError):
        dec.next_frame()
