"""The cached text renderer writes what prometheus_client's generate_latest writes, byte for byte."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Info,
    PlatformCollector,
    Summary,
    generate_latest,
)
from prometheus_client.core import GaugeHistogramMetricFamily, GaugeMetricFamily

from proxy.observe import exposition
from proxy.observe.exposition import TextEncoder
from proxy.observe.http import ObserveApp, Readiness
from proxy.observe.labels import Direction
from proxy.observe.metrics import Metrics

label_values = st.text(alphabet=st.sampled_from('ab\\"\n é{}=,'), max_size=6)


class Timestamped:
    """A custom collector with a timestamped sample and an OpenMetrics gauge histogram."""

    def collect(self) -> list[object]:
        gauge = GaugeMetricFamily("custom_stamped", "with\\ a\nstamp", labels=["x"])
        gauge.add_metric(["1"], 2.5, timestamp=1700000000.25)
        histogram = GaugeHistogramMetricFamily(
            "custom_gauge_histogram", "a gauge histogram", labels=["y"]
        )
        histogram.add_metric(["q"], [("1.0", 3), ("+Inf", 4)], gsum_value=7.5)
        return [gauge, histogram]


@settings(max_examples=60)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([0, 1, 3, 18, 36, 999]),
            st.sampled_from(list(Direction)),
            st.integers(min_value=0, max_value=1 << 30),
            st.floats(min_value=0.0, max_value=100.0),
            label_values,
        ),
        max_size=30,
    )
)
def test_the_text_is_generate_latest_s_across_scrapes(
    events: list[tuple[int, Direction, int, float, str]],
) -> None:
    metrics = Metrics(process_metrics=False, client_id_label_cap=8)
    registry = metrics.registry
    PlatformCollector(registry=registry)
    registry.register(Timestamped())
    Info("custom_build", "an info", registry=registry).info({"v": '1"2'})
    Enum("custom_state", "an enum", states=["a", "b"], registry=registry).state("b")
    summary = Summary("custom_summary", "a summary", ["k"], registry=registry)
    weird = Counter("custom_weird", "labels to escape", ["label"], registry=registry)
    Gauge("custom_plain", "no labels", registry=registry).set(float("inf"))
    encoder = TextEncoder()
    assert encoder(registry) == generate_latest(registry)
    for api_key, direction, size, seconds, text in events:
        if direction in (Direction.CLIENT_TO_PROXY, Direction.PROXY_TO_BROKER):
            metrics.request(api_key, direction, size, node=1)
        else:
            metrics.response(api_key, direction, size, node=2)
        metrics.client_request_duration(api_key, seconds)
        metrics.delivered_fetch_data(1, size, client_id=text)
        weird.labels(label=text).inc(seconds)
        summary.labels(k=text).observe(seconds)
        # the same series again and new ones: kept prefixes and new ones side by side
        assert encoder(registry) == generate_latest(registry)


def test_the_app_serves_the_cached_text_and_the_library_for_openmetrics() -> None:
    metrics = Metrics(process_metrics=False)
    metrics.request(1, Direction.CLIENT_TO_PROXY, 100)
    app = ObserveApp(metrics.registry, lambda: Readiness(True))
    plain = app.handle("GET", "/metrics", "")
    assert plain.body == generate_latest(metrics.registry)
    assert plain.content_type.startswith("text/plain; version=0.0.4")
    openmetrics = app.handle("GET", "/metrics", "application/openmetrics-text; version=1.0.0")
    assert openmetrics.content_type.startswith("application/openmetrics-text")
    assert openmetrics.body.endswith(b"# EOF\n")


def test_the_cache_starts_over_beyond_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = CollectorRegistry()
    counter = Counter("many", "many series", ["n"], registry=registry)
    encoder = TextEncoder()
    sentinel = ("gone", ())
    for n in range(30):
        counter.labels(n=str(n)).inc()
    encoder(registry)
    encoder._prefixes[sentinel] = "gone "
    encoder(registry)
    assert sentinel in encoder._prefixes  # below the bound: kept
    monkeypatch.setattr(exposition, "MAX_CACHED_SERIES", 10)
    assert encoder(registry) == generate_latest(registry)
    assert sentinel not in encoder._prefixes  # past it: started over
    assert len(encoder._prefixes) == 2 * 30  # this scrape's series only (value, _created)
