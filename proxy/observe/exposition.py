"""The Prometheus text format (0.0.4) of a registry, cheaper per scrape than the client library's.

``prometheus_client.generate_latest`` formats every sample from scratch: it sorts
and escapes the label set and joins the line around the value, ~2,000 samples
for the proxy's histograms by API, a few milliseconds of CPU per scrape.  The
label sets are bounded (see :mod:`.labels`), so :class:`TextEncoder` keeps the
text before the value of each (name, labels) it has rendered, and a scrape
formats only the values.  The output is byte for byte what ``generate_latest``
writes with its default escaping (the test renders both); other formats
(OpenMetrics, an ``escaping`` asked for in the Accept header) go to the library.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.openmetrics.exposition import (
    UNDERSCORES,
    escape_label_name,
    escape_metric_name,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

_value: Callable[[float], str] = floatToGoString
"""The library's own value formatting (Go's float syntax: +Inf, NaN, 1e+06)."""

MAX_CACHED_SERIES = 50_000
"""Beyond this many cached prefixes the cache starts over (the label sets are bounded, so
only a registry far larger than the proxy's gets there)."""

_OM_SUFFIXES = ("_created", "_gsum", "_gcount")
_TYPES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _prefix(name: str, labels: dict[str, str]) -> str:
    """A sample line up to its value: ``name{k="v",...} `` (labels sorted, as the library)."""
    labelstr = ",".join(
        f'{escape_label_name(k, UNDERSCORES)}="{_escape_value(v)}"'
        for k, v in sorted(labels.items())
    )
    name = escape_metric_name(name, UNDERSCORES)
    return f"{name}{{{labelstr}}} " if labelstr else f"{name} "


class TextEncoder:
    """``generate_latest(registry)`` with each sample's text before its value kept."""

    __slots__ = ("_prefixes",)

    def __init__(self) -> None:
        self._prefixes: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}

    def __call__(self, registry: Collector) -> bytes:
        prefixes = self._prefixes
        if len(prefixes) > MAX_CACHED_SERIES:
            prefixes.clear()
        output: list[str] = []
        for metric in registry.collect():
            name, kind = metric.name, metric.type
            if kind == "counter":
                exposed = name + "_total"
            elif kind == "info":
                exposed = name + "_info"
            else:
                exposed = name
            kind = _TYPES.get(kind, kind)
            escaped = escape_metric_name(exposed, UNDERSCORES)
            documentation = _escape_help(metric.documentation)
            output.append(f"# HELP {escaped} {documentation}\n# TYPE {escaped} {kind}\n")
            om_samples: dict[str, list[str]] = {}
            om_names = {name + suffix: suffix for suffix in _OM_SUFFIXES}
            for sample in metric.samples:
                key = (sample.name, tuple(sample.labels.items()))
                prefix = prefixes.get(key)
                if prefix is None:
                    prefix = prefixes[key] = _prefix(sample.name, sample.labels)
                if sample.timestamp is None:
                    line = f"{prefix}{_value(sample.value)}\n"
                else:
                    millis = int(float(sample.timestamp) * 1000)
                    line = f"{prefix}{_value(sample.value)} {millis:d}\n"
                suffix = om_names.get(sample.name)
                if suffix is None:
                    output.append(line)
                else:  # OpenMetrics-only samples: a gauge of their own after the family
                    om_samples.setdefault(suffix, []).append(line)
            for suffix, lines in sorted(om_samples.items()):
                om_name = escape_metric_name(name + suffix, UNDERSCORES)
                output.append(f"# HELP {om_name} {documentation}\n# TYPE {om_name} gauge\n")
                output.extend(lines)
        return "".join(output).encode("utf-8")
