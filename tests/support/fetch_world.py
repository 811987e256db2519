"""A harness for the Fetch path: the real relay, the dev broker's dispatcher upstream.

Bytes in, bytes out: client frames into the Relay, upstream frames answered by
the dev broker's sans-I/O dispatcher.  ``Conn.with_edge`` acts as the trio edge:
a waker, ``written()`` after every flush, ``pump`` running the handler's
``resume()`` for each wake-up, as the edge's wake loop does (so a large fetch's
slices run), and upstream answers read in order, a Fetch response first taking
its memory budget from its size (``reserve_response``): while it cannot, it and
what follows stay unread in ``answers`` until the test calls ``read_upstream``
(as the edge reads again when woken).  Without an edge, answers are read at once.
Like the edge, ``Conn`` drains the handler's effects after the inputs it feeds it
(``proxy.observe.apply.drain``) to the world's ``metrics`` and ``decision_log``
(without either, they stay in ``handler.effects``).
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from devbroker.fetch import NodeFetcher
from devbroker.membership import GroupCoordinator
from devbroker.node import NodeDispatcher
from devbroker.outcome import Reply, Wait
from devbroker.state import ClusterState
from proxy.config import FetchPathConfig
from proxy.fetchpath import FetchPath, FetchPathHandler
from proxy.observe.apply import drain, watch_fetch_path
from proxy.protocol import codec
from proxy.protocol.framing import payload_bytes
from proxy.protocol.records import iter_batches
from proxy.relay.relay import Relay
from proxy.sessions.as_broker_cache import FetchSessionCache

from .dev_upstream import batch, client_fetch


def resolve(node_id: int, host: str, port: int) -> tuple[str, int] | None:
    return None


class _EdgeRelay(Relay):
    """The real Relay, and after each frame fed to it the edge's drain of the handler's
    effects (``Connection`` drains after every input; tests that feed the relay directly
    see the same metrics)."""

    def __init__(self, conn: Conn) -> None:
        super().__init__(resolve, fetch_handler=conn.handler)
        self._drain = conn.drain

    def client_frame(self, frame: bytes) -> Any:
        header = super().client_frame(frame)
        self._drain()
        return header

    def upstream_frame(self, frame: bytes) -> None:
        super().upstream_frame(frame)
        self._drain()


class Conn:
    """One client connection: a Relay with a FetchPathHandler, the broker answering upstream."""

    def __init__(self, world: World, client_id: str = "rdkafka", node_id: int | None = 1) -> None:
        self.world = world
        self.client_id = client_id
        self.handler: FetchPathHandler = world.path.handler(node_id)
        self.relay: Relay = _EdgeRelay(self)
        self.upstream_frames: list[bytes] = []
        self.held: list[bytes] = []
        """Upstream requests not answered yet (answer=False)."""
        self.answers: deque[bytes] = deque()
        """Upstream answers not read yet (a Fetch response waiting for budget, what follows)."""
        self.edge = False
        self.woken = 0
        self.wakes = 0
        """Wake-ups not acted on yet (``pump`` resumes the handler for each, as the edge does)."""

    def with_edge(self) -> Conn:
        """Act like the trio edge: a waker, and written() after every flush to the client."""

        def wake() -> None:
            self.woken += 1
            self.wakes += 1

        self.handler.bind_waker(wake)
        self.edge = True
        return self

    def read_upstream(self) -> None:
        """Read upstream answers in order; as the edge does, a Fetch response first takes
        its memory budget from its size, and while it cannot, nothing more is read."""
        while self.answers:
            frame = self.answers[0]
            if (
                self.edge
                and self.relay.next_response_key == 1
                and not self.handler.reserve_response(len(frame))
            ):
                self.drain()
                return
            self.relay.upstream_frame(self.answers.popleft())

    def send(self, *client_frames: bytes, answer: bool = True) -> list[bytes]:
        for f in client_frames:
            self.relay.client_frame(f)
        return self.pump(answer=answer)

    def pump(self, *, answer: bool = True) -> list[bytes]:
        for _ in range(100):
            while self.wakes:  # the edge's wake loop: the next slice of a large fetch
                self.wakes -= 1
                self.handler.resume()
            frames = self.relay.take_upstream()
            if not frames:
                if self.wakes:
                    continue
                break
            self.upstream_frames.extend(frames)
            if not answer:
                self.held.extend(frames)
                break
            self.answers.extend(self.world.answer(f) for f in frames)
            self.read_upstream()
        out = [payload_bytes(p) for p in self.relay.take_client()]
        self.drain()
        if out:
            self.handler.written()
        return out

    def drain(self) -> None:
        """The edge's drain of the handler's effects (after every input it feeds it); with
        neither metrics nor a decision log they stay on the handler for the test to read."""
        if self.world.metrics is not None or self.world.decision_log is not None:
            drain(self.handler, self.world.metrics, self.world.decision_log)

    def release_held(self) -> list[bytes]:
        held, self.held = self.held, []
        self.answers.extend(self.world.answer(f) for f in held)
        self.read_upstream()
        return self.pump()

    def fetch(self, cid: int, parts: list[tuple[str, int, int]], version: int = 12) -> Any:
        frame = self.fetch_frame(cid, parts, version)
        [out] = self.send(frame)
        return codec.decode_response(1, version, out)[1]

    def fetch_frame(self, cid: int, parts: list[tuple[str, int, int]], version: int = 12) -> bytes:
        class _Up:
            state = self.world.state

        request = client_fetch(_Up(), version, parts)  # type: ignore[arg-type]
        return codec.encode_request(request, cid, self.client_id)


class World:
    """A one-node dev cluster (topics orders/4 and events/3) answering upstream frames, and
    the proxy's FetchPath (*shaping* False: the session stages alone)."""

    def __init__(
        self, config: FetchPathConfig | None = None, metrics: Any = None, *, shaping: bool = True
    ) -> None:
        self.state = ClusterState("dev", [1])
        for name, n in {"orders": 4, "events": 3}.items():
            self.state.create_topic(name, n)
        self.upstream_sessions = FetchSessionCache(rng=random.Random(1))
        self.broker = NodeDispatcher(
            1,
            self.state,
            GroupCoordinator(self.state),
            fetcher=NodeFetcher(1, self.state, self.upstream_sessions),
        )
        self.direct = NodeDispatcher(
            1,
            self.state,
            GroupCoordinator(self.state),
            fetcher=NodeFetcher(1, self.state, FetchSessionCache(rng=random.Random(2))),
        )
        self.path = FetchPath(config or FetchPathConfig(), shaping=shaping)
        self.metrics = metrics
        """Where ``Conn`` applies the handlers' effects, as the edge does (None: nowhere)."""
        self._decision_log: Any = None
        if metrics is not None:
            watch_fetch_path(metrics, self.path)

    @property
    def decision_log(self) -> Any:
        """Where ``Conn`` logs the shaped responses' reports, as the edge does (None: nowhere)."""
        return self._decision_log

    @decision_log.setter
    def decision_log(self, log: Any) -> None:
        self._decision_log = log
        self.path.starved_detail = log is not None  # as the proxy does with a decision log

    def answer(self, frame: bytes, dispatcher: NodeDispatcher | None = None) -> bytes:
        outcome = (dispatcher or self.broker).handle(frame)
        if isinstance(outcome, Wait):
            assert outcome.pending.poll(0.0)
            return codec.encode_response(outcome.pending.complete(), outcome.correlation_id)
        assert isinstance(outcome, Reply), outcome
        return codec.encode_response(outcome.response, outcome.correlation_id)

    def append(self, topic: str, p: int, count: int, times: int = 1) -> None:
        part = self.state.partition(topic, p)
        assert part is not None
        for _ in range(times):
            part.log.append(batch(count), part.leader_epoch)


ALL = [("orders", p, 0) for p in range(4)] + [("events", p, 0) for p in range(3)]


def delivered(
    response: Any, world: World | None = None
) -> dict[tuple[str, int], list[tuple[int, int]]]:
    """(base offset, record count) of every batch per partition (v13+: pass the world)."""
    out: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for t in response.responses:
        name = t.topic if world is None else world.state.topics_by_id[t.topic_id].name
        for pd in t.partitions:
            out[(name, int(pd.partition_index))] = [
                (h.base_offset, h.records_count) for h in iter_batches(pd.records or b"")
            ]
    return out


def upstream_fetches(conn: Conn) -> list[Any]:
    out = []
    for f in conn.upstream_frames:
        if codec.parse_request_header(f).api_key == 1:
            out.append(codec.decode_request(f)[1])
    return out
