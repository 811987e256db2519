"""The proxy's own counter and histogram families expose what the client library's do.

Each test runs the same events through a ``prometheus_client`` family and through
its ``proxy.observe.series`` counterpart, on two registries, and compares what a
scrape reads: the text format (0.0.4), the OpenMetrics format and
``get_sample_value``.  The ``_created`` samples are creation times, so they are
compared for presence and label sets, not value.
"""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from proxy.observe.exposition import TextEncoder
from proxy.observe.metrics import LATENCY_BUCKETS, SIZE_BUCKETS, STARVATION_BUCKETS
from proxy.observe.series import CounterFamily, HistogramFamily

_CREATED_VALUE = re.compile(r"^(\S*_created(?:\{[^}]*\})?) \S+$")


def _without_created_values(text: str) -> list[str]:
    return [_CREATED_VALUE.sub(r"\1 T", line) for line in text.splitlines()]


def _same_scrape(library: CollectorRegistry, ours: CollectorRegistry) -> None:
    assert _without_created_values(generate_latest(ours).decode()) == _without_created_values(
        generate_latest(library).decode()
    )
    assert _without_created_values(generate_openmetrics(ours).decode()) == (
        _without_created_values(generate_openmetrics(library).decode())
    )
    # the proxy's cached encoder is byte for byte the library's (test_observe_exposition)
    assert TextEncoder()(ours) == generate_latest(ours)


LABELS = st.sampled_from(["fetch", "produce", "metadata", 'we"ird\\label\n'])


@settings(deadline=None)  # no timed asserts: a loaded machine is no reason to fail
@given(st.lists(st.tuples(LABELS, st.integers(0, 1 << 40) | st.floats(0, 1e12)), max_size=30))
def test_a_labelled_counter_scrapes_as_the_library_s(events: list[tuple[str, float]]) -> None:
    library, ours = CollectorRegistry(), CollectorRegistry()
    a = Counter("x_bytes_total", "Bytes\\ moved.\nTwo lines.", ["api"], registry=library)
    b = CounterFamily("x_bytes_total", "Bytes\\ moved.\nTwo lines.", ["api"], registry=ours)
    for label, amount in events:
        a.labels(api=label).inc(amount)
        b.labels(api=label).inc(amount)
        a.labels(label).inc()
        b.labels(label).inc()
    _same_scrape(library, ours)
    for label, _ in events:
        assert ours.get_sample_value("x_bytes_total", {"api": label}) == (
            library.get_sample_value("x_bytes_total", {"api": label})
        )


def test_an_unlabelled_counter_scrapes_as_the_library_s() -> None:
    library, ours = CollectorRegistry(), CollectorRegistry()
    a = Counter("y_total", "Ys.", registry=library)
    b = CounterFamily("y_total", "Ys.", registry=ours)
    _same_scrape(library, ours)  # a zero series from the start
    for amount in (1, 2.5, 0, 7):
        a.inc(amount)
        b.inc(amount)
    b.single().inc(3)
    a.inc(3)
    _same_scrape(library, ours)
    assert ours.get_sample_value("y_total") == 13.5


@pytest.mark.parametrize(
    "buckets", [SIZE_BUCKETS, LATENCY_BUCKETS, STARVATION_BUCKETS, (1.0, 2.0, math.inf)]
)
@settings(deadline=None)
@given(
    st.lists(
        st.tuples(
            LABELS,
            st.floats(0, 1e9)
            | st.sampled_from([0.0, 1.0, 2.0, 100.0, 1024.0, 0.005, 1e-9])
            | st.integers(0, 1 << 30),
        ),
        max_size=40,
    )
)
def test_a_labelled_histogram_scrapes_as_the_library_s(
    buckets: tuple[float, ...], events: list[tuple[str, float]]
) -> None:
    """Bucket edges included: a value equal to a bound counts in that bound's bucket (le)."""
    library, ours = CollectorRegistry(), CollectorRegistry()
    a = Histogram("z_size", "Sizes.", ["api"], buckets=buckets, registry=library)
    b = HistogramFamily("z_size", "Sizes.", ["api"], buckets=buckets, registry=ours)
    for label, value in events:
        a.labels(api=label).observe(value)
        b.labels(api=label).observe(value)
    _same_scrape(library, ours)
    for bound in buckets:
        a.labels(api="edges").observe(bound)
    b.labels(api="edges").observe_many(buckets)
    _same_scrape(library, ours)


@settings(deadline=None)
@given(st.lists(st.integers(0, 10_000), max_size=60))
def test_observe_many_is_observe_for_each(values: list[int]) -> None:
    library, ours = CollectorRegistry(), CollectorRegistry()
    a = Histogram("s_rounds", "Rounds.", buckets=STARVATION_BUCKETS, registry=library)
    b = HistogramFamily("s_rounds", "Rounds.", buckets=STARVATION_BUCKETS, registry=ours)
    for v in values:
        a.observe(v)
    b.single().observe_many(values)
    _same_scrape(library, ours)
    assert ours.get_sample_value("s_rounds_count") == len(values)


def test_misuse_is_refused_as_the_library_refuses_it() -> None:
    registry = CollectorRegistry()
    c = CounterFamily("c_total", "C.", ["api"], registry=registry)
    h = HistogramFamily("h", "H.", buckets=(1.0, 2.0), registry=registry)
    with pytest.raises(ValueError, match="non-negative"):
        c.labels(api="fetch").inc(-1)
    with pytest.raises(ValueError, match="label names"):
        c.labels(other="fetch")
    with pytest.raises(ValueError, match="label count"):
        c.labels("fetch", "extra")
    with pytest.raises(ValueError):
        c.inc()  # a labelled family has no series of its own
    with pytest.raises(ValueError):
        h.labels(api="fetch")  # a family without labels has no labelled series
    with pytest.raises(ValueError, match="sorted"):
        HistogramFamily("u", "U.", buckets=(2.0, 1.0))
    with pytest.raises(ValueError, match="le"):
        HistogramFamily("v", "V.", ["le"], buckets=(1.0,))
    with pytest.raises(ValueError, match="Duplicated"):
        CounterFamily("c", "Again.", registry=registry)  # c_total is taken
