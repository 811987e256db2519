"""The iteration orders of the JVM collections Kafka builds some responses from.

Where Kafka's broker collects per-partition results in a hash map and writes the
response by iterating it, the response order is the map's iteration order, a
function of the keys' hash codes.  The dev cluster reproduces it so that its
answers are byte-for-byte Kafka's:

- :func:`java_string_hash`, :func:`topic_partition_hash`, :func:`uuid_hash` and
  :func:`topic_id_partition_hash`: the ``hashCode`` of ``String``,
  ``TopicPartition``, ``Uuid`` and ``TopicIdPartition``;
- :func:`mutable_hash_map_order`: ``scala.collection.mutable.HashMap`` (2.13):
  buckets of ``h ^ (h >>> 16)`` in a power-of-two table that starts at 16 and
  doubles when an insert would reach 3/4 full; a bucket lists its entries by
  ascending (signed) improved hash;
- :func:`java_hash_set_order`: ``new java.util.HashSet<>(collection)``: the same
  buckets, insertion order inside a bucket;
- :func:`champ_order`: ``scala.collection.immutable.HashMap`` / ``HashSet`` (CHAMP
  tries): keys hashed by ``Hashing.improve``, 5 bits per level from the lowest;
  a node yields its own entries (by bit position) before its sub-nodes' entries.

Sans-I/O, pure functions.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import TypeVar

K = TypeVar("K")

_MASK32 = 0xFFFFFFFF


def _i32(value: int) -> int:
    value &= _MASK32
    return value - (1 << 32) if value & 0x80000000 else value


def java_string_hash(s: str) -> int:
    """``String.hashCode`` (over UTF-16 code units), as a signed 32-bit int."""
    h = 0
    raw = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(raw), 2):
        h = (31 * h + (raw[i] << 8 | raw[i + 1])) & _MASK32
    return _i32(h)


def topic_partition_hash(topic: str, partition: int) -> int:
    """``org.apache.kafka.common.TopicPartition.hashCode``."""
    return _i32(31 * (31 + partition) + java_string_hash(topic))


def _spread(h: int) -> int:
    """mutable.HashMap.improveHash: ``h ^ (h >>> 16)``."""
    return _i32(h ^ ((h & _MASK32) >> 16))


def _table_size(count: int) -> int:
    size = 16
    threshold = int(size * 0.75)
    for n in range(count):
        if n + 1 >= threshold:
            size *= 2
            threshold = int(size * 0.75)
    return size


def mutable_hash_map_order(keys: Iterable[K], hash_code: Callable[[K], int]) -> list[K]:
    """The iteration order of a scala.collection.mutable.HashMap holding *keys* (distinct)."""
    keyed = [(_spread(hash_code(k)), k) for k in keys]
    mask = _table_size(len(keyed)) - 1
    return [k for _h, k in sorted(keyed, key=lambda e: (e[0] & mask, e[0]))]


def java_hash_set_order(keys: Iterable[K], hash_code: Callable[[K], int]) -> list[K]:
    """The iteration order of ``new java.util.HashSet<>(c)`` for a collection *keys* (distinct).

    Capacity: the power of two >= max(size / 0.75 + 1, 16); a bucket keeps its
    keys in insertion order (no bucket here grows long enough to become a tree).
    """
    ordered = list(keys)
    want = max(int(len(ordered) / 0.75) + 1, 16)
    size = 16
    while size < want:
        size *= 2
    mask = size - 1
    return [
        k
        for _b, _i, k in sorted((_spread(hash_code(k)) & mask, i, k) for i, k in enumerate(ordered))
    ]


def _improve(hcode: int) -> int:
    """scala.collection.Hashing.improve."""
    h = _i32(hcode + ~_i32(hcode << 9))
    h = _i32(h ^ ((h & _MASK32) >> 14))
    h = _i32(h + _i32(h << 4))
    return _i32(h ^ ((h & _MASK32) >> 10))


def champ_order(keys: Iterable[K], hash_code: Callable[[K], int]) -> list[K]:
    """The iteration order of a scala.collection.immutable.HashMap/HashSet of *keys* (distinct)."""
    entries = [(_improve(hash_code(k)) & _MASK32, k) for k in keys]
    return _champ_node(entries, 0)


def _champ_node(entries: list[tuple[int, K]], shift: int) -> list[K]:
    if shift >= 32:  # a full hash collision: a collision node, insertion order
        return [k for _h, k in entries]
    slots: dict[int, list[tuple[int, K]]] = {}
    for h, k in entries:
        slots.setdefault((h >> shift) & 31, []).append((h, k))
    own = [group[0][1] for _bit, group in sorted(slots.items()) if len(group) == 1]
    below = [
        k
        for _bit, group in sorted(slots.items())
        if len(group) > 1
        for k in _champ_node(group, shift + 5)
    ]
    return own + below


def uuid_hash(value: uuid.UUID | None) -> int:
    """``org.apache.kafka.common.Uuid.hashCode`` (None: Uuid.ZERO_UUID)."""
    bits = 0 if value is None else value.int
    h = (bits >> 64) ^ (bits & 0xFFFFFFFFFFFFFFFF)
    return _i32((h >> 32) ^ h)


def topic_id_partition_hash(topic_id: uuid.UUID | None, topic: str | None, partition: int) -> int:
    """``org.apache.kafka.common.TopicIdPartition.hashCode`` (a null or empty name hashes as 0)."""
    tp = _i32(31 * (31 + partition) + (java_string_hash(topic) if topic else 0))
    return _i32(31 * (31 + uuid_hash(topic_id)) + tp)
