"""A Fetch request or response decoded in ranges of partitions is the same entity, refused alike.

Issue 19 part 2: the request of a large fetch and its upstream answer are decoded a
range of partitions per slice of the event loop (``readers.read_in_ranges``,
``codec.decode_request_body_in_ranges``, ``fetch_views.decode_fetch_response_in_ranges``).
For random messages of every Fetch version the ranged decode must give the entity the
whole decode gives (records as views where asked), every cut of the message must be
refused by both, and a 20,000-partition request must yield once every range.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.fetch_messages import (
    RANDOM_FETCH_SETTINGS,
    counted,
    fetch_request,
    fetch_response,
    fetch_topics,
    partition_data,
    random_fetch_messages,
)

from proxy.protocol import codec, fetch_views, readers
from proxy.protocol.errors import DecodeError
from proxy.protocol.messages import make, request_module, response_module


def outcome(call: Any) -> Any:
    try:
        return ("ok", call())
    except DecodeError:
        return ("refused",)


@RANDOM_FETCH_SETTINGS
@given(st.data())
def test_random_fetch_messages_decode_the_same_in_ranges(data: st.DataObject) -> None:
    obj, response, path = data.draw(random_fetch_messages())
    cls = type(obj)
    body = codec.encode_body(obj)
    views = readers.FETCH_RECORDS if response else readers.NO_VIEWS
    every = data.draw(st.integers(0, 3))
    cut = data.draw(st.integers(0, len(body)))
    for buf in (body, body[:cut]):
        whole = outcome(lambda buf=buf: readers.read(cls, buf, 0, views))
        for p in (path, path[:1]):
            ranged = outcome(
                lambda buf=buf, p=p: counted(
                    readers.read_in_ranges(cls, buf, 0, views, path=p, every=every)
                )[0]
            )
            assert ranged == whole


def big_request(n: int) -> bytes:
    mod = request_module(1, 12)
    parts = (
        ("big", make(mod.FetchPartition, partition=p, fetch_offset=p, partition_max_bytes=1 << 20))
        for p in range(n)
    )
    return codec.encode_request(fetch_request(12, fetch_topics(12, parts)), 1, "c")


def test_a_20000_partition_request_yields_every_range() -> None:
    frame = big_request(20_000)
    header = codec.parse_request_header(frame)
    decoded, yields = counted(
        codec.decode_request_body_in_ranges(
            header, frame, path=codec.FETCH_REQUEST_PARTITIONS, every=500
        )
    )
    assert yields == 40 and decoded == codec.decode_request_body(header, frame)


@pytest.mark.parametrize("version", [11, 12, 16])
def test_a_fetch_response_in_ranges_keeps_its_records_as_views(version: int) -> None:
    mod = response_module(1, version)
    parts = tuple(
        partition_data(version, p, high_watermark=9, records=b"r" * 70 if p % 3 == 0 else None)
        for p in range(1200)
    )
    topic = make(mod.FetchableTopicResponse, topic="t", topic_id=None, partitions=parts)
    response = fetch_response(version, [topic])
    frame = codec.encode_response(response, 5)
    ranged, yields = counted(fetch_views.decode_fetch_response_in_ranges(version, frame, 500))
    whole = fetch_views.decode_fetch_response(version, frame)
    assert yields == 2 and ranged == whole
    records = ranged.responses[0].partitions[0].records
    assert (
        isinstance(records, memoryview)
        and records.obj is whole.responses[0].partitions[0].records.obj
    )
