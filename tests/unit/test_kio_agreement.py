"""Every class kio knows: the compiled writers, the check walk and the compiled readers agree
with kio on random messages, and the readers refuse malformed ones exactly as the old path did.

One Hypothesis test draws each message once and checks every property on it; drawing
the message is most of the cost (kio classes through ``st.from_type``), so this took
the place of one test per property (readers, writers, walk), each drawing its own.
Every property sees 600 examples (derandomized, so the same ones each run): writers (800
when it was a test of its own), the check walk and the codec's round trip (600), the readers'
round trip (1,500 until 2026-11-26, then 1,000, cut twice to keep the suite within 15
minutes: 1,000 took some 95 s of a loaded worker); the malformed variants on the examples
where Hypothesis draws 0 of 0..4 (about 240; ``--hypothesis-show-statistics`` counts them).  Each assertion says which property failed.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st
from kio.serial import entity_reader
from support.kio_agreement import PREFIX, as_bytes, assert_same, compiled_bytes, kio_bytes
from support.kio_classes import SCHEMAS

from proxy.protocol import codec, readers, walk
from proxy.protocol.errors import DecodeError

RESPONSES = frozenset(
    schema
    for api_key in range(100)
    for version in range(30)
    if (schema := codec.response_schema(api_key, version)) is not None
)


def _overflow(exc: Exception) -> bool:
    """kio encodes any int64 millisecond duration but decodes only what a
    ``datetime.timedelta`` holds: such an example says nothing about a reader or walk."""
    return "timedelta milliseconds overflow" in str(exc)


def _malformed(body: bytes, rnd: random.Random) -> list[bytes]:
    """Truncations, byte flips and forged counts/lengths of a valid message."""
    cases = [body[:cut] for cut in range(len(body))] if len(body) <= 256 else []
    cases += [body[: rnd.randrange(len(body) + 1)] for _ in range(20)]
    for _ in range(40):
        mutated = bytearray(body)
        for _ in range(rnd.randint(1, 3)):
            if not mutated:
                break
            at = rnd.randrange(len(mutated))
            if rnd.random() < 0.3 and at + 4 <= len(mutated):  # a forged int32/int16/varint
                forged = rnd.choice(
                    [b"\x7f\xff\xff\xff", b"\xff\xff\xff\xfe", b"\xff\xff", b"\xff\xff\xff\x0f"]
                )
                mutated[at : at + len(forged)] = forged
            else:
                mutated[at] = rnd.choice([0, 1, 0x7F, 0x80, 0xFE, 0xFF, rnd.randrange(256)])
        cases.append(bytes(mutated))
    return cases


def _codec_round_trip(schema: type, obj: Any) -> Any:
    """The message through the codec's frames and strict decode (the walk, then the reader)."""
    api_key, version = obj.__api_key__, obj.__version__
    if schema in RESPONSES and codec.response_schema(api_key, version) is schema:
        frame = codec.encode_response(obj, 7)
        return codec.decode_response(api_key, version, frame, strict=True)[1]
    return codec.decode_request(codec.encode_request(obj, 7, "c"), strict=True)[1]


@settings(
    max_examples=600,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.data())
def test_every_message_is_written_walked_and_read_as_kio_does(data: st.DataObject) -> None:
    schema = data.draw(st.sampled_from(SCHEMAS))
    obj = data.draw(st.from_type(schema))
    name = schema.__name__

    # writers: the compiled writer's bytes are kio's
    assert compiled_bytes(obj) == kio_bytes(obj), f"writers: {name} written otherwise than kio"

    # the check walk passes every valid message, consuming all of it
    body = codec.encode_body(obj)
    assert walk.check(schema, body, 0) == len(body), f"walk.check: {name} not passed whole"

    # readers: decode what kio decodes, after a prefix, consuming what kio consumes
    buf = PREFIX + body
    try:
        expected, size = entity_reader(schema)(buf, len(PREFIX))
    except ValueError as exc:
        if _overflow(exc):
            reject()
        raise
    for views in (readers.NO_VIEWS, readers.FETCH_RECORDS):
        got, end = readers.read(schema, buf, len(PREFIX), views)
        assert end == len(PREFIX) + size == len(buf), (
            f"readers: {name} consumed {end - len(PREFIX)} bytes"
        )
        assert as_bytes(got) == as_bytes(expected), f"readers: {name} read otherwise than kio"
        assert type(got) is type(expected), f"readers: {name} read as {type(got).__name__}"

    # the codec's frames round trip (walk, then reader) to the very message
    try:
        decoded = _codec_round_trip(schema, obj)
    except DecodeError as exc:
        if _overflow(exc):
            reject()
        raise
    assert as_bytes(decoded) == as_bytes(obj), f"codec round trip: {name} decoded otherwise"

    # malformed variants: refused exactly when the old path (walk.check, kio) refused them
    if data.draw(st.integers(0, 4)) == 0:
        event("malformed variants checked")
        rnd = data.draw(st.randoms(use_true_random=False))
        for case in _malformed(body, rnd):
            assert_same(schema, PREFIX + case, len(PREFIX))
