"""Fair partition order: upstream round-robin and serve-order rotation.

KIP-74 caps a response in bytes, which starves the partitions late in the
request's order unless the order rotates; it leaves the rotation to clients.
Two rotations live here:

- :class:`UpstreamRotation`, for full fetches the proxy sends upstream: the
  partitions are requested round-robin, starting after the last partition
  that returned data in the previous response (KIP-74's rule).  Incremental
  upstream sessions need none: the broker moves partitions that returned data
  to the end of its session's order itself (KIP-227).
- :class:`ServeRotation`, for responses the proxy trims: partitions with data
  are allotted budget least-recently-served first.  The first partition in
  that order always gets at least one batch (the progress guarantee), so a
  partition that keeps having data is served within N consecutive responses,
  N being the number of partitions that had data since it was last served:
  every response it misses serves, and moves behind it, one partition that was
  ahead of it.  :meth:`ServeRotation.starvation` reports, per partition, the
  responses in a row in which it had data and got none (for metrics).

Both are bounded: they track at most ``max_partitions`` partitions and forget
the least recently seen beyond that.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Generator, Iterable, Sequence
from typing import Generic, TypeVar

from ..protocol.codec import drain

K = TypeVar("K")

DEFAULT_MAX_PARTITIONS = 100_000


class UpstreamRotation(Generic[K]):
    """Round-robin request order for full fetches: start after the last partition with data."""

    def __init__(self, max_partitions: int = DEFAULT_MAX_PARTITIONS) -> None:
        if max_partitions < 1:
            raise ValueError("max_partitions must be >= 1")
        self._max = max_partitions
        self._ring: OrderedDict[K, int] = OrderedDict()
        """Every partition seen, in the ring's order, with a number that grows along it
        (given when it joins at the end): ordering by it is ordering by ring position."""
        self._joined = 0
        self._cursor: K | None = None

    def _register(self, keys: Iterable[K]) -> None:
        ring = self._ring
        for key in [k for k in keys if k not in ring]:
            if key not in ring:  # (listed twice)
                ring[key] = self._joined
                self._joined += 1
        while len(ring) > self._max:
            old, _ = ring.popitem(last=False)
            if old == self._cursor:
                self._cursor = None

    def order(self, keys: Sequence[K]) -> list[K]:
        """*keys* (the partitions of the next full fetch) in the order to request them:
        in the ring's order, those after the cursor first."""
        self._register(keys)
        ring = self._ring
        if self._cursor is None or self._cursor not in ring:
            return list(keys)
        place = ring.__getitem__  # (a sort and a bisection keyed in C, no per-key lambda)
        ordered = sorted(keys, key=place)
        after = bisect_right(ordered, ring[self._cursor], key=place)
        return ordered[after:] + ordered[:after]

    def observe(self, keys_with_data: Sequence[K]) -> None:
        """Record a response: *keys_with_data* in the order the response carried them."""
        if keys_with_data:
            self._register(keys_with_data)
            self._cursor = keys_with_data[-1]

    def clear(self) -> None:
        """Forget every partition (the connection is gone)."""
        self._ring.clear()
        self._cursor = None

    def forget(self, keys: Iterable[K]) -> None:
        for key in keys:
            self._ring.pop(key, None)
            if key == self._cursor:
                self._cursor = None


class ServeRotation(Generic[K]):
    """Least-recently-served serve order for trimmed responses, with a starvation measure."""

    def __init__(self, max_partitions: int = DEFAULT_MAX_PARTITIONS) -> None:
        if max_partitions < 1:
            raise ValueError("max_partitions must be >= 1")
        self._max = max_partitions
        self._round = 0
        # key -> round it was last served (-1: never); insertion order = first seen.
        self._last_served: OrderedDict[K, int] = OrderedDict()
        self._starved: dict[K, int] = {}

    def clear(self) -> None:
        """Forget every partition (the connection is gone)."""
        self._last_served.clear()
        self._starved.clear()

    @property
    def rounds(self) -> int:
        """Responses observed so far."""
        return self._round

    def order(self, keys_with_data: Sequence[K]) -> list[K]:
        """*keys_with_data* least recently served first; ties keep their given order."""
        last = self._last_served
        return sorted(keys_with_data, key=lambda k: last.get(k, -1))

    def observe(self, keys_with_data: Iterable[K], served: Iterable[K]) -> dict[K, int]:
        """Record one response: which partitions had data and which got some.

        Returns, for each served partition, the consecutive responses it had
        waited with data before this one (0: it was not starved).
        """
        return drain(self.observe_in_ranges(keys_with_data, served, 0))

    def observe_in_ranges(
        self, keys_with_data: Iterable[K], served: Iterable[K], every: int
    ) -> Generator[None, None, dict[K, int]]:
        """``observe``, yielding after every *every* partitions (0: never) of its walks.
        The round is counted at once; only its own connection's fetch observes this
        rotation, so nothing reads it half-updated."""
        self._round += 1
        served_set = set(served)
        waited: dict[K, int] = {}
        walked = 0
        for key in served_set:
            walked += 1
            if every and walked % every == 0:
                yield
            self._last_served[key] = self._round
            self._last_served.move_to_end(key)
            waited[key] = self._starved.pop(key, 0)
        for key in keys_with_data:
            walked += 1
            if every and walked % every == 0:
                yield
            if key in served_set:
                continue
            if key not in self._last_served:
                self._last_served[key] = -1
            self._starved[key] = self._starved.get(key, 0) + 1
        while len(self._last_served) > self._max:
            old, _ = self._last_served.popitem(last=False)
            self._starved.pop(old, None)
        return waited

    def starvation(self, key: K) -> int:
        """Consecutive responses in which *key* had data but got none (0: served last time)."""
        return self._starved.get(key, 0)

    @property
    def max_starvation(self) -> int:
        return max(self._starved.values(), default=0)

    def starved(self) -> dict[K, int]:
        """Every partition currently starved, with its count (a copy)."""
        return dict(self._starved)

    def forget(self, keys: Iterable[K]) -> None:
        for key in keys:
            self._last_served.pop(key, None)
            self._starved.pop(key, None)
