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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from support import kio_classes  # noqa: F401  (registers the Records strategy)

from proxy.protocol import codec, writers
from proxy.protocol.framing import payload_bytes
from proxy.protocol.messages import make, request_module, response_module

VERSIONS = range(4, 18)


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


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.data())
def test_random_fetch_messages_are_the_same_bytes_in_ranges(data: st.DataObject) -> None:
    version = data.draw(st.sampled_from(VERSIONS))
    response = data.draw(st.booleans())
    mod = response_module(1, version) if response else request_module(1, version)
    obj = data.draw(st.from_type(mod.FetchResponse if response else mod.FetchRequest))
    path = codec.FETCH_RESPONSE_PARTITIONS if response else codec.FETCH_REQUEST_PARTITIONS
    every = data.draw(st.integers(0, 3))
    for cut in (path, path[:1], ()):
        assert ranged(obj, cut, every)[0] == whole(obj)


def big_response(n: int, version: int) -> Any:
    mod = response_module(1, version)
    parts = tuple(
        make(
            mod.PartitionData,
            partition_index=p,
            error_code=ErrorCode.none,
            high_watermark=p,
            last_stable_offset=-1,
            log_start_offset=0,
            aborted_transactions=(),
            records=b"r" * (p % 3) if p % 97 == 0 else None,
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
    return make(
        mod.FetchResponse,
        throttle_time=timedelta(milliseconds=3),
        error_code=ErrorCode.none,
        session_id=7,
        responses=topics,
    )


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
    count = 0
    while True:
        try:
            next(steps)
            count += 1
        except StopIteration as done:
            gathered = done.value
            break
    assert count >= n // every + 20  # the partitions, then the gather of their pieces
    assert payload_bytes(gathered) == payload_bytes(codec.encode_response_gathered(response, 9))
