"""A Fetch request decoded with the parts of the previous one that it repeats.

A sessionless consumer (librdkafka, sarama, aiokafka) names every partition it reads
in every Fetch, and from one Fetch to the next only the offsets of the partitions it
was given change (librdkafka also moves its first partition to the end).  The decode
costs about a microsecond a partition in kio's reader; this one walks the request's
structure (:func:`.fetch_count.topic_runs`) and takes each partition's entry from the
previous request when its bytes are the same, decoding only the entries that changed.

- A partition's entry is its fixed fields, so equal bytes mean an equal
  ``FetchPartition``; kio's entities are immutable, so the previous request's may be
  shared.  A topic's name (or id) is decoded once too, by kio's reader of a topic
  with no partitions.
- The fields around ``topics`` (the head before it, the forgotten topics, the rack and
  the tagged fields after it) are decoded by kio's reader of the request with an
  empty ``topics``, once while they stay the same.
- What the walk does not follow (a tagged field in a topic or partition entry, an
  unknown version, a count that cannot fit) gives None, and the caller decodes the
  request as usual, so the codec's reader refuses what it refuses, with its error.

The result equals kio's decode of the same bytes (``tests/unit/test_fetch_reuse``).
What is kept (:class:`Parts`) is the previous request's topics and entries only, so
it is bounded by that request.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from . import readers
from .errors import DecodeError
from .fetch_count import entries_in, topic_runs
from .messages import replaced, request_module

_NO_TOPICS = {True: b"\x01", False: b"\x00\x00\x00\x00"}
"""An empty ``topics`` array, compact (flexible versions) or not."""
_NO_PARTITIONS_NO_TAGS = {True: b"\x01\x00", False: b"\x00\x00\x00\x00"}
"""A topic entry's tail with no partitions (and, flexible, no tagged fields)."""


@dataclass(frozen=True, slots=True)
class Parts:
    """What a decoded Fetch request's bytes were made of, for the next one to reuse."""

    version: int
    around: bytes
    """The body without its ``topics`` entries (the head, then what follows them)."""
    request: Any
    """The request decoded from *around* alone (no topics)."""
    topics: dict[bytes, Any]
    """A topic's name (or id) bytes to its entry with no partitions."""
    entries: dict[bytes, Any]
    """A partition's entry bytes to its ``FetchPartition``."""
    fresh: int
    """Partition entries this request did not repeat (decoded here)."""
    named: int
    """Partition entries in this request."""


def decode_reusing(
    version: int, frame: bytes | bytearray, offset: int, last: Parts | None, every: int
) -> Generator[None, None, tuple[Any, Parts] | None]:
    """The Fetch request body at *offset* in *frame* (of *version*) and its parts, taking
    from *last* (the previous request's parts) what repeats; yields after every *every*
    partitions (0: never).  None when the walk cannot follow the bytes (decode them as
    usual)."""
    if not isinstance(frame, bytes):
        frame = bytes(frame)  # slices that are keys
    walk = topic_runs(version, frame, offset)
    if walk is None:
        return None
    if last is not None and last.version != version:
        last = None
    old_topics: dict[bytes, Any] = {} if last is None else last.topics
    old_entries: dict[bytes, Any] = {} if last is None else last.entries
    reuse = old_entries.get
    mod = request_module(1, version)
    read_partition, topic_cls = readers.reader_for(mod.FetchPartition), mod.FetchTopic
    flexible, size = walk.flexible, walk.entry_size
    topics: dict[bytes, Any] = {}
    entries: dict[bytes, Any] = {}
    built: list[Any] = []
    walked = named = fresh = 0
    try:
        for name, start, stop in walk.runs:
            topic = topics.get(name) or old_topics.get(name)
            if topic is None:
                topic, _ = readers.read(topic_cls, name + _NO_PARTITIONS_NO_TAGS[flexible], 0)
            topics[name] = topic
            partitions: list[Any] = []
            step = every * size if every else max(stop - start, 1)
            for at in range(start, stop, step):  # at most *every* entries at a time
                keys = entries_in(frame, at, min(at + step, stop), size)
                got = list(map(reuse, keys))
                if not all(got):  # (kio entities have no __bool__: only None is false)
                    for i, key in enumerate(keys):
                        if got[i] is None:
                            fresh += 1
                            got[i] = entries.get(key) or read_partition(key, 0)[0]
                entries.update(zip(keys, got, strict=True))
                partitions += got
                walked += len(keys)
                if every and walked >= every:
                    walked -= every
                    yield
            named += len(partitions)
            built.append(replaced(topic, partitions=tuple(partitions)))
        around = frame[offset : offset + walk.head] + frame[walk.end :]
        if last is not None and last.around == around:
            request = last.request
        else:
            skeleton = around[: walk.head] + _NO_TOPICS[flexible] + around[walk.head :]
            request, _ = readers.read(mod.FetchRequest, skeleton, 0)
            if request.topics:
                return None
    except (DecodeError, *readers.READ_FAILURES):
        return None
    decoded = replaced(request, topics=tuple(built))
    return decoded, Parts(version, around, request, topics, entries, fresh, named)
