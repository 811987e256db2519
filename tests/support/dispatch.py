"""Drive the dev cluster's sans-I/O dispatcher with encoded frames, on a fake clock."""

from __future__ import annotations

from typing import Any

from devbroker.build import build
from devbroker.fetch import NodeFetcher
from devbroker.membership import GroupCoordinator
from devbroker.node import NodeDispatcher
from devbroker.outcome import Close, NoReply, Outcome, Reply, Wait
from devbroker.state import ClusterState
from proxy.protocol import codec
from proxy.sessions.as_broker_cache import FetchSessionCache


class Harness:
    """A dev cluster without sockets: one dispatcher per node, time moved by hand."""

    def __init__(self, nodes: int = 3, topics: dict[str, int] | None = None) -> None:
        self.now = 1000.0
        self.state = ClusterState("dev-cluster-id", list(range(nodes)))
        for n in range(nodes):
            self.state.addresses[n] = ("127.0.0.1", 9000 + n)
        for name, count in (topics or {}).items():
            self.state.create_topic(name, count)
        self.coordinator = GroupCoordinator(self.state)
        self.nodes = [
            NodeDispatcher(
                n,
                self.state,
                self.coordinator,
                NodeFetcher(n, self.state, FetchSessionCache(clock=self.clock)),
                clock=self.clock,
            )
            for n in range(nodes)
        ]
        self._cid = 0

    def clock(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def request(self, api_key: int, version: int, data: dict[str, Any]) -> Any:
        return build(codec.request_schema(api_key, version), data)

    def send(self, node: int, request: Any, client_id: str | None = "test-client") -> Outcome:
        self._cid += 1
        frame = codec.encode_request(request, self._cid, client_id)
        return self.nodes[node].handle(frame)

    def send_raw(self, node: int, frame: bytes) -> Outcome:
        return self.nodes[node].handle(frame)

    def decode(self, outcome: Reply, api_key: int, version: int) -> Any:
        """Encode a reply as the edge would, and decode it back as a client would."""
        frame = codec.encode_response(outcome.response, outcome.correlation_id)
        cid, body = codec.decode_response(api_key, version, frame)
        assert cid == outcome.correlation_id
        return body

    def call(self, node: int, request: Any, client_id: str | None = "test-client") -> Any:
        outcome = self.send(node, request, client_id)
        assert isinstance(outcome, Reply), outcome
        return self.decode(outcome, int(request.__api_key__), int(request.__version__))

    def finish(self, outcome: Wait, api_key: int, version: int) -> Any | None:
        """Poll a parked request at the current time; its decoded response, or None if still parked."""
        if not outcome.pending.poll(self.now):
            return None
        response = outcome.pending.complete()
        return self.decode(Reply(response, outcome.correlation_id), api_key, version)

    def leader_of(self, topic: str, partition: int) -> int:
        p = self.state.partition(topic, partition)
        assert p is not None
        return p.leader


__all__ = ["Close", "Harness", "NoReply", "Reply", "Wait"]
