"""The dev broker's sans-I/O Fetch path as an in-process upstream, and client Fetch requests.

    up = Upstream()                       # one node, topics TOPICS, a session cache
    up.append("orders", 0, 3)             # a RecordBatch v2 of 3 records
    up.answer(up.fetcher, request)        # as the broker answers (through its sessions)
    up.answer(up.direct, request)         # as it answers a sessionless client

:class:`Upstream` is ``devbroker.fetch.NodeFetcher`` over a ``ClusterState`` with
``proxy.sessions.as_broker_cache.FetchSessionCache``: an upstream written from
Kafka's broker, independent of the translator under test.  Every request and
response goes through the codec both ways, so what is compared is what the wire
would carry.
:func:`client_fetch` builds a client's sessionless Fetch of any version.
"""

from __future__ import annotations

import random
from typing import Any

from devbroker.fetch import NodeFetcher
from devbroker.state import ClusterState
from proxy.protocol.codec import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from proxy.protocol.messages import make, request_module
from proxy.sessions.as_broker_cache import FetchSessionCache
from proxy.sessions.topic_ids import TopicIdMap

from .batches import make_batch
from .fetch_messages import fetch_request, fetch_topics

TOPICS = {"orders": 4, "events": 3}
"""The topics every :class:`Upstream` starts with: name -> partitions."""
PARTITIONS = [(t, p) for t, n in TOPICS.items() for p in range(n)]


def batch(count: int) -> bytes:
    """A RecordBatch v2 of ``count`` records at offset 0 (the log assigns the offset)."""
    return make_batch(0, count, b"v" * 20)


class Upstream:
    def __init__(self, *, max_slots: int = 1000) -> None:
        self.state = ClusterState("dev", [1])
        for name, n in TOPICS.items():
            self.state.create_topic(name, n)
        self.sessions = FetchSessionCache(max_slots=max_slots, rng=random.Random(7))
        self.fetcher = NodeFetcher(1, self.state, self.sessions)
        self.direct = NodeFetcher(1, self.state, FetchSessionCache(rng=random.Random(8)))
        self.requests = 0

    def append(self, topic: str, p: int, count: int) -> None:
        part = self.state.partition(topic, p)
        assert part is not None
        part.log.append(batch(count), part.leader_epoch)

    def answer(self, fetcher: NodeFetcher, request: Any) -> Any:
        version = int(request.__version__)
        header, decoded = decode_request(encode_request(request, 9, "t"))
        pending = fetcher.begin(decoded, header.api_version)
        assert pending.poll()  # max_wait is 0: answered at once
        response = pending.complete()
        _, back = decode_response(1, version, encode_response(response, 9))
        return back

    def ids(self) -> TopicIdMap:
        ids = TopicIdMap()
        for name, t in self.state.topics.items():
            ids.learn(name, t.topic_id)
        return ids


def client_fetch(up: Upstream, version: int, parts: list[tuple[str, int, int]]) -> Any:
    """A sessionless Fetch of ``parts`` (topic, partition, offset), by name or id by version."""
    mod = request_module(1, version)
    pairs = []
    for name, p, offset in parts:
        ref: Any = up.state.topics[name].topic_id if version >= 13 else name
        fp = make(mod.FetchPartition, partition=p, fetch_offset=offset, partition_max_bytes=1 << 20)
        pairs.append((ref, fp))
    return fetch_request(version, fetch_topics(version, pairs))
