"""The delivery check the real-client tests share: exactly once, in order per partition."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

Record = tuple[Any, ...]
"""A record whose first item is its partition; the rest is compared as is."""


def assert_exactly_once_in_order(sent: Sequence[Record], received: Sequence[Record]) -> None:
    want: dict[int, list[Record]] = defaultdict(list)
    have: dict[int, list[Record]] = defaultdict(list)
    for r in sent:
        want[r[0]].append(r)
    for r in received:
        have[r[0]].append(r)
    assert set(have) == set(want), f"partitions received {sorted(have)}, sent {sorted(want)}"
    for p in want:
        assert have[p] == want[p], f"partition {p}: {len(have[p])} received, {len(want[p])} sent"
