"""The proxy in front of an upstream (the dev cluster, or real Kafka), served by trio in a
background thread.

For tests whose clients block (confluent-kafka, kafka-python) or run their own
event loop (aiokafka):

    stack = ProxyStack({"max_records": 50}).start()
    Consumer({"bootstrap.servers": stack.bootstrap, ...})
    stack.stop()

The proxy is built exactly as ``kafka-fetch-proxy run`` builds it
(``Proxy(settings)``, with the default Fetch path); *settings* are added to a
loopback, port-0 base.  With ``upstream=KafkaCluster`` (tests/support/kafka.py) the
proxy serves in front of that real cluster instead of an in-process dev cluster;
the helpers (topics, leaders, stopping nodes) then act on it, and the dev cluster's
fault hooks raise.  Subclasses customise the proxy before it serves by
overriding :meth:`configure`.  Every helper is safe to call from the test's
thread; start and stop are bounded in time.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from devbroker.cluster import DevCluster
from proxy import config
from proxy.server.proxy import Proxy

from .kafka import KafkaCluster

T = TypeVar("T")
START_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0


class ProxyStack:
    def __init__(
        self,
        settings: dict[str, Any] | None = None,
        *,
        nodes: int = 3,
        with_proxy: bool = True,
        metrics: Any | None = None,
        name: str = "proxy-stack",
        upstream: KafkaCluster | None = None,
        dev_options: dict[str, Any] | None = None,
    ) -> None:
        self.nodes = nodes
        self.dev_options = dev_options or {}
        """Keyword arguments for the dev cluster (e.g. ``session_cache_slots``); unused on
        real Kafka, whose settings are the KafkaCluster's."""
        self.kafka = upstream
        """The real cluster in front of which the proxy runs (None: a dev cluster)."""
        self.metrics = metrics
        """A proxy.observe.metrics.Metrics for the proxy to report to (None: no metrics)."""
        self.extra_settings = settings or {}
        self.with_proxy = with_proxy
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.cluster: DevCluster
        self.proxy: Proxy
        self._token: trio.lowlevel.TrioToken
        self._stop: trio.Event

    # -- lifecycle ---------------------------------------------------------------

    def start(self: T) -> T:
        stack: ProxyStack = self  # type: ignore[assignment]
        stack._thread.start()
        if not stack._ready.wait(timeout=START_TIMEOUT):
            raise RuntimeError(f"stack did not start in {START_TIMEOUT:.0f} s")
        if stack._error is not None:
            raise RuntimeError("stack failed to start") from stack._error
        return self

    def stop(self) -> None:
        trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(timeout=STOP_TIMEOUT)
        assert not self._thread.is_alive(), "stack did not stop"

    def configure(self, proxy: Proxy) -> None:
        """Called on the trio thread after the Proxy is built and before it serves."""

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._stop = trio.Event()
        self._token = trio.lowlevel.current_trio_token()
        if self.kafka is not None:
            await self._serve(self.kafka.bootstrap.split(","))
            return
        async with DevCluster(nodes=self.nodes, **self.dev_options) as cluster:
            self.cluster = cluster
            await self._serve([cluster.bootstrap])

    async def _serve(self, upstream: list[str]) -> None:
        if not self.with_proxy:
            self._ready.set()
            await self._stop.wait()
            return
        settings = config.validate(
            {
                "upstream": upstream,
                "listen": "127.0.0.1:0",
                "broker_port_base": 0,
                "connect_timeout_seconds": 5,
                "retry_backoff_initial_seconds": 0.05,
                "retry_backoff_max_seconds": 0.5,
                **self.extra_settings,
            }
        )
        proxy = Proxy(settings, metrics=self.metrics)
        self.configure(proxy)
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.serve)
            with trio.fail_after(20):
                await proxy.discovered.wait()
            self.proxy = proxy
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    # -- helpers (thread-safe) -------------------------------------------------

    def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def run(self, afn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return trio.from_thread.run(afn, *args, trio_token=self._token)

    @property
    def backend(self) -> str:
        """``devbroker`` or ``kafka-<version>``."""
        return "devbroker" if self.kafka is None else f"kafka-{self.kafka.version}"

    @property
    def bootstrap(self) -> str:
        """The proxy's bootstrap address (the cluster's when there is no proxy)."""
        if not self.with_proxy:
            return self.direct_bootstrap
        assert self.proxy.bootstrap is not None
        return f"127.0.0.1:{self.proxy.bootstrap.port}"

    @property
    def direct_bootstrap(self) -> str:
        if self.kafka is not None:
            return self.kafka.bootstrap
        return self.cluster.bootstrap

    def create_topic(self, partitions: int, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        if self.kafka is not None:
            return self.kafka.create_topic(name, partitions)
        self.run_sync(self.cluster.create_topic, name, partitions)
        return name

    def leader_of(self, topic: str, partition: int) -> int:
        if self.kafka is not None:
            return self.kafka.leader_of(topic, partition)
        return self.run_sync(self.cluster.leader_of, topic, partition)

    def stop_node(self, node_id: int) -> None:
        if self.kafka is not None:
            self.kafka.stop_broker(node_id)
            return
        self.run(self.cluster.stop_node, node_id)

    def restart_node(self, node_id: int) -> None:
        if self.kafka is not None:
            self.kafka.start_broker(node_id)
            return
        self.run(self.cluster.restart_node, node_id)

    def evict_upstream_sessions(self) -> None:
        self._dev_only("evicting fetch sessions")
        self.run_sync(self.cluster.evict_fetch_sessions)

    def topic_names(self) -> set[str]:
        if self.kafka is not None:
            return set(self.kafka._admin().list_topics(timeout=10).topics)
        return self.run_sync(lambda: set(self.cluster.state.topics))

    def _dev_only(self, what: str) -> None:
        if self.kafka is not None:
            raise RuntimeError(f"{what} is a dev-cluster fault hook; real Kafka has none")

    def proxy_addresses(self) -> set[tuple[str, int]]:
        return self.run_sync(lambda: set(self.proxy.book.advertised.values()))

    def broker_addresses(self) -> set[tuple[str, int]]:
        if self.kafka is not None:
            return {("127.0.0.1", n.port) for n in self.kafka.nodes.values()}
        return self.run_sync(lambda: {(n.host, n.port) for n in self.cluster.nodes})
