"""The partitions a Fetch names, counted from its bytes (``proxy.protocol.fetch_count``)."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import timedelta

import pytest

from proxy.protocol import codec
from proxy.protocol.fetch_count import fetch_partitions
from proxy.protocol.messages import make, request_module


def frame(version: int, sizes: list[int]) -> tuple[bytes, int]:
    mod = request_module(1, version)
    topics = []
    for i, n in enumerate(sizes):
        name = {"topic_id": uuid.UUID(int=i + 1)} if version >= 13 else {"topic": "t" * (i + 1)}
        parts = tuple(
            make(mod.FetchPartition, partition=p, fetch_offset=p, partition_max_bytes=1)
            for p in range(n)
        )
        topics.append(make(mod.FetchTopic, partitions=parts, **name))
    request = make(
        mod.FetchRequest,
        replica_id=-1,
        max_wait=timedelta(0),
        min_bytes=1,
        max_bytes=1,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=tuple(topics),
        forgotten_topics_data=(),
    )
    f = codec.encode_request(request, 1, "c")
    offset = codec.parse_request_header(f).body_offset
    assert offset is not None
    return f, offset


@pytest.mark.parametrize("version", range(4, 19))
def test_the_count_is_the_decoded_requests(version: int) -> None:
    f, offset = frame(version, [3, 0, 300, 1])
    decoded = codec.decode_request(f)[1]
    assert fetch_partitions(version, f, offset) == 304
    assert sum(len(t.partitions) for t in decoded.topics) == 304
    assert fetch_partitions(version, memoryview(f), offset) == 304


@pytest.mark.parametrize("version", [4, 11, 12, 17])
def test_bytes_the_count_cannot_follow_give_none(version: int) -> None:
    f, offset = frame(version, [3, 300])
    assert fetch_partitions(version, f[: len(f) - 40], offset) is None
    assert fetch_partitions(version, f[: offset + 2], offset) is None
    assert fetch_partitions(99, f, offset) is None


@pytest.mark.parametrize("version", [4, 11, 12, 17])
def test_the_walk_stops_once_past_the_most_admitted(version: int) -> None:
    """A refused Fetch costs a walk of at most *above* partitions: bytes past the topic
    whose count passes it are not read (cut off here, where a whole walk gives None)."""
    f, offset = frame(version, [3, 300, 5])
    cut = f[: len(f) - 100]
    assert fetch_partitions(version, cut, offset) is None
    assert fetch_partitions(version, cut, offset, above=100) == 303
    assert fetch_partitions(version, f, offset, above=308) == 308  # not past it: the count
    assert fetch_partitions(version, f, offset, above=307) == 308


@pytest.mark.parametrize("version", [4, 12, 17])
def test_topic_entries_past_the_most_admitted_stop_the_walk_too(version: int) -> None:
    """Topics without partitions (no Kafka client sends one) are walked up to *above*."""
    f, offset = frame(version, [0] * 50)
    assert fetch_partitions(version, f, offset) == 0
    assert fetch_partitions(version, f[: len(f) - 20], offset, above=10) == 11


@pytest.mark.parametrize("version", [4, 11, 12, 13, 17])
def test_the_order_free_form_ignores_the_order_of_the_partitions_only(version: int) -> None:
    from proxy.protocol.fetch_count import order_free

    f, offset = frame(version, [3, 2])
    request = codec.decode_request(f)[1]
    (t0, t1) = request.topics
    moved = dataclasses.replace(  # the first partition moved to the end, as librdkafka does
        request,
        topics=(
            dataclasses.replace(t0, partitions=t0.partitions[1:]),
            t1,
            dataclasses.replace(t0, partitions=t0.partitions[:1]),
        ),
    )
    g = codec.encode_request(moved, 1, "c")
    g_offset = codec.parse_request_header(g).body_offset
    assert g_offset is not None
    key = order_free(version, f, offset)
    assert key is not None and len(key[1]) == 5
    assert order_free(version, g, g_offset) == key
    other = dataclasses.replace(
        moved, topics=(*moved.topics[:2], dataclasses.replace(moved.topics[2], partitions=()))
    )
    h = codec.encode_request(other, 1, "c")
    assert order_free(version, h, offset) != key
    changed = dataclasses.replace(request, max_bytes=2)
    assert order_free(version, codec.encode_request(changed, 1, "c"), offset) != key
    assert order_free(version, f[: len(f) - 3], offset) != key
    assert order_free(version, f[: offset + 30], offset) is None  # (cut inside the topics)


@pytest.mark.parametrize("version", range(7, 19))
def test_a_new_session_epoch_in_the_bytes_is_kios_encoding(version: int) -> None:
    from proxy.protocol.fetch_count import frame_epoch_at, with_epoch_at

    f, _ = frame(version, [2, 1])
    request = codec.decode_request(f)[1]
    for epoch in (0, 1, 77, 2**31 - 1, -1):
        want = codec.encode_request(dataclasses.replace(request, session_epoch=epoch), 1, "c")
        found, at = frame_epoch_at(f)
        assert found == version
        assert with_epoch_at(f, at, epoch) == want
