"""How many partitions a Fetch request names, read from its bytes without decoding it.

A decoded Fetch costs tens of microseconds a partition on the event loop (and
about 110 times its wire size in memory); a Fetch naming more partitions than
the proxy admits (``max_fetch_partitions``) is refused before that cost.  The
count comes from one walk of the request's structure: the fixed fields before
``topics``, then per topic its name (or id) and its partition count, then its
partitions skipped by their fixed size (and, in flexible versions, each one's
tag buffer).  The layout is the one the codec's readers use
(:func:`.walk.plan_for`, from kio's classes), so every Fetch version kio knows
is covered.

Only a count: a frame this walk cannot follow gives None, and the caller decodes
it as usual, so the codec's reader refuses it with its own error.  Given the most
it admits (``above``), the walk stops as soon as the count passes it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from functools import cache
from operator import itemgetter
from typing import NamedTuple

from .codec import parse_request_header
from .errors import DecodeError
from .messages import request_module
from .varint import read_uvarint
from .walk import plan_for

_Layout = tuple[bool, int, int | None, int]
"""(flexible, bytes before topics, a topic id's size or None for a name, a partition's
fixed bytes)."""


@cache
def _layout(version: int) -> _Layout | None:
    mod = request_module(1, version)
    request, topic, partition = (
        plan_for(mod.FetchRequest),
        plan_for(mod.FetchTopic),
        plan_for(mod.FetchPartition),
    )
    head, entry = request.fast_steps[0], partition.fast_steps
    name = topic.fast_steps[0]
    if head[0] != "fixed" or request.fast_steps[1][-1] != "FetchRequest.topics":
        return None
    if len(entry) != 1 or entry[0][0] != "fixed" or topic.fast_steps[1][0] != "earray":
        return None
    if name[0] == "fixed":
        id_size: int | None = name[1]
    elif name[:2] == ("var", "string"):
        id_size = None
    else:
        return None
    return request.flexible, head[1], id_size, entry[0][1]


def fetch_layout(version: int) -> _Layout | None:
    """``_layout``, None for a version kio does not know (the codec then decides)."""
    try:
        return _layout(version)
    except Exception:
        return None


def array_count(frame: bytes | bytearray | memoryview, pos: int, flexible: bool) -> tuple[int, int]:
    """An array's entry count at *pos* (compact in flexible versions: n + 1) and where its
    entries start."""
    if flexible:
        n, pos = read_uvarint(frame, pos)
        return n - 1, pos
    return int.from_bytes(frame[pos : pos + 4], "big", signed=True), pos + 4


def past_topic(
    frame: bytes | bytearray | memoryview, pos: int, flexible: bool, id_size: int | None
) -> int:
    """Where a topic entry's name (or its id, of *id_size* bytes) at *pos* ends."""
    if id_size is not None:
        return pos + id_size
    if flexible:
        n, pos = read_uvarint(frame, pos)
        return pos + n - 1
    return pos + 2 + int.from_bytes(frame[pos : pos + 2], "big", signed=True)


def fetch_partitions(
    version: int, frame: bytes | memoryview, offset: int, *, above: int | None = None
) -> int | None:
    """The partitions a Fetch request body (at *offset* in *frame*) names in ``topics``.

    None when the bytes do not follow the layout (the decode then says why).

    With *above* (the most the caller admits), the walk stops once the count passes it,
    which each topic's partition count tells before its partitions are walked, or once
    more than *above* topic entries are walked (Kafka's clients name no topic without a
    partition): the value is then more than *above* (the entries seen so far), and the
    bytes after them are not read.  A refused Fetch costs a walk of at most *above*
    partitions, however large its frame.
    """
    layout = fetch_layout(version)
    if layout is None:
        return None
    flexible, head, id_size, fixed = layout
    end = len(frame)
    try:
        topics, pos = array_count(frame, offset + head, flexible)
        if topics < 0 or topics > end - pos:
            return None
        named = 0
        for walked in range(topics):
            if above is not None and walked > above:
                return walked
            count, pos = array_count(frame, past_topic(frame, pos, flexible, id_size), flexible)
            if count >= 0 and above is not None and named + count > above:
                return named + count  # past it: the partitions are not walked
            if count < 0 or count * fixed > end - pos:
                return None
            named += count
            if not flexible:
                pos += count * fixed
                continue
            for _ in range(count):
                pos += fixed
                if pos < end and frame[pos] == 0:  # no tagged fields: the usual case
                    pos += 1
                    continue
                tags, pos = read_uvarint(frame, pos)
                for _ in range(tags):
                    _, pos = read_uvarint(frame, pos)
                    size, pos = read_uvarint(frame, pos)
                    pos += size
            tags, pos = read_uvarint(frame, pos)  # the topic's own tag buffer
            for _ in range(tags):
                _, pos = read_uvarint(frame, pos)
                size, pos = read_uvarint(frame, pos)
                pos += size
            if pos > end:
                return None
    except (DecodeError, IndexError, ValueError):
        return None
    return named


class TopicRuns(NamedTuple):
    """A Fetch request body's ``topics`` as spans of its bytes (``topic_runs``)."""

    flexible: bool
    head: int
    """The bytes before ``topics`` (from the body's start)."""
    entry_size: int
    """A partition entry's bytes (in flexible versions with its empty tag buffer)."""
    runs: list[tuple[bytes, int, int]]
    """Per topic entry, in order: its name (or id) bytes, where its partition entries
    start and where they end."""
    end: int
    """Where ``topics`` ends (the forgotten topics, the rack and the tags follow)."""


def topic_runs(version: int, frame: bytes | bytearray, offset: int) -> TopicRuns | None:
    """The topics of the Fetch request body at *offset* in *frame*, one walk per topic
    entry (the partition entries are not walked: they are of a fixed size).  None when
    the layout has anything this walk does not follow: a tagged field in a topic or
    partition, a count that cannot fit, an unknown version."""
    layout = fetch_layout(version)
    if layout is None:
        return None
    flexible, head, id_size, fixed = layout
    size = fixed + 1 if flexible else fixed  # (a flexible entry's empty tag buffer)
    end = len(frame)
    runs: list[tuple[bytes, int, int]] = []
    try:
        topics, pos = array_count(frame, offset + head, flexible)
        if topics < 0 or topics > end - pos:
            return None
        for _ in range(topics):
            start, pos = pos, past_topic(frame, pos, flexible, id_size)
            name = bytes(frame[start:pos])
            count, pos = array_count(frame, pos, flexible)
            stop = pos + count * size
            if count < 0 or stop > end:
                return None
            if flexible:
                if frame[pos + fixed : stop : size].count(0) != count:
                    return None  # a partition's tagged fields
                if stop >= end or frame[stop] != 0:
                    return None  # the topic's tagged fields
            runs.append((name, pos, stop))
            pos = stop + 1 if flexible else stop
        if pos > end:
            return None
    except (DecodeError, IndexError, ValueError):
        return None
    return TopicRuns(flexible, head, size, runs, pos)


_FIRST = itemgetter(0)


@cache
def _cutter(size: int) -> Callable[[bytes | bytearray], Iterator[tuple[bytes]]]:
    return struct.Struct(f"{size}s").iter_unpack


def entries_in(frame: bytes | bytearray, start: int, stop: int, size: int) -> list[bytes]:
    """The *size*-byte entries from *start* to *stop* in *frame*, cut in C."""
    return list(map(_FIRST, _cutter(size)(frame[start:stop])))


OrderFree = tuple[bytes, list[bytes]]
"""A Fetch request body without the order of its partitions: the bytes around
``topics`` and, sorted, each partition's entry after its topic's name (or id)."""


def order_free(version: int, frame: bytes | bytearray, offset: int) -> OrderFree | None:
    """The request body at *offset* in *frame* in a form that two bodies naming the same
    partitions with the same fields share whatever their order (librdkafka moves its
    first partition to the end on every fetch, so that a capped response favours no
    partition).  None when the layout has anything this walk does not follow (a tagged
    field in a topic or partition, an unknown version): the caller treats it as new.
    """
    walk = topic_runs(version, frame, offset)
    if walk is None:
        return None
    size = walk.entry_size
    entries: list[bytes] = []
    for name, start, stop in walk.runs:
        entries += map(name.__add__, entries_in(frame, start, stop, size))
    entries.sort()
    return bytes(frame[offset : offset + walk.head]) + bytes(frame[walk.end :]), entries


def session_epoch_at(version: int) -> int | None:
    """Where a Fetch request body of *version* (v7+) has its ``session_epoch``, from the
    body's start (4 bytes before ``topics``); None for a version without one at a fixed
    place."""
    layout = fetch_layout(version)
    if layout is None or version < 7:
        return None
    return layout[1] - 4


def frame_epoch_at(frame: bytes) -> tuple[int, int]:
    """The version of *frame*, an encoded Fetch request (header and body, v7+), and where it
    has its ``session_epoch``: the last of the fixed fields before ``topics``, so 4 bytes
    before them (both read from the request header).  ``with_epoch_at`` there gives
    the same bytes as kio's encoding of the request with that epoch
    (``tests/unit/test_fetch_count``)."""
    header = parse_request_header(frame)
    version = header.api_version
    at = session_epoch_at(version)
    if at is None:
        raise ValueError(f"Fetch v{version} has no session epoch at a fixed place")
    if header.body_offset is None:
        raise ValueError("a Fetch request frame without a body")
    return version, header.body_offset + at


def with_epoch_at(frame: bytes, at: int, epoch: int) -> bytes:
    """*frame* with the 4 bytes at *at* (``frame_epoch_at``) set to *epoch*."""
    return frame[:at] + epoch.to_bytes(4, "big", signed=True) + frame[at + 4 :]
