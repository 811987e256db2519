"""A ProxyStack that exposes the proxy's Fetch path: upstream session stats and byte counts.

    stack = SessionStack(upstream=kafka_or_None)
    with counting_upstream(stack):       # before start: wraps the proxy's upstream sockets
        stack.start()
        ...
        stack.upstream_stats()           # {"full": .., "incremental": .., "resends": ..}

``counting_upstream`` replaces ``proxy.server.proxy.open_upstream`` while the block
runs, so every byte the proxy exchanges with its brokers (dev cluster or real Kafka)
is counted in ``stack.proxy_upstream``, with the Fetch requests among them.  The
epoch-skew fault is a dev-cluster hook; it raises on real Kafka.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import trio

from proxy.fetchpath import FetchPathHandler
from proxy.protocol import codec
from proxy.protocol.apis import FETCH
from proxy.protocol.framing import FrameDecoder
from proxy.server import proxy as proxy_module
from proxy.server.proxy import Proxy
from proxy.sessions.as_client import TranslatorStats

from .kafka import KafkaCluster
from .stack import ProxyStack


class Traffic:
    """Bytes in both directions on a set of sockets, and the Fetch requests among them."""

    def __init__(self) -> None:
        self.counting = False
        self.bytes = 0
        self.fetches = 0
        self.sessionless_fetches = 0
        """Fetch requests outside any session (session id 0, epoch -1)."""

    def take(self) -> tuple[int, int]:
        out = (self.bytes, self.fetches)
        self.bytes = self.fetches = 0
        return out


class CountingStream(trio.abc.Stream):
    """A stream that counts what passes; *requests_out*: requests leave through send_all."""

    def __init__(self, inner: trio.abc.Stream, traffic: Traffic, *, requests_out: bool) -> None:
        self.inner = inner
        self.traffic = traffic
        self.requests_out = requests_out
        self._requests = FrameDecoder(1 << 30)

    def _requests_seen(self, data: bytes) -> None:
        self._requests.feed(data)
        while (frame := self._requests.next_frame()) is not None:
            if not self.traffic.counting or codec.parse_request_header(frame).api_key != FETCH:
                continue
            self.traffic.fetches += 1
            _, request = codec.decode_request(frame)
            if int(getattr(request, "session_epoch", -1)) == -1:
                self.traffic.sessionless_fetches += 1

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.traffic.counting:
            self.traffic.bytes += len(data)
        if self.requests_out:
            self._requests_seen(bytes(data))
        await self.inner.send_all(data)

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.inner.receive_some(max_bytes)
        if self.traffic.counting:
            self.traffic.bytes += len(data)
        if not self.requests_out:
            self._requests_seen(bytes(data))
        return data

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.inner.aclose()


class SessionStack(ProxyStack):
    """The default Proxy (as ``run`` builds it) in front of the dev cluster or real Kafka,
    keeping every Fetch path handler it creates."""

    def __init__(
        self,
        settings: dict[str, Any] | None = None,
        *,
        nodes: int = 3,
        upstream: KafkaCluster | None = None,
        dev_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            settings, nodes=nodes, name="session-stack", upstream=upstream, dev_options=dev_options
        )
        self.handlers: list[FetchPathHandler] = []
        self.closed_stats: list[TranslatorStats] = []
        """The upstream sessions' counters of closed handlers (close() drops the
        translator with the connection since 8d49b2c)."""
        self.proxy_upstream = Traffic()
        """Every byte on the proxy's upstream sockets (with ``counting_upstream``)."""

    def configure(self, proxy: Proxy) -> None:
        path = proxy.fetch_path  # the default Fetch path, as `run` builds it
        assert path is not None
        new_handler = path.handler

        def keep(node_id: int | None = None) -> FetchPathHandler:
            handler = new_handler(node_id)
            self.handlers.append(handler)
            close = handler.close

            def close_keeping_stats() -> None:
                if handler.translator is not None:
                    self.closed_stats.append(handler.translator.stats)
                close()

            handler.close = close_keeping_stats  # type: ignore[method-assign]
            return handler

        path.handler = keep  # type: ignore[method-assign]

    def create_topic(self, partitions: int, prefix: str = "s") -> str:
        return super().create_topic(partitions, prefix)

    def skew_upstream_epochs(self) -> None:
        """Make the next request of every upstream session fail INVALID_FETCH_SESSION_EPOCH."""
        self._dev_only("skewing fetch session epochs")

        def skew() -> None:
            for node in self.cluster.nodes:
                for session in node.sessions.sessions():
                    session.epoch += 1

        self.run_sync(skew)

    def upstream_stats(self) -> dict[str, int]:
        def collect() -> dict[str, int]:
            total: dict[str, int] = defaultdict(int)
            live = [h.translator.stats for h in self.handlers if h.translator is not None]
            for s in [*self.closed_stats, *live]:
                total["full"] += s.full_requests
                total["incremental"] += s.incremental_requests
                total["resends"] += s.resends
                total["session_errors"] += s.session_errors
            return dict(total)

        return self.run_sync(collect)

    def client_sessions_created(self) -> int:
        path = self.proxy.fetch_path
        assert path is not None
        return sum(c.sessions_created for c in path.client_session_caches())


@contextmanager
def counting_upstream(stack: SessionStack) -> Iterator[SessionStack]:
    """Count every byte on the proxy's upstream sockets in ``stack.proxy_upstream``."""
    connect = proxy_module.open_upstream

    async def upstream(*args: Any, **kwargs: Any) -> trio.abc.Stream:
        stream = await connect(*args, **kwargs)
        return CountingStream(stream, stack.proxy_upstream, requests_out=True)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(proxy_module, "open_upstream", upstream)
        yield stack
