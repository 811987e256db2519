from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.fetch_model import batch, make_partition, make_response, topic_name_or_id

from proxy.shaping.limits import ResponseLimits
from proxy.shaping.rotation import ServeRotation, UpstreamRotation
from proxy.shaping.trim import trim_response


def test_upstream_round_robin_starts_after_last_partition_with_data() -> None:
    rot: UpstreamRotation[str] = UpstreamRotation()
    keys = ["a", "b", "c", "d"]
    assert rot.order(keys) == keys
    rot.observe(["a", "b"])
    assert rot.order(keys) == ["c", "d", "a", "b"]
    rot.observe(["d"])
    assert rot.order(keys) == keys
    rot.observe([])  # nothing returned: keep the cursor
    assert rot.order(keys) == keys
    rot.observe(["b"])
    assert rot.order(["d", "a", "c"]) == ["c", "d", "a"]
    rot.forget(["b"])
    assert rot.order(["d", "a", "c"]) == ["d", "a", "c"]


def _kip74_order(ring: list[int], cursor: int | None, keys: list[int]) -> list[int]:
    """The rule, written out: by ring position, starting after the cursor's."""
    if cursor is None or cursor not in ring:
        return list(keys)
    start = ring.index(cursor) + 1
    return sorted(keys, key=lambda k: (ring.index(k) - start) % len(ring))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["order", "observe", "forget"]),
            st.lists(st.integers(0, 12), max_size=10),
        ),
        max_size=25,
    )
)
def test_upstream_order_is_the_ring_order_after_the_cursor(
    steps: list[tuple[str, list[int]]],
) -> None:
    rot: UpstreamRotation[int] = UpstreamRotation(max_partitions=8)
    ring: list[int] = []
    cursor: int | None = None

    def register(keys: list[int]) -> None:
        nonlocal cursor
        for k in keys:
            if k not in ring:
                ring.append(k)
        while len(ring) > 8:
            if ring.pop(0) == cursor:
                cursor = None

    for kind, keys in steps:
        if kind == "order":
            register(keys)
            if cursor not in ring or all(k in ring for k in keys):
                assert rot.order(keys) == _kip74_order(ring, cursor, keys)
            else:  # more partitions than it keeps (max_fetch_partitions never lets a
                with pytest.raises(KeyError):  # fetch reach its default bound)
                    rot.order(keys)
        elif kind == "observe":
            rot.observe(keys)
            if keys:
                register(keys)
                cursor = keys[-1]
        else:
            rot.forget(keys)
            ring[:] = [k for k in ring if k not in keys]
            if cursor in keys:
                cursor = None
        assert list(rot._ring) == ring


def test_upstream_rotation_is_bounded() -> None:
    rot: UpstreamRotation[int] = UpstreamRotation(max_partitions=3)
    rot.order([1, 2, 3, 4, 5])
    rot.observe([5])
    assert len(rot._ring) == 3
    assert rot.order([3, 4, 5]) == [3, 4, 5]


def test_serve_rotation_least_recently_served_first() -> None:
    rot: ServeRotation[str] = ServeRotation()
    assert rot.order(["a", "b", "c"]) == ["a", "b", "c"]
    rot.observe(["a", "b", "c"], served=["a"])
    assert rot.starvation("b") == 1 and rot.starvation("a") == 0
    assert rot.order(["a", "b", "c"]) == ["b", "c", "a"]
    rot.observe(["a", "b", "c"], served=["b"])
    assert rot.order(["a", "b", "c"]) == ["c", "a", "b"]
    assert rot.max_starvation == 2 and rot.starved() == {"c": 2, "a": 1}
    assert rot.observe(["c"], served=["c"]) == {"c": 2}
    assert rot.starvation("c") == 0 and rot.rounds == 3
    rot.forget(["a"])
    assert rot.starved() == {}


def test_serve_rotation_is_bounded() -> None:
    rot: ServeRotation[int] = ServeRotation(max_partitions=2)
    rot.observe([1, 2, 3], served=[1])
    assert len(rot._last_served) <= 2


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 8),
    rounds=st.lists(
        st.tuples(st.sets(st.integers(0, 7)), st.integers(1, 3000), st.integers(0, 400)),
        max_size=40,
    ),
)
def test_no_partition_with_data_starves_more_than_n_minus_one_responses(
    n: int, rounds: list[tuple[set[int], int, int]]
) -> None:
    """Trimmed responses with the serve rotation: starvation stays below the partition count."""
    rot: ServeRotation[object] = ServeRotation()
    v = 12
    for has_data, limit, payload in rounds:
        parts = [
            make_partition(
                v, i, batch(0, 2, payload=payload) + batch(2, 1) if i in has_data else b""
            )
            for i in range(n)
        ]
        res = trim_response(
            make_response(v, parts), ResponseLimits(response_bytes=limit), order=rot.order
        )
        served = [key for key, o in res.outcomes.items() if o.delivered_batches]
        rot.observe(res.serve_order, served)
        with_data = [(topic_name_or_id(v), i) for i in range(n) if i in has_data]
        if with_data:
            assert served, "progress"
        assert rot.max_starvation <= n - 1
