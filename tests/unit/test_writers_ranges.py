"""A Fetch request or response encoded in ranges of partitions is the same bytes as in one go.

Issue 19 part 2: the upstream request and the client's response of a large fetch
are encoded a range of partitions per slice of the event loop
(``writers.encode_in_ranges``, ``codec.encode_request_in_ranges``,
``codec.encode_response_gathered_in_ranges``).  For random messages of every Fetch
version (tagged fields, null records, empty arrays included) the ranged encoding
must be the uncut one byte for byte, and a 20,000-partition response must yield
once every range.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.fetch_messages import (
    RANDOM_FETCH_SETTINGS,
    counted,
    fetch_response,
    partition_data,
    random_fetch_messages,
)

from proxy.protocol import codec, writers
from proxy.protocol.framing import payload_bytes
from proxy.protocol.messages import make, response_module


def ranged(obj: Any, path: tuple[str, ...], every: int) -> tuple[bytes, int]:
    out: list[Any] = []

    class Out:
        def write(self, data: Any) -> int:
            out.append(bytes(data))
            return len(data)

    steps = writers.encode_in_ranges(obj, Out(), path, every)
    yields = sum(1 for _ in steps)
    return b"".join(out), yields


def whole(obj: Any) -> bytes:
    return codec.encode_body(obj)


@RANDOM_FETCH_SETTINGS
@given(st.data())
def test_random_fetch_messages_are_the_same_bytes_in_ranges(data: st.DataObject) -> None:
    obj, _, path = data.draw(random_fetch_messages())
    every = data.draw(st.integers(0, 3))
    for cut in (path, path[:1], ()):
        assert ranged(obj, cut, every)[0] == whole(obj)


def big_response(n: int, version: int) -> Any:
    mod = response_module(1, version)
    parts = tuple(
        partition_data(
            version, p, high_watermark=p, records=b"r" * (p % 3) if p % 97 == 0 else None
        )
        for p in range(n)
    )
    topics = tuple(
        make(
            mod.FetchableTopicResponse,
            topic=f"t{i}",
            topic_id=None,
            partitions=parts[i * n // 4 : (i + 1) * n // 4],
        )
        for i in range(4)
    )
    return fetch_response(version, topics, throttle_time=timedelta(milliseconds=3), session_id=7)


@pytest.mark.parametrize("version", [11, 12])
def test_a_20000_partition_response_yields_every_range_and_gathers_the_same_frame(
    version: int,
) -> None:
    n, every = 20_000, 500
    response = big_response(n, version)
    body, yields = ranged(response, codec.FETCH_RESPONSE_PARTITIONS, every)
    assert body == whole(response) and yields == n // every
    steps = codec.encode_response_gathered_in_ranges(
        response, 9, path=codec.FETCH_RESPONSE_PARTITIONS, every=every
    )
    gathered, count = counted(steps)
    assert count >= n // every + 20  # the partitions, then the gather of their pieces
    assert payload_bytes(gathered) == payload_bytes(codec.encode_response_gathered(response, 9))
