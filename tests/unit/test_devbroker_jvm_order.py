"""JVM hash codes and collection iteration orders, pinned to values Java and Kafka 4.4 produce."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from devbroker.jvm_order import (
    champ_order,
    java_hash_set_order,
    java_string_hash,
    mutable_hash_map_order,
    topic_partition_hash,
)


def test_java_string_hash_known_values() -> None:
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(2**31)  # Integer.MIN_VALUE
    assert (
        java_string_hash("\U0001f600") == 31 * 0xD83D + 0xDE00
    )  # a surrogate pair: two UTF-16 units


def test_topic_partition_hash_is_javas() -> None:
    # 31 * (31 + partition) + topic.hashCode(), in 32-bit arithmetic
    assert topic_partition_hash("hello", 3) == 31 * 34 + 99162322
    assert topic_partition_hash("polygenelubricants", 0) == -(2**31) + 961


def test_list_offsets_order_kafka_answered() -> None:
    """Kafka 4.4 answered ListOffsets for partitions [1, 2, 0] of this topic in this order."""
    topic = "diff-offsets-e4436a31"
    assert mutable_hash_map_order([1, 2, 0], lambda p: topic_partition_hash(topic, p)) == [2, 0, 1]


def test_missing_metadata_topics_order_kafka_answered() -> None:
    """Kafka 4.4's Metadata answer for five unknown names (a HashSet copied from a Scala Set)."""
    asked = ["x9-0-4b9394", "x9-1-563c35", "x9-2-d2145c", "x9-3-96c765", "x9-4-a7d3d4"]
    answered = ["x9-2-d2145c", "x9-1-563c35", "x9-3-96c765", "x9-4-a7d3d4", "x9-0-4b9394"]
    assert java_hash_set_order(champ_order(asked, java_string_hash), java_string_hash) == answered


def test_mutable_hash_map_grows_its_table() -> None:
    """16 buckets up to 11 keys, 32 from the 12th: hashes 16 apart then split into two buckets."""
    assert mutable_hash_map_order(list(range(11)), lambda k: k * 16) == list(range(11))
    evens_then_odds = [*range(0, 12, 2), *range(1, 12, 2)]
    assert mutable_hash_map_order(list(range(12)), lambda k: k * 16) == evens_then_odds


@given(st.lists(st.text(max_size=8), unique=True, max_size=40))
def test_orders_are_permutations(keys: list[str]) -> None:
    for order in (
        mutable_hash_map_order(keys, java_string_hash),
        champ_order(keys, java_string_hash),
        java_hash_set_order(keys, java_string_hash),
    ):
        assert sorted(order) == sorted(keys)
