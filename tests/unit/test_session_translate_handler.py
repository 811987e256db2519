"""The Fetch path handler in the real relay (proxy.relay.relay), the dev broker's dispatcher upstream.

Bytes in, bytes out: client frames into the Relay, upstream frames answered by
the dev broker's sans-I/O NodeDispatcher, client frames out.  The reference
for every client response is the dev broker answering the same frame directly.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from kio.schema.api_versions.v3 import request as av3
from kio.schema.metadata.v12 import request as md12
from support.dev_upstream import batch, client_fetch
from support.fetch_world import World, resolve

from devbroker.node import NodeDispatcher
from proxy.observe.apply import drain
from proxy.protocol import codec
from proxy.protocol.framing import payload_bytes
from proxy.relay.relay import Relay
from proxy.sessions.topic_ids import TopicIdMap


class Harness:
    def __init__(self) -> None:
        self.world = world = World(shaping=False)  # the session stages alone
        self.state = world.state
        self.upstream_sessions = world.upstream_sessions
        self.broker = world.broker
        self.direct = world.direct
        self.path = world.path
        self.topic_ids: TopicIdMap = self.path.topic_ids
        self.handler = self.path.handler()
        self.relay = Relay(resolve, fetch_handler=self.handler)
        self.upstream_frames: list[bytes] = []
        self.metrics: Any = None
        """Where the handler's effects go after each send, as the edge does (None: nowhere)."""

    def answer(self, dispatcher: NodeDispatcher, frame: bytes) -> bytes:
        return self.world.answer(frame, dispatcher)

    def send(self, *client_frames: bytes) -> list[bytes]:
        for f in client_frames:
            self.relay.client_frame(f)
        for _ in range(100):
            frames = self.relay.take_upstream()
            if not frames:
                break
            self.upstream_frames.extend(frames)
            for f in frames:
                self.relay.upstream_frame(self.answer(self.broker, f))
        drain(self.handler, self.metrics, None)
        return [payload_bytes(p) for p in self.relay.take_client()]

    def append(self, topic: str, p: int, count: int) -> None:
        part = self.state.partition(topic, p)
        assert part is not None
        part.log.append(batch(count), part.leader_epoch)


def fetch_frame(h: Harness, version: int, cid: int, parts: list[tuple[str, int, int]]) -> bytes:
    class _Up:
        state = h.state

    return codec.encode_request(client_fetch(_Up(), version, parts), cid, "rdkafka")  # type: ignore[arg-type]


def api_versions_frame(cid: int) -> bytes:
    req = av3.ApiVersionsRequest(client_software_name="t", client_software_version="1")
    return codec.encode_request(req, cid, "rdkafka")


ALL = [("orders", p, 0) for p in range(4)] + [("events", p, 0) for p in range(3)]


def test_sessionless_client_through_relay_and_handler() -> None:
    h = Harness()
    [_api_versions] = h.send(api_versions_frame(1))
    assert h.handler.upstream_fetch_max is not None and h.handler.upstream_fetch_max >= 13
    h.append("events", 2, 3)
    for cid in (2, 3, 4):
        frame = fetch_frame(h, 11, cid, ALL)
        [out] = h.send(frame)
        assert out == h.answer(h.direct, frame)
    fetches = [f for f in h.upstream_frames if codec.parse_request_header(f).api_key == 1]
    versions = [codec.parse_request_header(f).api_version for f in fetches]
    # No ids yet: names (v12) and a Metadata request for them; then ids (a new full fetch).
    assert versions[0] == 12 and versions[-1] == h.handler.upstream_fetch_max
    metadata = [f for f in h.upstream_frames if codec.parse_request_header(f).api_key == 3]
    assert len(metadata) == 1
    assert h.topic_ids.id_for("orders") == h.state.topics["orders"].topic_id
    _, last = codec.decode_request(fetches[-1])
    assert last.session_epoch >= 1 and last.topics == ()  # idle: an empty incremental fetch


def test_pipelined_fetches_keep_their_order() -> None:
    h = Harness()
    h.send(api_versions_frame(1))
    h.append("orders", 0, 2)
    frames = [fetch_frame(h, 12, cid, ALL) for cid in (10, 11, 12)]
    out = h.send(*frames)
    assert [codec.peek_correlation_id(f) for f in out] == [10, 11, 12]
    assert out == [h.answer(h.direct, f) for f in frames]


def test_metadata_relayed_for_the_client_teaches_topic_ids() -> None:
    h = Harness()
    h.send(api_versions_frame(1))
    req = md12.MetadataRequest(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    h.send(codec.encode_request(req, 5, "rdkafka"))
    assert h.topic_ids.id_for("events") == h.state.topics["events"].topic_id
    frame = fetch_frame(h, 12, 6, ALL)
    [out] = h.send(frame)
    assert out == h.answer(h.direct, frame)
    _, sent = codec.decode_request(h.upstream_frames[-1])
    assert sent.__version__ >= 13  # ids known: no fallback to names


def test_follower_fetches_pass_through() -> None:
    h = Harness()
    mod: Any = __import__("kio.schema.fetch.v12.request", fromlist=["FetchRequest"])
    req = mod.FetchRequest(
        replica_id=2,
        max_wait=timedelta(0),
        min_bytes=1,
        topics=(),
        forgotten_topics_data=(),
    )
    frame = codec.encode_request(req, 7, "follower")
    h.send(frame)
    assert h.upstream_frames[-1][8:] == frame[8:]


def test_many_pipelined_fetches_answered_locally_do_not_recurse() -> None:
    """Fetches in a session the proxy does not know are answered at once (70), without recursion."""
    h = Harness()
    h.send(api_versions_frame(1))
    mod: Any = __import__("kio.schema.fetch.v12.request", fromlist=["FetchRequest"])
    frames = [
        codec.encode_request(
            mod.FetchRequest(
                max_wait=timedelta(0),
                min_bytes=1,
                session_id=999,
                session_epoch=5,
                topics=(),
                forgotten_topics_data=(),
            ),
            cid,
            "java",
        )
        for cid in range(2, 502)
    ]
    # They queue behind a fetch that waits for upstream, then are all answered in one go.
    out = h.send(fetch_frame(h, 12, 1, ALL), *frames)
    assert [codec.peek_correlation_id(f) for f in out] == list(range(1, 502))
    _, second = codec.decode_response(1, 12, out[1])
    assert int(second.error_code) == 70


def test_metrics_count_saved_bytes_and_upstream_session_resets() -> None:
    from proxy.observe.metrics import PREFIX, Metrics

    h = Harness()
    metrics = Metrics(process_metrics=False)
    h.metrics = metrics
    h.send(api_versions_frame(1))
    frame = fetch_frame(h, 13, 2, ALL)
    h.send(frame)  # full fetch upstream: little saved
    for cid in (3, 4):
        h.send(fetch_frame(h, 13, cid, ALL))
    value = metrics.registry.get_sample_value
    saved = value(f"{PREFIX}incremental_fetch_saved_bytes_total", {"kind": "request"})
    assert saved is not None and saved > 2 * 0.8 * len(frame)
    h.upstream_sessions.clear()  # evicted: the next fetch gets FETCH_SESSION_ID_NOT_FOUND
    [out] = h.send(fetch_frame(h, 13, 5, ALL))
    assert out == h.answer(h.direct, fetch_frame(h, 13, 5, ALL))
    resets = value(
        f"{PREFIX}fetch_session_resets_total",
        {"side": "upstream", "reason": "session_id_not_found"},
    )
    assert resets == 1
    assert 0 < h.handler.upstream_fetch_bytes < h.handler.client_fetch_bytes
