"""Shaping's prepare in ranges (issue 19: no request holds the loop).

``FetchShaper.prepare_in_ranges`` walks a fetch's partitions in ranges that yield, as
the other stages of a large fetch do (proxy/fetchpath.py); it prepares exactly what
``prepare`` does.  At 20,000 partitions the whole prepare was the longest walk left
in a fetch (40-80 ms of CPU on a loaded machine).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from support.fetch_messages import counted, fetch_request, fetch_topics

from proxy.protocol.messages import make, request_module
from proxy.shaping.limits import Limits
from proxy.shaping.shaper import FetchShaper

EVERY = 500
FetchPartition = request_module(1, 12).FetchPartition


def fetch(partitions: int, topics: int = 2) -> Any:
    per = partitions // topics
    return fetch_request(
        12,
        fetch_topics(
            12,
            (
                (
                    f"t{t}",
                    make(
                        FetchPartition,
                        partition=p,
                        fetch_offset=p * 3,
                        partition_max_bytes=1 << 20,
                    ),
                )
                for t in range(topics)
                for p in range(per)
            ),
        ),
        max_wait=timedelta(milliseconds=500),
    )


def test_a_large_prepare_yields_every_range_and_prepares_the_same() -> None:
    request = fetch(20_000)
    whole = FetchShaper(Limits(max_partition_bytes=4096)).prepare(request)
    sliced = FetchShaper(Limits(max_partition_bytes=4096))
    prepared, yields = counted(sliced.prepare_in_ranges(request, EVERY))
    # the offsets named, the response limits and the rotation's walk: 40 ranges each
    assert yields >= 3 * 20_000 // EVERY
    assert prepared == whole


def test_a_rotated_request_is_rebuilt_alike_in_ranges() -> None:
    request = fetch(4_000)
    a, b = FetchShaper(Limits()), FetchShaper(Limits())
    for shaper in (a, b):
        shaper.prepare(request)
        shaper.upstream_rotation.observe([("t0", 7)])  # the next fetch starts after t0-7
    whole = a.prepare(request)
    sliced, yields = counted(b.prepare_in_ranges(request, EVERY))
    assert sliced == whole
    assert sliced.upstream_request.topics[0].partitions[0].partition == 8
    assert yields >= 4 * 4_000 // EVERY  # the rebuild walks its order too


def test_unsliced_prepare_does_not_yield() -> None:
    _, yields = counted(FetchShaper(Limits()).prepare_in_ranges(fetch(2_000), 0))
    assert yields == 0
