"""Upstream frames read in place (``FrameDecoder``'s *preallocate*: a ``bytearray``) reach
only the Fetch path as they are; every other response callback gets ``bytes``."""

from __future__ import annotations

import datetime

from kio.static.primitive import i32Timedelta
from support.fetch_model import batch, make_partition, make_response

from proxy.protocol import codec
from proxy.protocol.codec import drain
from proxy.protocol.fetch_views import decode_fetch_response_in_ranges
from proxy.protocol.framing import BodyPool, Frame, FrameDecoder
from proxy.relay.relay import FrameCallback, Relay

ZERO = i32Timedelta.parse(datetime.timedelta(0))


def _to_proxy(node: int, host: str, port: int) -> tuple[str, int]:
    return host, port


def test_a_relayed_response_read_in_place_reaches_the_client_as_bytes() -> None:
    relay = Relay(_to_proxy)
    request = codec.encode_request(
        codec.request_schema(18, 3)(client_software_name="t", client_software_version="1"),  # type: ignore[misc]
        7,
        "c",
    )
    relay.client_frame(request)
    [sent] = relay.take_upstream()
    response = codec.encode_response(
        codec.response_schema(18, 3)(error_code=0, api_keys=(), throttle_time=ZERO),  # type: ignore[misc]
        int.from_bytes(sent[4:8], "big"),  # the correlation id the relay gave it upstream
    )
    relay.upstream_frame(bytearray(response))
    [out] = relay.take_client()
    assert type(out) is bytes


def test_a_frame_callback_gets_the_very_bytearray_and_others_a_copy() -> None:
    relay = Relay(_to_proxy)
    got: list[Frame] = []
    port = relay._upstream_port
    port.send(b"\x00" * 12, api_key=1, api_version=12, on_response=FrameCallback(got.append))
    port.send(b"\x00" * 12, api_key=1, api_version=12, on_response=got.append)
    sent = relay.take_upstream()
    assert len(sent) == 2
    # a request header: api key, version, then the correlation id the relay gave it
    first, second = (bytearray(bytes(frame[4:8]) + b"abc") for frame in sent)
    relay.upstream_frame(first)
    relay.upstream_frame(second)
    assert got[0] is first and type(got[1]) is bytes and got[1] == second


def test_a_fetch_response_read_in_place_decodes_as_bytes_do_with_read_only_record_views() -> None:
    response = make_response(12, [make_partition(12, p, batch(0, 3), hw=3) for p in range(4)])
    frame = codec.encode_response(response, 5)
    in_place = bytearray(frame)
    got = drain(decode_fetch_response_in_ranges(12, in_place, 2))
    assert got == drain(decode_fetch_response_in_ranges(12, frame, 0))
    for topic in got.responses:
        for p in topic.partitions:
            assert isinstance(p.records, memoryview) and p.records.readonly
            assert p.records.obj is in_place  # a view of the frame, not a copy


def _read(decoder: FrameDecoder, frame: bytes) -> Frame:
    """Feed *frame*'s length prefix, then read its body in place as the edge does."""
    decoder.feed(len(frame).to_bytes(4, "big"))
    assert decoder.next_body() is None
    view = decoder.body_view()
    assert view is not None
    with view:
        view[: len(frame)] = frame
    decoder.received(len(frame))
    body = decoder.next_body()
    assert body is not None
    return body


def test_a_body_is_taken_again_only_once_nothing_refers_to_it() -> None:
    pool = BodyPool(max_bodies=4)
    decoder = FrameDecoder(preallocate=True, bodies=pool)
    big = bytes(range(256)) * 1024  # 256 KiB
    first = _read(decoder, big)
    records = memoryview(first)[100:200]  # a record slice, as the fetch path keeps them
    first_id = id(first)
    del first
    second = _read(decoder, big[::-1])
    assert id(second) != first_id  # the first is referred to by a slice of it
    assert bytes(records) == big[100:200]  # and its bytes are as they were read
    del records
    smaller = big[: 240 * 1024]
    third = _read(decoder, smaller)  # at most 1/8 smaller than the first's allocation
    assert id(third) == first_id and pool.reused == 1
    assert third == smaller and len(third) == len(smaller)
    assert bytes(second) == big[::-1]
    del third
    fourth = _read(decoder, big[: 200 * 1024])  # 1/5 smaller: a fresh body
    assert id(fourth) != first_id and pool.reused == 1


def test_idle_bodies_keep_at_most_the_room_they_are_given() -> None:
    room = [1 << 30]
    pool = BodyPool(max_bodies=8, room=lambda: room[0])
    bodies = [pool.take(1 << 20) for _ in range(4)]
    del bodies
    assert pool.kept_bytes >= 4 << 20
    room[0] = (2 << 20) + 100
    body = pool.take(1 << 20)  # one taken again, the idle rest let go past the room
    assert pool.reused == 1
    assert pool.kept_bytes <= body.__alloc__() + room[0]
    room[0] = 0
    other = pool.take(3 << 20)  # no idle body fits: one grows into it, the other is let go
    assert pool.reused == 2
    assert pool.kept_bytes == body.__alloc__() + other.__alloc__()


def test_a_larger_frame_grows_the_largest_idle_body_smaller_than_it() -> None:
    """No idle body within an eighth above the frame: the largest one below it is grown (its
    pages stay, only the added ones are new), never one far above it, which would hold
    more than the budget counts."""
    pool = BodyPool(max_bodies=4)
    small, middle, large = pool.take(1 << 18), pool.take(1 << 19), pool.take(4 << 20)
    middle[:4] = b"kept"
    ids = id(small), id(middle), id(large)
    del small, middle, large
    grown = pool.take(1 << 20)
    assert id(grown) == ids[1] and pool.reused == 1
    assert len(grown) == 1 << 20
    assert (1 << 20) < grown.__alloc__() <= (1 << 20) + (1 << 17) + 6  # as the budget counts
    assert grown[:4] == b"kept"  # grown in place or moved whole: nothing is zeroed
    again = pool.take(3 << 20)  # the large one is too large, the small one grows
    assert id(again) == ids[0] and pool.reused == 2


def test_at_most_max_bodies_are_kept() -> None:
    pool = BodyPool(max_bodies=2)
    held = [pool.take(1 << 18) for _ in range(5)]  # all in use: only two are kept
    assert pool.kept_bytes <= 2 * ((1 << 18) + 1)
    assert len({id(b) for b in held}) == 5


def test_idle_bodies_not_taken_for_a_while_are_let_go() -> None:
    pool = BodyPool(max_bodies=4)
    kept = pool.take(1 << 20)
    idle = pool.take(1 << 20)
    del idle
    assert pool.release_idle() == 0  # both were taken since the start
    assert pool.release_idle() == (1 << 20) + 1  # the idle one was not since the last call
    assert pool.kept_bytes == kept.__alloc__()  # the one in use stays


def test_bytes_fed_into_a_body_read_in_place_make_no_temporary() -> None:
    """A stream that cannot read into the body (TLS) feeds it what it received: written
    through a view of the body, with no temporary the size of each piece (a bytearray's
    slice assignment from a memoryview makes one)."""
    import tracemalloc

    decoder = FrameDecoder(preallocate=True)
    body = bytes(range(256)) * 4096  # 1 MiB
    framed = len(body).to_bytes(4, "big") + body
    decoder.feed(framed[:4])
    assert decoder.next_body() is None
    pieces = [memoryview(framed)[at : at + (256 << 10)] for at in range(4, len(framed), 256 << 10)]
    tracemalloc.start()
    try:
        decoder.feed(pieces[0])  # allocates the body
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for piece in pieces[1:]:
            decoder.feed(piece)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - before < 64 * 1024  # nothing of a piece's size
    frame = decoder.next_body()
    assert frame is not None and bytes(frame) == body
