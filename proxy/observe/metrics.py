"""Every Prometheus metric the proxy exports, in one place.

Conventions (house style, after Kroxylicious):

- one prefix, ``kafka_fetch_proxy_``;
- names say the leg of traffic they measure: ``client_to_proxy`` (requests from
  the application's client), ``proxy_to_broker`` (requests the proxy sends
  upstream), ``broker_to_proxy`` (upstream responses), ``proxy_to_client``
  (responses the client receives);
- ``_total`` for counters, ``_bytes`` and ``_seconds`` for units;
- labels only from small sets, bounded by construction (see :mod:`.labels`):
  ``api`` (a fixed table of Kafka API names, ``unknown`` for the rest), ``node``
  (the first ``node_label_cap`` node ids seen, then ``other``), ``limit``,
  ``cause``, ``reason``, ``side``, ``policy`` (the first ``policy_label_cap``
  names, then ``other``), ``locality`` (``same_rack``, ``other_rack``,
  ``unknown``: where a broker is seen from the proxy's ``rack``).
  Topic-partitions and client addresses are never labels; a ``client_id`` label exists only when enabled with a cap.

Per-message series (the four legs by API, the two durations, the bytes per
node) are resolved once: :class:`ByApi` keeps the labelled children of each API
in the fixed table (``unknown`` is resolved each time, so the cache holds at
most one entry per known API), and a connection's node series are looked up
by its meter once, at first use (:meth:`Metrics.node_bytes`).  ``labels()`` is not called
per message; the exposition is the same.

A :class:`Metrics` object is created per proxy instance on a
``CollectorRegistry`` the caller owns (tests pass a fresh one and read values
with ``registry.get_sample_value``).  The edge calls its small typed methods (the
fetch path's effects through :mod:`.apply`, the traffic meter, the server); the
sans-I/O layers never call it.

:data:`CATALOGUE` lists every metric with its type, labels and help text; the
README's table and the Grafana dashboard test are checked against it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    PlatformCollector,
    ProcessCollector,
)

from .. import __version__
from ..protocol.apis import API_NAMES
from ..relay.racks import FallbackReason, Locality, cost
from ..sessions.resets import ResetReason, Side
from ..shaping.limits import LimitKind
from .labels import (
    OTHER,
    UNKNOWN,
    BoundedLabel,
    CloseCause,
    DecisionOutcome,
    Direction,
    api_name,
    enum_label,
)
from .series import CounterFamily, HistogramFamily

PREFIX = "kafka_fetch_proxy_"

REFUSE_REASONS = ("max_connections",)
"""Why a client connection is refused at accept (the ``reason`` label; else ``other``)."""

SIZE_BUCKETS = (
    64.0,
    256.0,
    1024.0,
    4096.0,
    16384.0,
    65536.0,
    262144.0,
    1048576.0,
    4194304.0,
    16777216.0,
    67108864.0,
)
# Fetch requests long-poll up to the client's max_wait_ms (500 ms by default in
# the Java client), so the top buckets matter as much as the bottom ones.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
STARVATION_BUCKETS = (0.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 55.0, 89.0, 144.0)


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str  # full exposition name; counters include "_total"
    kind: str  # "counter", "gauge" or "histogram"
    labels: tuple[str, ...]
    help: str

    def series_names(self) -> tuple[str, ...]:
        """Names of the sample series Prometheus stores for this metric."""
        if self.kind == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)


def _spec(name: str, kind: str, labels: Iterable[str], help: str) -> MetricSpec:
    return MetricSpec(PREFIX + name, kind, tuple(labels), help)


_D = Direction
CATALOGUE: tuple[MetricSpec, ...] = (
    _spec("build_info", "gauge", ["version"], "Always 1; the proxy's version as a label."),
    # connections
    _spec("client_connections_open", "gauge", [], "Client connections currently open."),
    _spec("client_connections_accepted_total", "counter", [], "Client connections accepted."),
    _spec(
        "client_connections_refused_total",
        "counter",
        ["reason"],
        "Client connections closed at accept because a limit was reached (reason=max_connections).",
    ),
    _spec(
        "client_connections_closed_total",
        "counter",
        ["cause"],
        "Client connections closed, by cause.",
    ),
    _spec("broker_connections_open", "gauge", ["node"], "Connections to brokers currently open."),
    _spec("broker_connections_opened_total", "counter", ["node"], "Connections to brokers opened."),
    _spec(
        "broker_connections_closed_total",
        "counter",
        ["node", "cause"],
        "Connections to brokers closed, by cause.",
    ),
    _spec(
        "broker_connect_failures_total",
        "counter",
        ["node"],
        "Failed attempts to connect to a broker.",
    ),
    _spec(
        "upstream_brokers_reachable", "gauge", [], "Upstream brokers the proxy can currently reach."
    ),
    # requests and responses, per leg
    *(
        spec
        for d, what, leg in (
            (_D.CLIENT_TO_PROXY, "request", "from clients to the proxy"),
            (_D.PROXY_TO_BROKER, "request", "from the proxy to brokers"),
            (_D.BROKER_TO_PROXY, "response", "from brokers to the proxy"),
            (_D.PROXY_TO_CLIENT, "response", "from the proxy to clients"),
        )
        for spec in (
            _spec(f"{d}_{what}s_total", "counter", ["api"], f"{what.title()}s {leg}, by API."),
            _spec(
                f"{d}_{what}_size_bytes",
                "histogram",
                ["api"],
                f"Size of {what}s {leg} (whole frame), by API.",
            ),
        )
    ),
    _spec("proxy_to_broker_bytes_total", "counter", ["node"], "Bytes sent to each broker."),
    _spec("broker_to_proxy_bytes_total", "counter", ["node"], "Bytes received from each broker."),
    _spec(
        "client_request_duration_seconds",
        "histogram",
        ["api"],
        "Time from a client request's arrival to its response being sent, by API.",
    ),
    _spec(
        "broker_request_duration_seconds",
        "histogram",
        ["api"],
        "Round trip of requests the proxy sent to brokers, by API.",
    ),
    # fetch data, upstream vs delivered
    _spec(
        "broker_to_proxy_fetch_records_total",
        "counter",
        ["node"],
        "Records in Fetch responses received from brokers (from batch headers).",
    ),
    _spec(
        "broker_to_proxy_fetch_record_bytes_total",
        "counter",
        ["node"],
        "Record-batch bytes in Fetch responses received from brokers.",
    ),
    _spec(
        "proxy_to_client_fetch_records_total",
        "counter",
        [],
        "Records delivered to clients in Fetch responses.",
    ),
    _spec(
        "proxy_to_client_fetch_record_bytes_total",
        "counter",
        [],
        "Record-batch bytes delivered to clients in Fetch responses.",
    ),
    _spec(
        "incremental_fetch_saved_bytes_total",
        "counter",
        ["kind"],
        "Bytes not sent between proxy and brokers thanks to incremental fetch sessions "
        "(kind=request|response), against the full fetches clients asked for.",
    ),
    _spec(
        "run_ahead_rounds_total",
        "counter",
        [],
        "Upstream rounds run ahead of a client (run_ahead): after an answer that delivered "
        "data, what the client will ask next, fetched into its reuse buffer.",
    ),
    _spec(
        "run_ahead_held_bytes_total",
        "counter",
        [],
        "Record bytes run-ahead rounds kept for the clients' next fetches.",
    ),
    _spec(
        "repeated_fetches_total",
        "counter",
        [],
        "Fetches answered with the client's last answer again: the same fetch (a sessionless "
        "client's, or a session client's incremental fetch naming nothing, at its next "
        "epoch), and the upstream session said nothing changed (no partition walked).",
    ),
    # rack-aware fetching (KIP-392): where record bytes came from, seen from the proxy's rack
    _spec(
        "broker_to_proxy_fetch_rack_record_bytes_total",
        "counter",
        ["node", "locality"],
        "Record-batch bytes in Fetch responses received from brokers, by node and whether "
        "the node is in the proxy's rack (locality=same_rack|other_rack|unknown).",
    ),
    _spec(
        "preferred_replica_redirects_total",
        "counter",
        ["node"],
        "Partitions a leader answered with a preferred_read_replica (KIP-392 redirect), "
        "by the replica it named.",
    ),
    _spec(
        "proxy_to_broker_preferred_replica_fetches_total",
        "counter",
        ["node"],
        "Fetches in which a broker served record bytes of partitions it does not lead (a "
        "preferred read replica; leaders as last learnt from Metadata), by node.",
    ),
    _spec(
        "preferred_replica_fallbacks_total",
        "counter",
        ["reason"],
        "Fetches that went to the leader instead of a preferred read replica, by reason: "
        "per partition fetch, or once per connection for client_ignores_redirect and "
        "old_fetch_version.",
    ),
    _spec(
        "cross_zone_avoided_record_bytes_total",
        "counter",
        [],
        "Record-batch bytes served by a replica in the proxy's rack that is not the "
        "partition's leader, the leader being in another rack: cross-zone bytes avoided.",
    ),
    _spec(
        "cross_zone_cost_avoided",
        "gauge",
        [],
        "Estimated cost avoided since start: cross-zone bytes avoided / 1e9 x "
        "cross_zone_price_per_gb at the time they were read.",
    ),
    _spec(
        "cross_zone_price_per_gb",
        "gauge",
        [],
        "The configured price of one GB (1e9 bytes) crossing zones (cross_zone_price_per_gb).",
    ),
    # fetch sessions (Kafka: NumIncrementalFetchSessions, NumIncrementalFetchPartitionsCached,
    # IncrementalFetchSessionEvictionsPerSec)
    _spec("fetch_sessions_active", "gauge", ["side"], "Incremental fetch sessions in the cache."),
    _spec(
        "fetch_session_partitions_cached",
        "gauge",
        ["side"],
        "Partitions across all cached incremental fetch sessions.",
    ),
    _spec(
        "fetch_session_evictions_total",
        "counter",
        ["side"],
        "Incremental fetch sessions evicted from the cache to make room.",
    ),
    _spec(
        "fetch_session_resets_total",
        "counter",
        ["side", "reason"],
        "Incremental fetch sessions dropped (a full fetch follows), by reason.",
    ),
    # shaping
    _spec(
        "shaped_responses_total",
        "counter",
        ["policy"],
        "Fetch responses the proxy trimmed or rotated before delivery.",
    ),
    _spec(
        "limit_applied_total",
        "counter",
        ["limit", "policy"],
        "Fetch responses in which a limit held back data.",
    ),
    _spec(
        "trimmed_records_total",
        "counter",
        ["limit", "policy"],
        "Records held back from a response by each limit.",
    ),
    _spec(
        "trimmed_bytes_total",
        "counter",
        ["limit", "policy"],
        "Record-batch bytes held back from a response by each limit.",
    ),
    _spec(
        "buffered_reuse_hits_total",
        "counter",
        [],
        "Partitions served from the reuse buffer instead of being fetched again.",
    ),
    _spec(
        "buffered_reuse_bytes_total",
        "counter",
        [],
        "Record-batch bytes served from the reuse buffer.",
    ),
    _spec(
        "memory_budget_used_bytes",
        "gauge",
        [],
        "Response data currently held by the proxy against the memory budget.",
    ),
    _spec("memory_budget_limit_bytes", "gauge", [], "The configured memory budget."),
    _spec(
        "memory_budget_waits_total",
        "counter",
        [],
        "Fetch responses that waited for memory budget before being read (their broker connection is not read meanwhile).",
    ),
    _spec(
        "partitions_in_flight",
        "gauge",
        [],
        "Partitions of the fetches being processed (more than 500 partitions each), at most"
        " max_partitions_in_flight or the largest fetch let in alone.",
    ),
    _spec(
        "partitions_in_flight_waits_total",
        "counter",
        [],
        "Fetches that waited for max_partitions_in_flight before being decoded (their"
        " connection's fetches are not served meanwhile).",
    ),
    _spec(
        "request_bytes_held",
        "gauge",
        [],
        "Client request bytes held: partial frames, frames not yet written upstream, Fetch"
        " frames not yet answered (at most max_buffered_request_bytes, or the largest frame"
        " let in, plus 16 KiB per connection).",
    ),
    _spec(
        "request_memory_reserved_bytes",
        "gauge",
        [],
        "Request bytes reserved from the max_buffered_request_bytes pool (beyond the"
        " connections' 16 KiB shares).",
    ),
    _spec(
        "request_memory_waiting_connections",
        "gauge",
        [],
        "Client connections not read because the request memory pool has no room for their"
        " next frame (back-pressure).",
    ),
    _spec(
        "partition_starvation_rounds",
        "histogram",
        [],
        "Fetch rounds since a partition with data was last served, observed when it is served.",
    ),
    # operations
    _spec("config_reloads_total", "counter", [], "Successful configuration reloads."),
    _spec(
        "config_reload_failures_total",
        "counter",
        [],
        "Configuration reloads refused (the previous configuration stays).",
    ),
    _spec(
        "decision_log_events_total",
        "counter",
        ["outcome"],
        "Decision-log events, by outcome (written, sampled_out, dropped, queue_full).",
    ),
)

# Only registered when Metrics(client_id_label_cap=N) with N > 0.
CLIENT_ID_SPEC = _spec(
    "proxy_to_client_fetch_record_bytes_by_client_total",
    "counter",
    ["client_id"],
    "Record-batch bytes delivered, by client id (opt-in; capped, then 'other').",
)

# Only registered when Metrics(client_id_label_cap=N) with N > 0.
CLIENT_ID_RACK_SPEC = _spec(
    "broker_to_proxy_fetch_rack_record_bytes_by_client_total",
    "counter",
    ["client_id", "locality"],
    "Record-batch bytes received from brokers for each client id, by whether the broker "
    "is in the proxy's rack (opt-in; capped, then 'other').",
)
OPT_IN_SPECS = (CLIENT_ID_SPEC, CLIENT_ID_RACK_SPEC)
"""The metrics registered only with a client id label cap."""

_BY_NAME = {spec.name: spec for spec in (*CATALOGUE, *OPT_IN_SPECS)}


def spec(name: str) -> MetricSpec:
    """The catalogue entry for a full metric name."""
    return _BY_NAME[name]


class NodeBytesLike(Protocol):
    """``proxy.relay.racks.NodeBytes``, read structurally."""

    @property
    def node(self) -> int | None: ...
    @property
    def locality(self) -> str: ...
    @property
    def record_bytes(self) -> int: ...
    @property
    def avoided_bytes(self) -> int: ...
    @property
    def follower_partitions(self) -> int: ...


class RackUsageLike(Protocol):
    """``proxy.relay.racks.RackUsage`` as the metrics read it."""

    @property
    def by_node(self) -> Sequence[NodeBytesLike]: ...


def _node_key(node: int | None) -> str:
    return UNKNOWN if node is None else str(node)


class ByApi:
    """One family's labelled children by API key, each resolved once (``api`` label only).

    The cache holds only keys of the fixed API table, so it is bounded by that
    table; any other key maps to ``unknown`` and is resolved on each use.
    """

    __slots__ = ("_children", "_families")

    def __init__(self, *families: CounterFamily | HistogramFamily) -> None:
        self._families = families
        self._children: dict[int, tuple[Any, ...]] = {}

    def __call__(self, api_key: int) -> tuple[Any, ...]:
        """The children (one per family, in order) for ``api_key``'s label."""
        children = self._children.get(api_key)
        if children is None:
            api = api_name(api_key)
            children = tuple(f.labels(api=api) for f in self._families)
            if api_key in API_NAMES:
                self._children[api_key] = children
        return children


class Leg:
    """The request or response series of one leg: count and size histogram, by API."""

    __slots__ = ("_children",)

    def __init__(self, count: CounterFamily, sizes: HistogramFamily) -> None:
        self._children = ByApi(count, sizes)

    def __call__(self, api_key: int, size: int) -> None:
        """A frame of ``size`` bytes of ``api_key`` crossed this leg."""
        count, sizes = self._children(api_key)
        count.inc()
        sizes.observe(size)


class Durations:
    """A duration histogram by API (``client_``/``broker_request_duration_seconds``)."""

    __slots__ = ("_children",)

    def __init__(self, histogram: HistogramFamily) -> None:
        self._children = ByApi(histogram)

    def __call__(self, api_key: int, seconds: float) -> None:
        (child,) = self._children(api_key)
        child.observe(seconds)


class Metrics:
    """The proxy's metrics on one registry, with one method per thing that happens."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        node_label_cap: int = 64,
        policy_label_cap: int = 32,
        client_id_label_cap: int = 0,
        process_metrics: bool = True,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        if process_metrics:
            # the client library's standard process_* (CPU, RSS, open fds) and
            # python_info series, unprefixed as everywhere else
            ProcessCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)
        self._node = BoundedLabel(node_label_cap)
        self._policy = BoundedLabel(policy_label_cap)
        self._client_id = BoundedLabel(client_id_label_cap, max_length=128)
        self._counters: dict[str, CounterFamily] = {}
        self._gauges: dict[str, Gauge] = {}
        self._histograms: dict[str, HistogramFamily] = {}
        specs = list(CATALOGUE)
        if client_id_label_cap > 0:
            specs.extend(OPT_IN_SPECS)
        for s in specs:
            self._register(s)
        self._preset()
        self.legs: dict[Direction, Leg] = {
            d: Leg(
                self._counters[f"{d.value}_{what}s_total"],
                self._histograms[f"{d.value}_{what}_size_bytes"],
            )
            for d, what in (
                (Direction.CLIENT_TO_PROXY, "request"),
                (Direction.PROXY_TO_BROKER, "request"),
                (Direction.BROKER_TO_PROXY, "response"),
                (Direction.PROXY_TO_CLIENT, "response"),
            )
        }
        """Each leg's per-API count and size series (what the traffic meter feeds)."""
        self.client_durations = Durations(self._histograms["client_request_duration_seconds"])
        """``client_request_duration`` with its children resolved (what the meter calls)."""
        self.broker_durations = Durations(self._histograms["broker_request_duration_seconds"])
        """``broker_request_duration`` with its children resolved (what the meter calls)."""
        self._starvation = self._histograms["partition_starvation_rounds"].single()
        saved = self._counters["incremental_fetch_saved_bytes_total"]
        self._saved_request = saved.labels(kind="request")
        self._saved_response = saved.labels(kind="response")
        self._fetch_data_by_node: dict[str, tuple[Any, Any]] = {}
        self._rack_bytes: dict[tuple[str, str], Any] = {}
        self._cross_zone_price = 0.0
        self._cross_zone_cost = 0.0

    # -- construction --------------------------------------------------------------

    def _register(self, s: MetricSpec) -> None:
        short = s.name.removeprefix(PREFIX)
        if s.kind == "counter":
            self._counters[short] = CounterFamily(s.name, s.help, s.labels, registry=self.registry)
        elif s.kind == "gauge":
            self._gauges[short] = Gauge(s.name, s.help, s.labels, registry=self.registry)
        else:
            buckets = {
                "partition_starvation_rounds": STARVATION_BUCKETS,
            }.get(short, LATENCY_BUCKETS if short.endswith("_seconds") else SIZE_BUCKETS)
            self._histograms[short] = HistogramFamily(
                s.name, s.help, s.labels, buckets=buckets, registry=self.registry
            )

    def _preset(self) -> None:
        """Create the series of fixed label sets at zero, so rate() works from the first scrape."""
        self._gauges["build_info"].labels(version=__version__).set(1)
        for cause in CloseCause:
            self._counters["client_connections_closed_total"].labels(cause=cause.value)
        for reason in REFUSE_REASONS:
            self._counters["client_connections_refused_total"].labels(reason=reason)
        for side in Side:
            self._gauges["fetch_sessions_active"].labels(side=side.value)
            self._gauges["fetch_session_partitions_cached"].labels(side=side.value)
            self._counters["fetch_session_evictions_total"].labels(side=side.value)
        for kind in ("request", "response"):
            self._counters["incremental_fetch_saved_bytes_total"].labels(kind=kind)
        for outcome in DecisionOutcome:
            self._counters["decision_log_events_total"].labels(outcome=outcome.value)
        for reason in FallbackReason:
            self._counters["preferred_replica_fallbacks_total"].labels(reason=reason.value)

    def label_value_counts(self) -> dict[str, int]:
        """Distinct label sets per metric family (what a cardinality test looks at)."""
        counts: dict[str, int] = {}
        for family in self.registry.collect():
            keys = {
                tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                for s in family.samples
            }
            counts[family.name] = len(keys)
        return counts

    # -- connections -----------------------------------------------------------------

    def connection_accepted(self) -> None:
        self._counters["client_connections_accepted_total"].inc()
        self._gauges["client_connections_open"].inc()

    def connection_refused(self, reason: str) -> None:
        """A client connection was closed at accept (it was never served nor counted open)."""
        label = reason if reason in REFUSE_REASONS else OTHER
        self._counters["client_connections_refused_total"].labels(reason=label).inc()

    def connection_closed(self, cause: CloseCause | str) -> None:
        label = enum_label(CloseCause, str(cause), CloseCause.OTHER)
        self._counters["client_connections_closed_total"].labels(cause=label).inc()
        self._gauges["client_connections_open"].dec()

    def broker_connection_opened(self, node: int | None) -> None:
        n = self._node(_node_key(node))
        self._counters["broker_connections_opened_total"].labels(node=n).inc()
        self._gauges["broker_connections_open"].labels(node=n).inc()

    def broker_connection_closed(self, node: int | None, cause: CloseCause | str) -> None:
        n = self._node(_node_key(node))
        label = enum_label(CloseCause, str(cause), CloseCause.OTHER)
        self._counters["broker_connections_closed_total"].labels(node=n, cause=label).inc()
        self._gauges["broker_connections_open"].labels(node=n).dec()

    def broker_connect_failed(self, node: int | None) -> None:
        self._counters["broker_connect_failures_total"].labels(
            node=self._node(_node_key(node))
        ).inc()

    def set_brokers_reachable(self, count: int) -> None:
        self._gauges["upstream_brokers_reachable"].set(count)

    # -- requests and responses ------------------------------------------------------

    def request(
        self, api_key: int, direction: Direction, size: int, *, node: int | None = None
    ) -> None:
        """A request frame of ``size`` bytes crossed ``direction`` (client_to_proxy or proxy_to_broker)."""
        if direction is Direction.CLIENT_TO_PROXY:
            self.legs[direction](api_key, size)
        elif direction is Direction.PROXY_TO_BROKER:
            self.legs[direction](api_key, size)
            self.node_bytes(node, direction).inc(size)
        else:
            raise ValueError(f"{direction} is not a request direction")

    def response(
        self, api_key: int, direction: Direction, size: int, *, node: int | None = None
    ) -> None:
        """A response frame of ``size`` bytes crossed ``direction`` (broker_to_proxy or proxy_to_client)."""
        if direction is Direction.BROKER_TO_PROXY:
            self.legs[direction](api_key, size)
            self.node_bytes(node, direction).inc(size)
        elif direction is Direction.PROXY_TO_CLIENT:
            self.legs[direction](api_key, size)
        else:
            raise ValueError(f"{direction} is not a response direction")

    def client_request_duration(self, api_key: int, seconds: float) -> None:
        self.client_durations(api_key, seconds)

    def broker_request_duration(self, api_key: int, seconds: float) -> None:
        self.broker_durations(api_key, seconds)

    def node_bytes(self, node: int | None, direction: Direction) -> Any:
        """The bytes counter of ``node``'s label on ``direction`` (proxy_to_broker or
        broker_to_proxy).  A connection's meter asks once: its node never changes."""
        if direction is Direction.PROXY_TO_BROKER:
            family = self._counters["proxy_to_broker_bytes_total"]
        elif direction is Direction.BROKER_TO_PROXY:
            family = self._counters["broker_to_proxy_bytes_total"]
        else:
            raise ValueError(f"{direction} is not a leg between the proxy and a broker")
        return family.labels(node=self._node(_node_key(node)))

    # -- fetch data ------------------------------------------------------------------

    def upstream_fetch_data(self, node: int | None, records: int, record_bytes: int) -> None:
        """Record batches that arrived from a broker in a Fetch response."""
        n = self._node(_node_key(node))
        children = self._fetch_data_by_node.get(n)
        if children is None:  # once per node label (bounded: node_label_cap, other, unknown)
            children = self._fetch_data_by_node[n] = (
                self._counters["broker_to_proxy_fetch_records_total"].labels(node=n),
                self._counters["broker_to_proxy_fetch_record_bytes_total"].labels(node=n),
            )
        children[0].inc(records)
        children[1].inc(record_bytes)

    def delivered_fetch_data(
        self, records: int, record_bytes: int, *, client_id: str | None = None
    ) -> None:
        """Record batches delivered to a client in a Fetch response."""
        if not (records or record_bytes):
            return  # an empty answer (most of an idle consumer's): nothing to add
        self._counters["proxy_to_client_fetch_records_total"].inc(records)
        self._counters["proxy_to_client_fetch_record_bytes_total"].inc(record_bytes)
        by_client = self._counters.get("proxy_to_client_fetch_record_bytes_by_client_total")
        if by_client is not None:
            by_client.labels(client_id=self._client_id(client_id or "")).inc(record_bytes)

    def fetch_session_saved(self, *, request_bytes: int = 0, response_bytes: int = 0) -> None:
        """Bytes an incremental session saved against the full fetch the client asked for."""
        if request_bytes > 0:
            self._saved_request.inc(request_bytes)
        if response_bytes > 0:
            self._saved_response.inc(response_bytes)

    # -- rack-aware fetching ---------------------------------------------------------

    def rack_fetch_data(self, usage: RackUsageLike, *, client_id: str | None = None) -> None:
        """Where one exchange's record bytes came from (``proxy.relay.racks.account``)."""
        by_client = self._counters.get("broker_to_proxy_fetch_rack_record_bytes_by_client_total")
        client = self._client_id(client_id or "") if by_client is not None else ""
        avoided = 0
        for n in usage.by_node:
            locality = enum_label(Locality, str(n.locality), Locality.UNKNOWN)
            if n.record_bytes:
                node = self._node(_node_key(n.node))
                child = self._rack_bytes.get((node, locality))
                if child is None:  # bounded: node labels x 3 localities
                    family = self._counters["broker_to_proxy_fetch_rack_record_bytes_total"]
                    child = self._rack_bytes[(node, locality)] = family.labels(
                        node=node, locality=locality
                    )
                child.inc(n.record_bytes)
                if by_client is not None:
                    by_client.labels(client_id=client, locality=locality).inc(n.record_bytes)
            if n.follower_partitions:
                self._counters["proxy_to_broker_preferred_replica_fetches_total"].labels(
                    node=self._node(_node_key(n.node))
                ).inc()
            avoided += n.avoided_bytes
        if avoided:
            self._counters["cross_zone_avoided_record_bytes_total"].inc(avoided)
            self._cross_zone_cost += cost(avoided, self._cross_zone_price)
            self._gauges["cross_zone_cost_avoided"].set(self._cross_zone_cost)

    def set_cross_zone_price(self, price_per_gb: float) -> None:
        """The ``cross_zone_price_per_gb`` setting (at start and at each reload); bytes
        avoided from now on are valued at it, those before keep their price."""
        price = float(price_per_gb)
        if price == self._cross_zone_price:
            return  # (called for every shaped response: the gauge already says it)
        self._cross_zone_price = price
        self._gauges["cross_zone_price_per_gb"].set(price)

    def preferred_replica_redirected(self, replicas: Iterable[int]) -> None:
        """A leader named these preferred read replicas, one per partition redirected."""
        family = self._counters["preferred_replica_redirects_total"]
        for replica in replicas:
            family.labels(node=self._node(_node_key(replica))).inc()

    def preferred_replica_fallback(self, reason: FallbackReason | str, count: int = 1) -> None:
        """``count`` partition fetches went back to the leader for ``reason``."""
        if count > 0:
            label = enum_label(FallbackReason, str(reason), FallbackReason.OTHER)
            self._counters["preferred_replica_fallbacks_total"].labels(reason=label).inc(count)

    # -- fetch sessions --------------------------------------------------------------

    def set_fetch_sessions(self, side: Side, *, active: int, partitions: int) -> None:
        """The session cache's current size (set after every change; cheap)."""
        self._gauges["fetch_sessions_active"].labels(side=side.value).set(active)
        self._gauges["fetch_session_partitions_cached"].labels(side=side.value).set(partitions)

    def fetch_session_evicted(self, side: Side, count: int = 1) -> None:
        if count > 0:
            self._counters["fetch_session_evictions_total"].labels(side=side.value).inc(count)

    def fetch_session_reset(self, side: Side, reason: ResetReason | str) -> None:
        label = enum_label(ResetReason, str(reason), ResetReason.OTHER)
        self._counters["fetch_session_resets_total"].labels(side=side.value, reason=label).inc()

    # -- shaping ---------------------------------------------------------------------

    def shaped_response(self, policy: str) -> None:
        self._counters["shaped_responses_total"].labels(policy=self._policy(policy)).inc()

    def trimmed(
        self, limit: LimitKind | str, *, records: int, record_bytes: int, policy: str
    ) -> None:
        """``limit`` held back ``records`` records (``record_bytes`` bytes) from one response."""
        labels = {
            "limit": enum_label(LimitKind, str(limit), LimitKind.OTHER),
            "policy": self._policy(policy),
        }
        self._counters["limit_applied_total"].labels(**labels).inc()
        self._counters["trimmed_records_total"].labels(**labels).inc(records)
        self._counters["trimmed_bytes_total"].labels(**labels).inc(record_bytes)

    def fetch_repeated(self) -> None:
        self._counters["repeated_fetches_total"].inc()

    def fetch_ran_ahead(self, held_bytes: int) -> None:
        self._counters["run_ahead_rounds_total"].inc()
        self._counters["run_ahead_held_bytes_total"].inc(held_bytes)

    def buffered_reuse_hits(self, record_bytes: Sequence[int]) -> None:
        """Partitions answered from the reuse buffer, with the held bytes of each."""
        if record_bytes:
            self._counters["buffered_reuse_hits_total"].inc(len(record_bytes))
            self._counters["buffered_reuse_bytes_total"].inc(sum(record_bytes))

    def read_fetch_gauges(
        self,
        *,
        memory_budget_used: Callable[[], float],
        memory_budget_limit: Callable[[], float],
        partitions_in_flight: Callable[[], float],
        cross_zone_price: Callable[[], float],
    ) -> None:
        """Read these gauges from the fetch path at each scrape (``proxy.observe.apply``):
        they are its live state, not events, so the core reports none of them."""
        for short, read in (
            ("memory_budget_used_bytes", memory_budget_used),
            ("memory_budget_limit_bytes", memory_budget_limit),
            ("partitions_in_flight", partitions_in_flight),
            ("cross_zone_price_per_gb", cross_zone_price),
        ):
            self._gauges[short].set_function(read)

    def set_memory_budget(self, *, used: int, limit: int | None = None) -> None:
        self._gauges["memory_budget_used_bytes"].set(used)
        if limit is not None:
            self._gauges["memory_budget_limit_bytes"].set(limit)

    def set_request_memory(self, *, held: int, reserved: int, waiting: int) -> None:
        self._gauges["request_bytes_held"].set(held)
        self._gauges["request_memory_reserved_bytes"].set(reserved)
        self._gauges["request_memory_waiting_connections"].set(waiting)

    def memory_budget_wait(self) -> None:
        self._counters["memory_budget_waits_total"].inc()

    def set_partitions_in_flight(self, partitions: int) -> None:
        self._gauges["partitions_in_flight"].set(partitions)

    def partitions_in_flight_wait(self) -> None:
        self._counters["partitions_in_flight_waits_total"].inc()

    def starvations(self, rounds: Iterable[int]) -> None:
        """Partitions with data served, each ``rounds`` fetch rounds after it was last served
        (a response's, in one call)."""
        self._starvation.observe_many(rounds)

    # -- operations ------------------------------------------------------------------

    def config_reloaded(self, *, ok: bool) -> None:
        self._counters["config_reloads_total" if ok else "config_reload_failures_total"].inc()

    def decision_logged(self, outcome: DecisionOutcome, count: int = 1) -> None:
        self._counters["decision_log_events_total"].labels(outcome=outcome.value).inc(count)


def markdown_table() -> str:
    """The metrics table of the documentation, generated from :data:`CATALOGUE`."""
    lines = ["| Metric | Type | Labels | Meaning |", "|---|---|---|---|"]
    for s in (*CATALOGUE, *OPT_IN_SPECS):
        labels = ", ".join(f"`{label}`" for label in s.labels) or "-"
        lines.append(f"| `{s.name}` | {s.kind} | {labels} | {s.help} |")
    return "\n".join(lines) + "\n"
