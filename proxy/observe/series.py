"""Counters and histograms that cost a few attribute updates per event.

``prometheus_client``'s ``Counter.inc`` and ``Histogram.observe`` check that the
series may be observed, take a lock, look for an exemplar and scan the buckets
one by one: 1-1.5 us an event here, and the proxy records about ten per request
(each leg's count and size, the round trips, the node's bytes) and more per
shaped fetch (starvation rounds and reuse hits per partition).  These families
keep plain numbers, with no lock: an increment is an addition, an observation a
``bisect`` and two additions.  That needs each series to be added to by one
thread: the event loop's, which also serves the scrapes (``observe/http.py``),
except the decision log's writer thread, which adds to the ``written`` and
``dropped`` series of ``decision_log_events_total`` and nothing else does (those
series are made at start, so no series is made off the loop either).

What a scrape sees is what the library's families give: the same family names,
types, help, label sets in creation order, the same samples (``_total`` and
``_created`` for a counter; cumulative ``_bucket`` with ``le``, ``_count``,
``_sum`` and ``_created`` for a histogram), so both text formats and
``registry.get_sample_value`` read them as before
(``tests/unit/test_observe_series.py`` renders both side by side).  As there,
``PROMETHEUS_DISABLE_CREATED_SERIES`` leaves out the ``_created`` samples.
Gauges stay the library's (``set_function`` reads live state at scrape time;
none is set per request).
"""

from __future__ import annotations

import math
import os
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

_go_float: Callable[[float], str] = floatToGoString
"""The library's bound formatting for ``le`` (``+Inf``, ``1e+06``)."""

_CREATED = os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "").lower() not in (
    "true",
    "1",
    "t",
)
"""Whether ``_created`` samples are written (the client library's own switch)."""


class CounterSeries:
    """One label set of a :class:`CounterFamily`."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class HistogramSeries:
    """One label set of a :class:`HistogramFamily`: a count per bucket (not cumulative)."""

    __slots__ = ("_bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        # the first bound >= amount (le semantics); the last bound is +Inf
        self.counts[bisect_left(self._bounds, amount)] += 1
        self.sum += amount

    def observe_many(self, amounts: Iterable[float]) -> None:
        """``observe`` each of *amounts* (one call for a fetch's per-partition values)."""
        counts, bounds = self.counts, self._bounds
        total = 0.0
        for amount in amounts:
            counts[bisect_left(bounds, amount)] += 1
            total += amount
        self.sum += total


S = TypeVar("S", CounterSeries, HistogramSeries)


class _Family(Collector, Generic[S]):
    """What counters and histograms share: name, help, label names, series by label values."""

    kind = ""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry | None,
        new: Callable[[], S],
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._new: Callable[[], S] = new
        self._series: dict[tuple[str, ...], S] = {}
        self._unlabelled: S | None = new() if not self.labelnames else None
        if registry is not None:
            registry.register(self)

    def labels(self, *values: object, **named: object) -> S:
        """The series of these label values (by position or by name), made at first use."""
        if not self.labelnames:
            raise ValueError(f"No label names were set when constructing {self.name}")
        if values and named:
            raise ValueError("Can't pass both *args and **kwargs")
        if named:
            if sorted(named) != sorted(self.labelnames):
                raise ValueError("Incorrect label names")
            values = tuple(named[n] for n in self.labelnames)
        elif len(values) != len(self.labelnames):
            raise ValueError("Incorrect label count")
        key = tuple(str(v) for v in values)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = self._new()
        return series

    def single(self) -> S:
        """The one series of a family without labels."""
        if self._unlabelled is None:
            raise ValueError(f"{self.name} has label names: use labels()")
        return self._unlabelled

    def _items(self) -> Iterable[tuple[dict[str, str], S]]:
        if self._unlabelled is not None:
            yield {}, self._unlabelled
        for values, series in list(self._series.items()):
            yield dict(zip(self.labelnames, values, strict=True)), series

    def describe(self) -> list[Metric]:
        return [Metric(self.name, self.documentation, self.kind)]


class CounterFamily(_Family[CounterSeries]):
    """A counter family (``prometheus_client.Counter``'s samples), ``name`` without ``_total``."""

    kind = "counter"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        super().__init__(
            name.removesuffix("_total"), documentation, labelnames, registry, CounterSeries
        )

    def inc(self, amount: float = 1) -> None:
        """Increment the unlabelled family."""
        self.single().inc(amount)

    def collect(self) -> list[Metric]:
        metric = Metric(self.name, self.documentation, self.kind)
        for labels, series in self._items():
            metric.add_sample(self.name + "_total", labels, series.value)
            if _CREATED:
                metric.add_sample(self.name + "_created", labels, series.created)
        return [metric]


class HistogramFamily(_Family[HistogramSeries]):
    """A histogram family (``prometheus_client.Histogram``'s samples)."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry | None = None,
    ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError("Buckets not in sorted order")
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        if len(bounds) < 2:
            raise ValueError("Must have at least two buckets")
        if "le" in labelnames:
            raise ValueError("Invalid label name: le")
        self._le = tuple(_go_float(b) for b in bounds)
        frozen = tuple(bounds)
        super().__init__(name, documentation, labelnames, registry, lambda: HistogramSeries(frozen))
        self._bounds = frozen

    def observe(self, amount: float) -> None:
        """Observe on the unlabelled family."""
        self.single().observe(amount)

    def collect(self) -> list[Metric]:
        metric = Metric(self.name, self.documentation, self.kind)
        name = self.name
        for labels, series in self._items():
            acc = 0.0
            for le, count in zip(self._le, series.counts, strict=True):
                acc += count
                metric.add_sample(name + "_bucket", {**labels, "le": le}, acc)
            metric.add_sample(name + "_count", labels, acc)
            if self._bounds[0] >= 0:
                metric.add_sample(name + "_sum", labels, series.sum)
            if _CREATED:
                metric.add_sample(name + "_created", labels, series.created)
        return [metric]
