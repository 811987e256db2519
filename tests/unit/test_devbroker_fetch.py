"""The dev broker's Fetch path (devbroker.fetch) against Kafka's broker behaviour."""

from __future__ import annotations

import dataclasses
import importlib
import random
import struct
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from devbroker.fetch import NodeFetcher, end_offset_for_epoch
from devbroker.state import ClusterState, TopicState
from proxy.protocol import codec, records
from proxy.sessions.as_broker_cache import FetchSessionCache

HEADER = records.HEADER_SIZE


def batch(count: int = 1, payload: int = 39) -> bytes:
    """A valid v2 batch of *count* records whose total size is 61 + *payload* bytes."""
    after_crc = (
        struct.pack(">hiqqqhii", 0, count - 1, 1000, 1000 + count, -1, -1, -1, count)
        + b"p" * payload
    )
    body = struct.pack(">ibI", 0, 2, crc32c(after_crc)) + after_crc
    return struct.pack(">qi", 0, len(body)) + body


S = len(batch())  # 100 bytes: the size of every default batch below


class Cluster:
    """A two-node dev cluster whose topics are all led by node 1 unless moved."""

    def __init__(self, **topics: int) -> None:
        self.state = ClusterState("dev", [1, 2])
        for name, n in topics.items():
            t = self.state.create_topic(name, n)
            for p in t.partitions:
                p.leader = 1
        self.sessions = FetchSessionCache(rng=random.Random(1))
        self.addresses = {1: ("node1.test", 9001), 2: ("node2.test", 9002)}
        self.fetcher = NodeFetcher(1, self.state, self.sessions, lambda: self.addresses)

    def topic(self, name: str) -> TopicState:
        return self.state.topics[name]

    def append(self, name: str, partition: int, *batches: bytes) -> None:
        part = self.state.partition(name, partition)
        assert part is not None
        for b in batches:
            part.log.append(b, part.leader_epoch)

    def log_bytes(self, name: str, partition: int) -> bytes:
        part = self.state.partition(name, partition)
        assert part is not None
        return bytes(part.log.data)


@dataclass
class P:
    topic: str
    partition: int = 0
    offset: int = 0
    max_bytes: int = 1 << 20
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1
    topic_id: uuid.UUID | None = None


def build(cls: Any, **fields: Any) -> Any:
    return cls(**{k: v for k, v in fields.items() if k in cls.__dataclass_fields__})


def fetch_request(
    c: Cluster,
    v: int,
    parts: list[P],
    *,
    max_bytes: int = 2**31 - 1,
    min_bytes: int = 1,
    max_wait_ms: int = 0,
    session_id: int = 0,
    epoch: int = -1,
    forgotten: list[P] | None = None,
    isolation: int = 0,
    replica_id: int = -1,
) -> Any:
    m = importlib.import_module(f"kio.schema.fetch.v{v}.request")

    def topic_fields(p: P) -> dict[str, Any]:
        if v >= 13:
            tid = p.topic_id if p.topic_id is not None else c.topic(p.topic).topic_id
            return {"topic_id": tid}
        return {"topic": p.topic}

    topics: list[tuple[P, list[Any]]] = []
    for p in parts:
        fp = build(
            m.FetchPartition,
            partition=p.partition,
            fetch_offset=p.offset,
            partition_max_bytes=p.max_bytes,
            current_leader_epoch=p.current_leader_epoch,
            last_fetched_epoch=p.last_fetched_epoch,
        )
        if topics and topic_fields(topics[-1][0]) == topic_fields(p):
            topics[-1][1].append(fp)
        else:
            topics.append((p, [fp]))
    forgotten_topics = tuple(
        build(m.ForgottenTopic, partitions=(p.partition,), **topic_fields(p))
        for p in forgotten or []
    )
    return build(
        m.FetchRequest,
        replica_id=replica_id,
        replica_state=build(m.ReplicaState, replica_id=replica_id)
        if hasattr(m, "ReplicaState")
        else None,
        max_wait=timedelta(milliseconds=max_wait_ms),
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=isolation,
        session_id=session_id,
        session_epoch=epoch,
        topics=tuple(
            build(m.FetchTopic, partitions=tuple(fps), **topic_fields(p)) for p, fps in topics
        ),
        forgotten_topics_data=forgotten_topics,
    )


def roundtrip(resp: Any, v: int) -> Any:
    """Encode the response as the node would send it and decode it like a client."""
    frame = codec.encode_response(resp, 77)
    cid, decoded = codec.decode_response(1, v, frame)
    assert cid == 77 and decoded == resp
    return decoded


def fetch(c: Cluster, v: int, parts: list[P], **kw: Any) -> Any:
    pending = c.fetcher.begin(fetch_request(c, v, parts, **kw), v)
    assert pending.poll() is True
    return roundtrip(pending.complete(), v)


def partitions(resp: Any) -> list[tuple[Any, Any]]:
    """[(topic name or id, PartitionData)] in response order."""
    out = []
    for t in resp.responses:
        key = t.topic if hasattr(t, "topic") else t.topic_id
        out.extend((key, p) for p in t.partitions)
    return out


def only(resp: Any) -> Any:
    parts = partitions(resp)
    assert len(parts) == 1
    return parts[0][1]


# -- basics -----------------------------------------------------------------------------


@pytest.mark.parametrize("v", range(4, 19))
def test_sessionless_fetch_every_version(v: int) -> None:
    c = Cluster(t=1)
    c.append("t", 0, batch(3), batch(2))
    resp = fetch(c, v, [P("t", offset=0)])
    pd = only(resp)
    assert int(pd.error_code) == 0
    assert pd.records == c.log_bytes("t", 0)
    assert (pd.high_watermark, pd.last_stable_offset) == (5, 5)
    assert pd.aborted_transactions is None
    if v >= 5:
        assert pd.log_start_offset == 0
    if v >= 7:
        assert int(resp.error_code) == 0 and resp.session_id == 0
    key = partitions(resp)[0][0]
    assert key == ("t" if v < 13 else c.topic("t").topic_id)
    if v >= 16:
        assert resp.node_endpoints == ()


def test_fetch_from_the_middle_of_a_batch_starts_at_that_batch() -> None:
    c = Cluster(t=1)
    c.append("t", 0, batch(3), batch(2))
    pd = only(fetch(c, 12, [P("t", offset=4)]))
    assert pd.records == c.log_bytes("t", 0)[S:]
    assert records.read_batch_header(pd.records).base_offset == 3


def test_fetch_at_the_high_watermark_is_empty_not_an_error() -> None:
    c = Cluster(t=1)
    c.append("t", 0, batch(2))
    pd = only(fetch(c, 12, [P("t", offset=2)]))
    assert (int(pd.error_code), pd.records, pd.high_watermark) == (0, b"", 2)


def test_response_groups_only_consecutive_partitions_of_a_topic() -> None:
    c = Cluster(a=2, b=1)
    resp = fetch(c, 12, [P("a", 0), P("b", 0), P("a", 1)])
    assert [(t.topic, [p.partition_index for p in t.partitions]) for t in resp.responses] == [
        ("a", [0]),
        ("b", [0]),
        ("a", [1]),
    ]


def test_duplicate_partitions_collapse_to_the_first_position_last_parameters() -> None:
    c = Cluster(a=2)
    c.append("a", 0, batch(3))
    resp = fetch(c, 12, [P("a", 0, offset=0), P("a", 1), P("a", 0, offset=2)])
    assert [p.partition_index for _k, p in partitions(resp)] == [0, 1]
    assert records.read_batch_header(partitions(resp)[0][1].records).base_offset == 0


# -- KIP-74: byte limits, minOneMessage, partial trailing batches ------------------------


def test_request_order_reads_shrink_the_remaining_max_bytes() -> None:
    c = Cluster(t=3)
    for p in range(3):
        c.append("t", p, batch(), batch())
    resp = fetch(c, 12, [P("t", 0), P("t", 1), P("t", 2)], max_bytes=3 * S + 10)
    got = [p.records for _k, p in partitions(resp)]
    assert got[0] == c.log_bytes("t", 0)  # two whole batches
    assert got[1] == c.log_bytes("t", 1)[: S + 10]  # one batch + a partial trailing batch
    assert got[2] == b""  # nothing left
    assert records.complete_prefix_size(got[1]) == S


def test_request_order_decides_who_is_read_first() -> None:
    c = Cluster(t=2)
    for p in range(2):
        c.append("t", p, batch(), batch())
    resp = fetch(c, 12, [P("t", 1), P("t", 0)], max_bytes=2 * S)
    got = {p.partition_index: p.records for _k, p in partitions(resp)}
    assert got == {1: c.log_bytes("t", 1), 0: b""}


def test_partition_max_bytes_ends_in_a_partial_trailing_batch() -> None:
    c = Cluster(t=1)
    c.append("t", 0, batch(), batch(), batch())
    pd = only(fetch(c, 12, [P("t", max_bytes=S + 20)]))
    assert pd.records == c.log_bytes("t", 0)[: S + 20]
    assert [h.base_offset for h in records.iter_batches(pd.records)] == [0]


def test_min_one_message_returns_an_oversized_first_batch_whole() -> None:
    c = Cluster(t=2)
    big = batch(payload=500)
    c.append("t", 0, big, batch())
    c.append("t", 1, batch())
    resp = fetch(c, 12, [P("t", 0, max_bytes=10), P("t", 1)], max_bytes=50)
    got = [p.records for _k, p in partitions(resp)]
    assert got == [c.log_bytes("t", 0)[: len(big)], b""]


def test_partition_max_bytes_zero_still_gets_one_batch_when_first() -> None:
    c = Cluster(t=1)
    c.append("t", 0, batch(), batch())
    pd = only(fetch(c, 12, [P("t", max_bytes=0)]))
    assert pd.records == c.log_bytes("t", 0)[:S]


def test_min_one_message_carries_over_empty_partitions() -> None:
    c = Cluster(t=3)
    c.append("t", 1, batch(payload=300))
    c.append("t", 2, batch(payload=300))
    resp = fetch(c, 12, [P("t", 0), P("t", 1, max_bytes=5), P("t", 2)], max_bytes=5)
    got = [p.records for _k, p in partitions(resp)]
    assert got == [b"", c.log_bytes("t", 1), b""]


def test_min_one_message_carries_over_partitions_with_errors() -> None:
    c = Cluster(t=2)
    c.append("t", 1, batch(payload=300))
    resp = fetch(c, 12, [P("t", 0, offset=99), P("t", 1, max_bytes=1)], max_bytes=1)
    got = [(int(p.error_code), p.records) for _k, p in partitions(resp)]
    assert got == [(1, b""), (0, c.log_bytes("t", 1))]


def test_later_partition_never_returns_a_lone_partial_first_batch() -> None:
    """ReplicaManager.checkFetchDataInfo: an incomplete first entry becomes an empty record set."""
    c = Cluster(t=2)
    c.append("t", 0, batch())
    c.append("t", 1, batch(payload=200))
    resp = fetch(c, 12, [P("t", 0), P("t", 1)], max_bytes=S + 150)
    got = [p.records for _k, p in partitions(resp)]
    assert got == [c.log_bytes("t", 0), b""]
    # ... and the same when the partition's own max_bytes is what cuts the batch.
    resp = fetch(c, 12, [P("t", 0), P("t", 1, max_bytes=150)])
    assert [p.records for _k, p in partitions(resp)] == [c.log_bytes("t", 0), b""]


def test_broker_fetch_max_bytes_caps_the_request() -> None:
    c = Cluster(t=1)
    c.fetcher = NodeFetcher(1, c.state, c.sessions, fetch_max_bytes=S)
    c.append("t", 0, batch(), batch())
    pd = only(fetch(c, 12, [P("t")], max_bytes=10 * S))
    assert pd.records == c.log_bytes("t", 0)[:S]


@dataclass
class Layout:
    sizes: list[list[int]]  # per partition: payload sizes of its batches
    part_max: list[int]
    max_bytes: int


layouts = st.integers(1, 4).flatmap(
    lambda n: st.builds(
        Layout,
        st.lists(st.lists(st.integers(0, 120), max_size=4), min_size=n, max_size=n),
        st.lists(st.integers(0, 400), min_size=n, max_size=n),
        st.integers(0, 900),
    )
)


@settings(max_examples=80, deadline=None)
@given(layouts)
def test_kip74_reads_match_a_model(layout: Layout) -> None:
    n = len(layout.sizes)
    c = Cluster(t=n)
    for p, payloads in enumerate(layout.sizes):
        c.append("t", p, *[batch(payload=s) for s in payloads])
    parts = [P("t", p, max_bytes=layout.part_max[p]) for p in range(n)]
    resp = fetch(c, 12, parts, max_bytes=layout.max_bytes)
    got = [p.records for _k, p in partitions(resp)]

    remaining, first = layout.max_bytes, True
    for p, data in enumerate(got):
        log = c.log_bytes("t", p)
        sizes = [HEADER + s for s in layout.sizes[p]]
        limit = min(layout.part_max[p], remaining)
        if not sizes:
            expected = b""
        elif first:
            expected = log[: min(len(log), max(limit, sizes[0]))]
        elif limit < sizes[0]:
            expected = b""
        else:
            expected = log[: min(len(log), limit)]
        assert data == expected
        if data:
            first = False
        remaining = max(0, remaining - len(data))


# -- long polling -----------------------------------------------------------------------


def test_long_poll_waits_for_min_bytes_and_wakes_on_produce() -> None:
    c = Cluster(t=1)
    pending = c.fetcher.begin(fetch_request(c, 12, [P("t")], max_wait_ms=500, min_bytes=1), 12)
    assert (pending.max_wait_ms, pending.min_bytes) == (500, 1)
    assert pending.poll() is False
    assert pending.poll() is False
    c.append("t", 0, batch())
    assert pending.poll() is True
    assert pending.poll() is True
    pd = only(roundtrip(pending.complete(), 12))
    assert pd.records == c.log_bytes("t", 0) and pd.high_watermark == 1


def test_long_poll_counts_bytes_up_to_partition_max_bytes() -> None:
    """DelayedFetch sums min(bytes after the fetch offset, partition max_bytes) over partitions."""
    c = Cluster(t=2)
    req = fetch_request(
        c, 12, [P("t", 0, max_bytes=60), P("t", 1, max_bytes=60)], max_wait_ms=500, min_bytes=100
    )
    pending = c.fetcher.begin(req, 12)
    assert pending.poll() is False
    c.append("t", 0, batch(), batch())
    assert pending.poll() is False  # 200 bytes on partition 0 count as 60
    c.append("t", 1, batch())
    assert pending.poll() is True  # 60 + 60 >= 100
    got = [p.records for _k, p in partitions(roundtrip(pending.complete(), 12))]
    # The completing read: one whole batch from partition 0 (minOneMessage), and nothing
    # from partition 1 whose first batch does not fit its 60 bytes.
    assert got == [c.log_bytes("t", 0)[:S], b""]


def test_timeout_completion_returns_what_is_there() -> None:
    c = Cluster(t=1)
    pending = c.fetcher.begin(fetch_request(c, 12, [P("t")], max_wait_ms=500, min_bytes=10_000), 12)
    assert pending.poll() is False
    c.append("t", 0, batch())
    assert pending.poll() is False
    pd = only(roundtrip(pending.complete(), 12))  # the edge completes at max_wait
    assert pd.records == c.log_bytes("t", 0)


def test_max_wait_zero_answers_at_once() -> None:
    c = Cluster(t=1)
    pending = c.fetcher.begin(fetch_request(c, 12, [P("t")], max_wait_ms=0, min_bytes=10), 12)
    assert pending.poll() is True
    assert only(pending.complete()).records == b""


def test_min_bytes_zero_answers_at_once() -> None:
    c = Cluster(t=1)
    pending = c.fetcher.begin(fetch_request(c, 12, [P("t")], max_wait_ms=500, min_bytes=0), 12)
    assert pending.poll() is True


def test_read_error_answers_at_once() -> None:
    c = Cluster(t=2)
    req = fetch_request(c, 12, [P("t", 0), P("t", 1, offset=5)], max_wait_ms=500)
    pending = c.fetcher.begin(req, 12)
    assert pending.poll() is True
    assert [int(p.error_code) for _k, p in partitions(pending.complete())] == [0, 1]


def test_unknown_partitions_alone_do_not_end_a_long_poll() -> None:
    """Partitions refused before the read (KafkaApis 'erroneous') are not read errors."""
    c = Cluster(t=1)
    req = fetch_request(c, 12, [P("t"), P("nope")], max_wait_ms=500)
    pending = c.fetcher.begin(req, 12)
    assert pending.poll() is False
    resp = pending.complete()
    assert [(k, int(p.error_code)) for k, p in partitions(resp)] == [("t", 0), ("nope", 3)]


def test_only_unknown_partitions_answer_at_once() -> None:
    c = Cluster(t=1)
    pending = c.fetcher.begin(fetch_request(c, 12, [P("nope")], max_wait_ms=500), 12)
    assert pending.poll() is True


def test_leadership_change_during_the_wait_completes_it() -> None:
    c = Cluster(t=1)
    pending = c.fetcher.begin(fetch_request(c, 12, [P("t")], max_wait_ms=500), 12)
    assert pending.poll() is False
    part = c.state.partition("t", 0)
    assert part is not None
    part.leader, part.leader_epoch = 2, 1
    assert pending.poll() is True
    assert int(only(pending.complete()).error_code) == 6


def test_complete_twice_is_a_bug() -> None:
    c = Cluster(t=1)
    pending = c.fetcher.begin(fetch_request(c, 12, [P("t")]), 12)
    pending.poll()
    pending.complete()
    with pytest.raises(RuntimeError):
        pending.complete()


def test_complete_without_poll_reads() -> None:
    c = Cluster(t=1)
    c.append("t", 0, batch())
    pending = c.fetcher.begin(fetch_request(c, 12, [P("t")], max_wait_ms=500), 12)
    assert only(pending.complete()).records == c.log_bytes("t", 0)


# -- partition errors -------------------------------------------------------------------


def test_unknown_topic_or_partition() -> None:
    """Refused before reading: records end up empty (KafkaApis converts null), aborted list empty."""
    c = Cluster(t=1)
    resp = fetch(c, 12, [P("nope"), P("t", 7)])
    got = [
        (
            k,
            p.partition_index,
            int(p.error_code),
            p.records,
            p.high_watermark,
            p.aborted_transactions,
        )
        for k, p in partitions(resp)
    ]
    assert got == [("nope", 0, 3, b"", -1, ()), ("t", 7, 3, b"", -1, ())]


def test_unknown_topic_id_from_v13() -> None:
    c = Cluster(t=1)
    ghost = uuid.uuid4()
    resp = fetch(c, 13, [P("t"), P("x", topic_id=ghost)])
    got = [(k, int(p.error_code), p.aborted_transactions) for k, p in partitions(resp)]
    assert got == [(c.topic("t").topic_id, 0, None), (ghost, 100, ())]


def test_refused_partitions_come_after_the_read_ones() -> None:
    c = Cluster(t=2)
    resp = fetch(c, 12, [P("nope"), P("t", 0), P("t", 9), P("t", 1)])
    assert [(k, p.partition_index) for k, p in partitions(resp)] == [
        ("t", 0),
        ("t", 1),
        ("nope", 0),
        ("t", 9),
    ]


@pytest.mark.parametrize("offset", [6, -1, 1 << 40])
def test_offset_out_of_range(offset: int) -> None:
    c = Cluster(t=1)
    c.append("t", 0, batch(5))
    pd = only(fetch(c, 12, [P("t", offset=offset)]))
    assert (int(pd.error_code), pd.high_watermark, pd.log_start_offset, pd.last_stable_offset) == (
        1,
        -1,
        -1,
        -1,
    )
    assert pd.records == b"" and pd.aborted_transactions is None


def test_offset_below_log_start_is_out_of_range() -> None:
    c = Cluster(t=1)
    c.append("t", 0, batch(5), batch(5))
    part = c.state.partition("t", 0)
    assert part is not None
    part.log.delete_records_before(5)
    assert int(only(fetch(c, 12, [P("t", offset=4)])).error_code) == 1
    pd = only(fetch(c, 12, [P("t", offset=5)]))
    assert (int(pd.error_code), pd.log_start_offset) == (0, 5)


@pytest.mark.parametrize("v", [12, 15, 16, 17])
def test_not_leader_or_follower_names_the_leader_from_v16(v: int) -> None:
    c = Cluster(t=1)
    part = c.state.partition("t", 0)
    assert part is not None
    part.leader, part.leader_epoch = 2, 4
    resp = fetch(c, v, [P("t")])
    pd = only(resp)
    assert int(pd.error_code) == 6 and pd.records == b"" and pd.high_watermark == -1
    if v >= 16:
        assert (pd.current_leader.leader_id, pd.current_leader.leader_epoch) == (2, 4)
        assert [(e.node_id, e.host, e.port, e.rack) for e in resp.node_endpoints] == [
            (2, "node2.test", 9002, None)
        ]
    else:
        assert (pd.current_leader.leader_id, pd.current_leader.leader_epoch) == (-1, -1)


def test_stopped_leader_has_no_node_endpoint() -> None:
    c = Cluster(t=1)
    part = c.state.partition("t", 0)
    assert part is not None
    part.leader = 2
    c.state.stopped_nodes.add(2)
    resp = fetch(c, 16, [P("t")])
    assert only(resp).current_leader.leader_id == 2 and resp.node_endpoints == ()


def test_fenced_leader_epoch() -> None:
    c = Cluster(t=1)
    part = c.state.partition("t", 0)
    assert part is not None
    part.leader_epoch = 3
    resp = fetch(c, 16, [P("t", current_leader_epoch=2)])
    pd = only(resp)
    assert int(pd.error_code) == 74
    assert (pd.current_leader.leader_id, pd.current_leader.leader_epoch) == (1, 3)
    assert [e.node_id for e in resp.node_endpoints] == [1]


def test_unknown_leader_epoch() -> None:
    c = Cluster(t=1)
    resp = fetch(c, 16, [P("t", current_leader_epoch=1)])
    pd = only(resp)
    assert int(pd.error_code) == 75
    assert pd.current_leader.leader_id == -1 and resp.node_endpoints == ()


def test_matching_leader_epoch_reads() -> None:
    c = Cluster(t=1)
    c.append("t", 0, batch())
    assert only(fetch(c, 12, [P("t", current_leader_epoch=0)])).records == c.log_bytes("t", 0)


def test_negative_partition_max_bytes_fails_only_when_there_is_data() -> None:
    c = Cluster(t=2)
    c.append("t", 0, batch())
    resp = fetch(c, 12, [P("t", 0, max_bytes=-1), P("t", 1, max_bytes=-1)])
    assert [int(p.error_code) for _k, p in partitions(resp)] == [-1, 0]


def test_read_committed_reads_to_the_lso_and_lists_aborted_transactions() -> None:
    c = Cluster(t=1)
    c.append("t", 0, batch(2))
    pd = only(fetch(c, 12, [P("t")], isolation=1))
    assert pd.aborted_transactions == () and pd.last_stable_offset == 2
    assert pd.records == c.log_bytes("t", 0)


@pytest.mark.parametrize(("v", "per_partition"), [(7, True), (12, True), (13, False)])
def test_invalid_isolation_level_fails_the_request(v: int, per_partition: bool) -> None:
    c = Cluster(t=2)
    resp = fetch(c, v, [P("t", 0), P("t", 1)], isolation=2, session_id=0, epoch=0)
    assert int(resp.error_code) == -1 and resp.session_id == 0
    got = [(int(p.error_code), p.records, p.aborted_transactions) for _k, p in partitions(resp)]
    assert got == ([(-1, None, ())] * 2 if per_partition else [])


def test_follower_fetch_is_refused_by_a_single_replica_partition() -> None:
    c = Cluster(t=1)
    c.append("t", 0, batch())
    resp = fetch(c, 12, [P("t"), P("t", current_leader_epoch=0)], replica_id=2)
    # both entries name the same partition: the second one's parameters win
    assert int(only(resp).error_code) == 75
    assert int(only(fetch(c, 15, [P("t")], replica_id=2)).error_code) == 6


@pytest.mark.parametrize("v", [16, 18])
def test_follower_fetch_names_the_leader_but_lists_no_node_endpoints(v: int) -> None:
    # KafkaApis.handleFetchRequest answers followers with
    # updateAndGenerateResponseData(partitions, Seq.empty): CurrentLeader, no NodeEndpoints.
    c = Cluster(t=2)
    part = c.state.partition("t", 1)
    assert part is not None
    part.leader, part.leader_epoch = 2, 4
    resp = fetch(c, v, [P("t", 0), P("t", 1)], replica_id=2)
    got = [
        (int(pd.error_code), pd.current_leader.leader_id, pd.current_leader.leader_epoch)
        for _k, pd in partitions(resp)
    ]
    assert got == [(6, 1, 0), (6, 2, 4)]
    assert resp.node_endpoints == ()
    consumer = fetch(c, v, [P("t", 1)])
    assert [e.node_id for e in consumer.node_endpoints] == [2]


# -- diverging epochs (KIP-320 / KIP-595) -----------------------------------------------


def epochs_cluster() -> Cluster:
    c = Cluster(t=1)
    c.append("t", 0, batch(5))  # offsets 0-4 in epoch 0
    part = c.state.partition("t", 0)
    assert part is not None
    part.leader_epoch = 2
    c.append("t", 0, batch(5))  # offsets 5-9 in epoch 2
    part.leader_epoch = 3  # leader elected again, nothing written yet
    return c


def test_end_offset_for_epoch_follows_the_leader_epoch_cache() -> None:
    c = epochs_cluster()
    part = c.state.partition("t", 0)
    assert part is not None
    assert end_offset_for_epoch(part, 0) == (0, 5)
    assert end_offset_for_epoch(part, 1) == (0, 5)
    assert end_offset_for_epoch(part, 2) == (2, 10)
    assert end_offset_for_epoch(part, 3) == (3, 10)
    assert end_offset_for_epoch(part, 4) is None


def test_diverging_epoch_is_reported_without_records() -> None:
    c = epochs_cluster()
    pending = c.fetcher.begin(
        fetch_request(c, 12, [P("t", offset=7, last_fetched_epoch=0)], max_wait_ms=500), 12
    )
    assert pending.poll() is True
    pd = only(roundtrip(pending.complete(), 12))
    assert (pd.diverging_epoch.epoch, pd.diverging_epoch.end_offset) == (0, 5)
    assert int(pd.error_code) == 0 and pd.records == b"" and pd.high_watermark == 10


def test_consistent_last_fetched_epoch_reads() -> None:
    c = epochs_cluster()
    pd = only(fetch(c, 12, [P("t", offset=7, last_fetched_epoch=2)]))
    assert pd.diverging_epoch.epoch == -1 and pd.records == c.log_bytes("t", 0)[S:]


def test_unknown_last_fetched_epoch_is_out_of_range() -> None:
    c = epochs_cluster()
    assert int(only(fetch(c, 12, [P("t", offset=7, last_fetched_epoch=9)])).error_code) == 1


# -- fetch sessions through the Fetch API -----------------------------------------------


def test_full_then_incremental_fetches() -> None:
    c = Cluster(t=2)
    c.append("t", 0, batch())
    resp = fetch(c, 12, [P("t", 0), P("t", 1)], epoch=0)
    sid = resp.session_id
    assert sid > 0 and len(partitions(resp)) == 2
    # The cached fetch offset is still 0: the session returns the same data again.
    resp = fetch(c, 12, [], session_id=sid, epoch=1)
    assert [p.partition_index for _k, p in partitions(resp)] == [0]
    # The client moved on: nothing changed, so the incremental response carries no partitions.
    resp = fetch(c, 12, [P("t", 0, offset=1)], session_id=sid, epoch=2)
    assert (resp.session_id, partitions(resp)) == (sid, [])
    # New data on partition 1 only.
    c.append("t", 1, batch())
    resp = fetch(c, 12, [], session_id=sid, epoch=3)
    assert [(p.partition_index, p.records) for _k, p in partitions(resp)] == [
        (1, c.log_bytes("t", 1))
    ]


def test_incremental_fetch_updates_offsets_and_forgets() -> None:
    c = Cluster(t=2)
    c.append("t", 0, batch(), batch())
    sid = fetch(c, 12, [P("t", 0), P("t", 1)], epoch=0).session_id
    resp = fetch(c, 12, [P("t", 0, offset=1)], session_id=sid, epoch=1, forgotten=[P("t", 1)])
    assert [(p.partition_index, p.records) for _k, p in partitions(resp)] == [
        (0, c.log_bytes("t", 0)[S:])
    ]
    session = c.sessions.get(sid)
    assert session is not None and session.size == 1


def test_incremental_reads_in_session_order_with_rotation() -> None:
    c = Cluster(t=2)
    sid = fetch(c, 12, [P("t", 0), P("t", 1)], epoch=0).session_id
    c.append("t", 0, batch())
    # Partition 0 returns data and moves behind partition 1.
    resp = fetch(c, 12, [P("t", 0, offset=0)], session_id=sid, epoch=1)
    assert [p.partition_index for _k, p in partitions(resp)] == [0]
    c.append("t", 0, batch())
    c.append("t", 1, batch())
    # Session order is now [1, 0]: partition 1 is read first and gets the only batch that fits.
    resp = fetch(c, 12, [P("t", 0, offset=1)], session_id=sid, epoch=2, max_bytes=S)
    got = [(p.partition_index, len(p.records)) for _k, p in partitions(resp)]
    assert got == [(1, S), (0, 0)]  # 0 is included because its high watermark moved


def test_session_errors_through_the_fetch_api() -> None:
    c = Cluster(t=1)
    sid = fetch(c, 12, [P("t")], epoch=0).session_id
    for kw, code in [
        ({"session_id": sid + 1, "epoch": 1}, 70),
        ({"session_id": sid, "epoch": 5}, 71),
    ]:
        resp = fetch(c, 12, [P("t")], **kw)
        assert (int(resp.error_code), resp.session_id, resp.responses) == (code, 0, ())
    resp = fetch(c, 13, [P("t")], session_id=sid, epoch=1)
    assert (int(resp.error_code), resp.session_id, resp.responses) == (106, 0, ())


def test_session_with_an_unknown_topic_id_resolves_once_the_topic_exists() -> None:
    c = Cluster(t=1)
    later = uuid.uuid4()
    resp = fetch(c, 13, [P("t"), P("late", topic_id=later)], epoch=0)
    assert int(resp.error_code) == 0 and resp.session_id > 0
    assert [int(p.error_code) for _k, p in partitions(resp)] == [0, 100]
    topic = c.state.create_topic("late", 1)
    c.state.topics_by_id.pop(topic.topic_id)
    topic.topic_id = later
    for p in topic.partitions:
        p.topic_id, p.leader = later, 1
    c.state.topics_by_id[later] = topic
    c.append("late", 0, batch())
    resp = fetch(c, 13, [], session_id=resp.session_id, epoch=1)
    assert [(k, int(p.error_code), p.records) for k, p in partitions(resp)] == [
        (later, 0, c.log_bytes("late", 0))
    ]


def test_recreated_topic_is_an_inconsistent_topic_id_in_a_session() -> None:
    c = Cluster(t=1)
    old_id = c.topic("t").topic_id
    sid = fetch(c, 13, [P("t")], epoch=0).session_id
    del c.state.topics["t"]
    del c.state.topics_by_id[old_id]
    new = c.state.create_topic("t", 1)
    new.partitions[0].leader = 1
    resp = fetch(c, 13, [], session_id=sid, epoch=1)
    assert [(k, int(p.error_code)) for k, p in partitions(resp)] == [(old_id, 103)]


def test_full_cache_answers_sessionless() -> None:
    c = Cluster(t=1)
    c.sessions = FetchSessionCache(max_slots=1)
    c.fetcher = NodeFetcher(1, c.state, c.sessions)
    assert fetch(c, 12, [P("t")], epoch=0).session_id > 0
    resp = fetch(c, 12, [P("t")], epoch=0)
    assert resp.session_id == 0 and len(partitions(resp)) == 1


def test_clear_makes_the_next_incremental_fetch_fail() -> None:
    c = Cluster(t=1)
    sid = fetch(c, 12, [P("t")], epoch=0).session_id
    c.sessions.clear()
    assert int(fetch(c, 12, [], session_id=sid, epoch=1).error_code) == 70


def test_follower_sessions_are_privileged() -> None:
    c = Cluster(t=1)
    sid = fetch(c, 12, [P("t")], epoch=0, replica_id=2).session_id
    session = c.sessions.get(sid)
    assert session is not None and session.privileged


def test_zero_topic_id_is_unknown_topic_id() -> None:
    c = Cluster(t=1)
    m = importlib.import_module("kio.schema.fetch.v13.request")
    req = m.FetchRequest(
        max_wait=timedelta(0),
        min_bytes=1,
        topics=(
            m.FetchTopic(
                topic_id=None,
                partitions=(
                    m.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=100),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )
    pending = c.fetcher.begin(req, 13)
    assert pending.poll() is True
    resp = roundtrip(pending.complete(), 13)
    assert [(k, int(p.error_code)) for k, p in partitions(resp)] == [(None, 100)]


def test_negative_partition_index_is_unknown() -> None:
    c = Cluster(t=1)
    assert int(only(fetch(c, 12, [P("t", -1)])).error_code) == 3


def test_node_endpoints_list_each_leader_once() -> None:
    c = Cluster(t=3)
    for p in c.topic("t").partitions:
        p.leader = 2
    resp = fetch(c, 17, [P("t", 0), P("t", 1), P("t", 2)])
    assert [int(p.error_code) for _k, p in partitions(resp)] == [6, 6, 6]
    assert [e.node_id for e in resp.node_endpoints] == [2]


def test_forgotten_topics_by_id_from_v13() -> None:
    c = Cluster(a=1, b=1)
    sid = fetch(c, 13, [P("a"), P("b")], epoch=0).session_id
    fetch(c, 13, [], session_id=sid, epoch=1, forgotten=[P("a")])
    session = c.sessions.get(sid)
    assert session is not None
    assert [cp.topic for cp in session.partitions.values()] == ["b"]


@dataclass
class Step:
    produce: list[int]  # partitions that get a batch before this fetch
    consume: bool  # whether the client moves its offsets to the high watermark afterwards


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.builds(Step, st.lists(st.integers(0, 2), max_size=3), st.booleans()),
        min_size=1,
        max_size=8,
    )
)
def test_incremental_fetches_agree_with_sessionless_fetches(steps: list[Step]) -> None:
    """KIP-227: a session client's view equals what sessionless fetches would have shown."""
    c = Cluster(t=3)
    offsets = [0, 0, 0]  # the client's positions
    told = [0, 0, 0]  # the positions the session has cached
    known: dict[int, tuple[int, int]] = {}  # partition -> (hw, log start) last seen
    sid, epoch = 0, 0
    for step in steps:
        for p in step.produce:
            c.append("t", p, batch())
        parts = [P("t", p, offset=offsets[p]) for p in range(3)]
        expected = {p.partition_index: p for _k, p in partitions(fetch(c, 12, parts))}
        if sid == 0:
            resp = fetch(c, 12, parts, epoch=0)
            sid, epoch = resp.session_id, 1
            got = {p.partition_index: p for _k, p in partitions(resp)}
            assert got == expected
        else:
            changed = [P("t", p, offset=offsets[p]) for p in range(3) if offsets[p] != told[p]]
            resp = fetch(c, 12, changed, session_id=sid, epoch=epoch)
            epoch += 1
            assert int(resp.error_code) == 0 and resp.session_id == sid
            got = {p.partition_index: p for _k, p in partitions(resp)}
            for idx, pd in expected.items():
                if idx in got:
                    assert got[idx] == pd
                else:
                    assert pd.records == b""
                    assert known[idx] == (pd.high_watermark, pd.log_start_offset)
        told = list(offsets)
        for idx, pd in got.items():
            known[idx] = (pd.high_watermark, pd.log_start_offset)
        if step.consume:
            offsets = [known[p][0] for p in range(3)]


def test_request_max_bytes_zero_still_returns_one_batch() -> None:
    c = Cluster(t=2)
    c.append("t", 0, batch(), batch())
    c.append("t", 1, batch())
    resp = fetch(c, 12, [P("t", 0), P("t", 1)], max_bytes=0)
    assert [p.records for _k, p in partitions(resp)] == [c.log_bytes("t", 0)[:S], b""]


def test_negative_request_max_bytes_fails_the_first_read_then_reads_one_batch() -> None:
    """As ReplicaManager.readFromLog does: the limit drops to 0 after the failed read."""
    c = Cluster(t=2)
    c.append("t", 0, batch())
    c.append("t", 1, batch(), batch())
    pending = c.fetcher.begin(
        fetch_request(c, 12, [P("t", 0), P("t", 1)], max_bytes=-5, max_wait_ms=500), 12
    )
    assert pending.min_bytes == -5
    assert pending.poll() is True
    got = [
        (int(p.error_code), p.records) for _k, p in partitions(roundtrip(pending.complete(), 12))
    ]
    assert got == [(-1, b""), (0, c.log_bytes("t", 1)[:S])]


@pytest.mark.parametrize("v", [4, 7, 11, 12, 13, 15, 16, 17, 18])
def test_any_decodable_request_gets_an_encodable_response(v: int) -> None:
    """Whatever a client sends, begin/poll/complete answer without raising."""
    m = importlib.import_module(f"kio.schema.fetch.v{v}.request")
    c = Cluster(t=2)
    c.append("t", 0, batch(), batch())

    @settings(max_examples=25, deadline=None)
    @given(st.from_type(m.FetchRequest), st.booleans())
    def check(request: Any, aim_at_topic: bool) -> None:
        if aim_at_topic and request.topics:
            # Point the first topic at a real one so reads happen too.
            first = request.topics[0]
            key = {"topic_id": c.topic("t").topic_id} if v >= 13 else {"topic": "t"}
            request = dataclasses.replace(
                request, topics=(dataclasses.replace(first, **key), *request.topics[1:])
            )
        pending = c.fetcher.begin(request, v)
        pending.poll()
        pending.poll()
        roundtrip(pending.complete(), v)

    check()
