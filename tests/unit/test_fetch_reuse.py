"""A Fetch request decoded with the parts of the previous one (``proxy.protocol.fetch_reuse``):
always what kio's decode of the same bytes gives."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.protocol import codec
from proxy.protocol.fetch_reuse import Parts, decode_reusing
from proxy.protocol.messages import make, request_module

VERSIONS = range(4, 19)


def request(
    version: int,
    topics: list[tuple[int, list[tuple[int, int]]]],
    *,
    max_wait_ms: int = 500,
    forgotten: tuple[int, ...] = (),
    rack: str = "",
    directory: uuid.UUID | None = None,
) -> Any:
    """A Fetch request: per topic (its number, its (partition, offset) pairs)."""
    mod = request_module(1, version)
    built = []
    for number, partitions in topics:
        name = {"topic_id": uuid.UUID(int=number + 1)} if version >= 13 else {"topic": f"t{number}"}
        parts = tuple(
            make(
                mod.FetchPartition,
                partition=p,
                current_leader_epoch=3,
                fetch_offset=offset,
                last_fetched_epoch=-1,
                log_start_offset=-1,
                partition_max_bytes=65536,
                **({} if directory is None else {"replica_directory_id": directory}),
            )
            for p, offset in partitions
        )
        built.append(make(mod.FetchTopic, partitions=parts, **name))
    gone = []
    for number in forgotten:
        name = {"topic_id": uuid.UUID(int=number + 1)} if version >= 13 else {"topic": f"t{number}"}
        gone.append(make(mod.ForgottenTopic, partitions=(0, 1), **name))
    return make(
        mod.FetchRequest,
        replica_id=-1,
        max_wait=timedelta(milliseconds=max_wait_ms),
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=tuple(built),
        forgotten_topics_data=tuple(gone),
        rack_id=rack,
    )


def encoded(obj: Any) -> tuple[bytes, int]:
    frame = codec.encode_request(obj, 7, "c")
    offset = codec.parse_request_header(frame).body_offset
    assert offset is not None
    return frame, offset


def reuse(version: int, obj: Any, last: Parts | None, every: int = 0) -> tuple[Any, Parts]:
    frame, offset = encoded(obj)
    got = codec.drain(decode_reusing(version, frame, offset, last, every))
    assert got is not None
    decoded, parts = got
    assert decoded == codec.decode_request(frame)[1]
    return decoded, parts


@pytest.mark.parametrize("version", VERSIONS)
def test_a_request_is_decoded_as_kio_decodes_it_with_or_without_the_last(version: int) -> None:
    first = request(version, [(0, [(p, 100 + p) for p in range(5)]), (1, [(0, 7)])])
    decoded, parts = reuse(version, first, None)
    # The next fetch: one offset moved, the first partition went to the end (librdkafka).
    moved = [(p, 100 + p + (10 if p == 2 else 0)) for p in range(1, 5)] + [(0, 100)]
    second = request(version, [(0, moved), (1, [(0, 7)])])
    again, _ = reuse(version, second, parts)
    assert again == second
    # Unchanged entries are the previous request's own (immutable) objects.
    assert again.topics[0].partitions[0] is decoded.topics[0].partitions[1]
    assert again.topics[1] == decoded.topics[1]


@pytest.mark.parametrize("version", [4, 7, 11, 12, 13, 17, 18])
def test_the_fields_around_the_topics_are_read_again_when_they_change(version: int) -> None:
    topics = [(0, [(0, 1), (1, 2)])]
    _, parts = reuse(version, request(version, topics), None)
    changed = request(
        version, topics, max_wait_ms=100, forgotten=(3,) if version >= 7 else (), rack="r1"
    )
    decoded, _ = reuse(version, changed, parts)
    assert int(decoded.max_wait.total_seconds() * 1000) == 100


def test_parts_of_another_version_are_not_taken() -> None:
    topics = [(0, [(0, 1)])]
    _, parts = reuse(11, request(11, topics), None)
    reuse(12, request(12, topics), parts)  # checked against kio's decode of v12


@pytest.mark.parametrize("version", [4, 12, 17])
def test_it_yields_every_so_many_partitions(version: int) -> None:
    obj = request(version, [(0, [(p, p) for p in range(10)]), (1, [(p, p) for p in range(5)])])
    frame, offset = encoded(obj)
    ranges = decode_reusing(version, frame, offset, None, 4)
    yields = 0
    while True:
        try:
            next(ranges)
            yields += 1
        except StopIteration as done:
            assert done.value is not None and done.value[0] == obj
            break
    assert yields == 3  # after 4, 8 and 12 of 15


@pytest.mark.parametrize("version", [4, 11, 12, 17])
def test_bytes_the_walk_cannot_follow_give_none(version: int) -> None:
    """A truncated body or an unknown version: the caller decodes as usual (and refuses)."""
    frame, offset = encoded(request(version, [(0, [(p, p) for p in range(30)])]))
    for cut in (frame[: len(frame) - 40], frame[: offset + 2]):
        assert codec.drain(decode_reusing(version, cut, offset, None, 0)) is None
    assert codec.drain(decode_reusing(99, frame, offset, None, 0)) is None


def test_a_partition_with_tagged_fields_gives_none() -> None:
    """v17's replica directory id is a tagged field of a partition: not walked here."""
    obj = request(17, [(0, [(0, 1)])], directory=uuid.UUID(int=5))
    assert obj.topics[0].partitions[0].replica_directory_id == uuid.UUID(int=5)
    frame, offset = encoded(obj)
    assert codec.drain(decode_reusing(17, frame, offset, None, 0)) is None


_offsets = st.lists(st.integers(0, 3), min_size=0, max_size=6)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([4, 11, 12, 13, 17]),
    st.lists(st.tuples(st.integers(0, 3), _offsets), min_size=0, max_size=4),
    st.lists(st.tuples(st.integers(0, 3), _offsets), min_size=0, max_size=4),
)
def test_any_two_requests_in_a_row(version: int, a: Any, b: Any) -> None:
    """Topics repeated, reordered, emptied; offsets repeated or not: always kio's decode."""

    def shape(spec: Any) -> list[tuple[int, list[tuple[int, int]]]]:
        return [(t, [(p % 3, o) for p, o in enumerate(offs)]) for t, offs in spec]

    _, parts = reuse(version, request(version, shape(a)), None)
    reuse(version, request(version, shape(b)), parts)


def test_a_consumer_whose_every_offset_moves_is_walked_rarely(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The connection walks a sessionless fetch for reuse while it pays (most entries
    repeat); once a walk finds most of them changed it decodes with kio's reader for 1,
    2, 4, ... 16 fetches before walking again (a cold walk, then one judged)."""
    from support.fetch_world import Conn, World

    from proxy import fetchpath

    walked: list[int] = []
    real = fetchpath.fetch_reuse.decode_reusing

    def counted(*args: Any) -> Any:
        walked.append(fetch)
        return (yield from real(*args))

    monkeypatch.setattr(fetchpath.fetch_reuse, "decode_reusing", counted)
    w = World()
    w.state.create_topic("t", 100)
    c = Conn(w).with_edge()
    for fetch in range(1, 21):  # every offset moves on every fetch
        c.fetch(fetch, [("t", p, fetch) for p in range(100)])
    assert walked == [1, 2, 4, 5, 8, 9, 14, 15]
    walked.clear()
    c = Conn(w).with_edge()
    for fetch in range(1, 21):  # one offset moves
        c.fetch(fetch, [("t", p, fetch if p == 7 else 0) for p in range(100)])
    assert walked == list(range(1, 21))


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([4, 11, 12, 13, 17]),
    st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), min_size=1, max_size=4),
    st.booleans(),
)
def test_corrupted_bytes_give_none_or_what_kio_gives(
    version: int, flips: list[tuple[int, int]], with_last: bool
) -> None:
    """Whatever the bytes, the walk answers None (kio's reader then decides, refusing
    what it refuses) or exactly kio's decode; it never refuses on its own."""
    from proxy.protocol.errors import DecodeError

    good = request(version, [(0, [(p, 10 + p) for p in range(6)]), (1, [(0, 3)])])
    frame, offset = encoded(good)
    _, parts = reuse(version, good, None)
    body = bytearray(frame)
    for at, value in flips:
        body[offset + at % (len(frame) - offset)] = value
    bad = bytes(body)
    got = codec.drain(decode_reusing(version, bad, offset, parts if with_last else None, 0))
    try:
        expected = codec.decode_request(bad)[1]
    except DecodeError:
        assert got is None
        return
    assert got is None or got[0] == expected
