"""Hard limits against resource exhaustion: each one against a hostile peer.

Two levels: a ``Connection`` over in-memory streams (trio's lockstep streams model a
client that does not read; the autojump clock runs idle timeouts of minutes in
no time), and the whole proxy in front of an in-process dev cluster over
loopback sockets with run-time ports.  RELIABILITY.md ("Limits") lists them.
"""

from __future__ import annotations

import datetime
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
import trio
import trio.testing
from kio.schema.fetch.v12 import request as fetch12
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i32Timedelta, i64
from support.dev_proxy import proxy_on_dev_cluster
from support.loopback import API_VERSIONS, METADATA, request, settings
from support.trio_waits import closed_by_peer

from devbroker.cluster import DevCluster
from proxy.observe.metrics import Metrics
from proxy.protocol import codec
from proxy.protocol.framing import FrameDecoder, encode_frame
from proxy.relay.relay import Relay
from proxy.server.connection import UPSTREAM_RECEIVE_BYTES, Connection
from proxy.server.idle import IdleTimer
from proxy.server.proxy import Proxy

P = "kafka_fetch_proxy_"


# --- helpers ---------------------------------------------------------------------------------


def resolve(node_id: int, host: str, port: int) -> tuple[str, int]:
    return ("proxy", 9000 + node_id)


def opaque_request(cid: int, body: bytes = b"") -> bytes:
    # OffsetCommit v2 (api key 8): not decoded by the proxy, relayed opaque
    return struct.pack(">hhi", 8, 2, cid) + b"\x00\x03app" + body


def fetch_v12(
    cid: int,
    partitions: list[int],
    *,
    topic: str = "t",
    session_id: int = 0,
    epoch: int = -1,
    max_wait_ms: int = 0,
    forget: list[int] | None = None,
) -> bytes:
    request = fetch12.FetchRequest(
        cluster_id=None,
        replica_id=BrokerId(-1),
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=max_wait_ms)),
        min_bytes=i32(1),
        max_bytes=i32(1 << 20),
        isolation_level=i8(0),
        session_id=i32(session_id),
        session_epoch=i32(epoch),
        topics=(
            fetch12.FetchTopic(
                topic=TopicName(topic),
                partitions=tuple(
                    fetch12.FetchPartition(
                        partition=i32(p),
                        current_leader_epoch=i32(-1),
                        fetch_offset=i64(0),
                        last_fetched_epoch=i32(-1),
                        log_start_offset=i64(-1),
                        partition_max_bytes=i32(1 << 16),
                    )
                    for p in partitions
                ),
            ),
        )
        if partitions
        else (),
        forgotten_topics_data=(
            (
                fetch12.ForgottenTopic(
                    topic=TopicName(topic), partitions=tuple(i32(p) for p in forget)
                ),
            )
            if forget
            else ()
        ),
        rack_id="",
    )
    return codec.encode_request(request, cid, "t")


async def until(changed: Callable[[], Awaitable[None]], ready: Callable[[], bool]) -> None:
    """Await *changed* until *ready()* holds."""
    while not ready():
        await changed()


class Served:
    """Connection over in-memory streams; the test plays the client and the broker."""

    def __init__(
        self,
        *,
        lockstep: bool = False,
        max_in_flight: int = 512,
        max_client_buffer_bytes: int = 1 << 20,
        idle_timeout: float = 0.0,
        max_frame_bytes: int = 1 << 20,
    ) -> None:
        pair = trio.testing.lockstep_stream_pair if lockstep else trio.testing.memory_stream_pair
        self.client, proxy_client_side = pair()
        proxy_upstream_side, self.broker = trio.testing.memory_stream_pair()
        self.relay = Relay(resolve, max_in_flight=max_in_flight)
        self.conn = Connection(
            proxy_client_side,
            proxy_upstream_side,
            self.relay,
            max_frame_bytes=max_frame_bytes,
            max_client_buffer_bytes=max_client_buffer_bytes,
            idle=IdleTimer(idle_timeout) if idle_timeout > 0 else None,
        )
        self.reason: str | None = None
        self.ended = trio.Event()
        self.requests_seen = 0

    def start(self, nursery: trio.Nursery) -> None:
        async def run() -> None:
            async with trio.open_nursery() as timers:
                if self.conn.idle is not None:
                    timers.start_soon(self.conn.idle.run)
                self.reason = await self.conn.run()
                timers.cancel_scope.cancel()
            await trio.aclose_forcefully(self.conn.client)
            await trio.aclose_forcefully(self.conn.upstream)
            self.ended.set()

        nursery.start_soon(run)

    async def broker_loop(self, answer: Callable[[bytes], Awaitable[bytes | None]]) -> None:
        """Play the broker: *answer(request)* gives the response body after the id (None: none).

        Requests are counted as they arrive (``requests_seen``) and answered in order.
        """
        decoder = FrameDecoder(1 << 20)
        send, receive = trio.open_memory_channel[bytes](10_000)

        async def answer_in_order() -> None:
            async for frame in receive:
                body = await answer(frame)
                if body is not None:
                    try:
                        await self.broker.send_all(encode_frame(frame[4:8] + body))
                    except (trio.ClosedResourceError, trio.BrokenResourceError):
                        return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer_in_order)
            while True:
                try:
                    data = await self.broker.receive_some(65536)
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    data = b""
                if not data:
                    nursery.cancel_scope.cancel()
                    return
                decoder.feed(data)
                for frame in decoder.frames():
                    self.requests_seen += 1
                    send.send_nowait(frame)


async def send_ignoring_close(stream: trio.abc.Stream, frames: list[bytes]) -> None:
    """A client pipelining *frames* without reading; the proxy may close on it."""
    try:
        for frame in frames:
            await stream.send_all(encode_frame(frame))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


# --- maximum frame size ----------------------------------------------------------------------


async def test_a_client_announcing_a_huge_frame_is_closed_before_sending_the_body() -> None:
    metrics = Metrics(process_metrics=False)
    with trio.fail_after(15):
        async with proxy_on_dev_cluster(metrics=metrics) as proxy:
            port = proxy.bootstrap.port
            hostile = await trio.open_tcp_stream("127.0.0.1", port)
            # 2 GiB announced, not one byte of it sent: only the prefix can have refused it
            await hostile.send_all(struct.pack(">i", 2**31 - 1))
            assert await closed_by_peer(hostile)
            await hostile.aclose()
            good = await trio.open_tcp_stream("127.0.0.1", port)
            cid, _ = codec.decode_response(
                18, 3, await request(good, FrameDecoder(1 << 20), API_VERSIONS)
            )
            assert cid == 7  # everyone else is served as before
            await good.aclose()
    value = metrics.registry.get_sample_value
    assert value(f"{P}client_connections_closed_total", {"cause": "frame_too_large"}) == 1


async def test_a_broker_announcing_a_huge_frame_closes_that_connection_before_buffering() -> None:
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            s = Served(max_frame_bytes=1 << 20)
            s.start(nursery)
            await s.client.send_all(encode_frame(opaque_request(1)))
            await s.broker.receive_some(65536)
            await s.broker.send_all(struct.pack(">i", 2**31 - 1))  # the prefix alone
            await s.ended.wait()
    assert s.reason == "protocol_error"
    assert (s.conn.outcome.error or "").startswith("FrameTooLarge")


# --- maximum in-flight requests ----------------------------------------------------------------


async def test_pipelining_beyond_max_in_flight_stops_reading_the_client() -> None:
    answers, released = trio.open_memory_channel[None](100)

    async def answer_when_released(frame: bytes) -> bytes:
        await released.receive()
        return b"ok"

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            s = Served(max_in_flight=4)
            s.start(nursery)
            nursery.start_soon(s.broker_loop, answer_when_released)
            # 1,000 pipelined requests, none answered yet
            await s.client.send_all(
                b"".join(encode_frame(opaque_request(c, b"x" * 100)) for c in range(1000))
            )
            await trio.testing.wait_all_tasks_blocked()
            assert s.relay.in_flight == 4 and s.requests_seen == 4
            assert s.conn.buffered == 0
            # one answer frees one slot: exactly one more request is read
            await answers.send(None)
            await trio.testing.wait_all_tasks_blocked()
            assert s.requests_seen == 5 and s.relay.in_flight == 4
            assert s.reason is None  # back-pressure, not a close
            nursery.cancel_scope.cancel()


# --- maximum connections -------------------------------------------------------------------------


async def test_connections_beyond_max_connections_are_refused_with_a_log_line_and_a_metric() -> (
    None
):
    metrics = Metrics(process_metrics=False)
    with trio.fail_after(15), structlog.testing.capture_logs() as logs:
        async with proxy_on_dev_cluster(max_connections=2, metrics=metrics) as proxy:
            port = proxy.bootstrap.port
            served = []
            for _ in range(2):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await request(stream, FrameDecoder(1 << 20), API_VERSIONS)
                served.append(stream)
            for _ in range(3):
                excess = await trio.open_tcp_stream("127.0.0.1", port)
                assert await closed_by_peer(excess)
                await excess.aclose()
            assert proxy.open_connections == 2
            for stream in served:  # the two served connections still work
                await request(stream, FrameDecoder(1 << 20), METADATA)
                await stream.aclose()
    refused = [e for e in logs if e["event"] == "connection_refused"]
    assert len(refused) == 3
    assert all(e["reason"] == "max_connections" and e["limit"] == 2 for e in refused)
    assert "max_connections" in refused[0]["hint"]
    value = metrics.registry.get_sample_value
    assert value(f"{P}client_connections_refused_total", {"reason": "max_connections"}) == 3
    assert value(f"{P}client_connections_accepted_total") == 2  # refused ones were never served


# --- idle timeout ----------------------------------------------------------------------------------


async def test_an_idle_client_connection_is_closed_after_the_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def echo(frame: bytes) -> bytes:
        return b"ok"

    with trio.fail_after(7200):  # virtual seconds (autojump clock)
        async with trio.open_nursery() as nursery:
            s = Served(idle_timeout=600)
            s.start(nursery)
            nursery.start_soon(s.broker_loop, echo)
            await s.client.send_all(encode_frame(opaque_request(1)))
            assert await s.client.receive_some(100) == encode_frame(struct.pack(">i", 1) + b"ok")
            answered = trio.current_time()
            await s.ended.wait()
    assert s.reason == "idle_timeout"
    assert 600 <= trio.current_time() - answered < 601


async def test_a_long_poll_in_flight_keeps_the_connection_open(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def long_poll(frame: bytes) -> bytes:
        await trio.sleep(900)  # longer than the idle timeout
        return b"data"

    with trio.fail_after(7200):  # virtual seconds (autojump clock)
        async with trio.open_nursery() as nursery:
            s = Served(idle_timeout=600)
            s.start(nursery)
            nursery.start_soon(s.broker_loop, long_poll)
            start = trio.current_time()
            await s.client.send_all(encode_frame(opaque_request(1)))
            assert await s.client.receive_some(100) == encode_frame(struct.pack(">i", 1) + b"data")
            assert trio.current_time() - start >= 900 and s.reason is None
            answered = trio.current_time()
            await s.ended.wait()  # then idle like any other
    assert s.reason == "idle_timeout"
    assert 600 <= trio.current_time() - answered < 601


async def test_idle_timeout_through_the_proxy_closes_and_counts() -> None:
    metrics = Metrics(process_metrics=False)
    with trio.fail_after(15):
        async with proxy_on_dev_cluster(idle_timeout_seconds=0.2, metrics=metrics) as proxy:
            stream = await trio.open_tcp_stream("127.0.0.1", proxy.bootstrap.port)
            await request(stream, FrameDecoder(1 << 20), API_VERSIONS)
            assert await closed_by_peer(stream)  # nothing more sent: closed by the proxy
            await stream.aclose()
    value = metrics.registry.get_sample_value
    assert value(f"{P}client_connections_closed_total", {"cause": "idle_timeout"}) == 1


# --- maximum bytes buffered for a client that stops reading -------------------------------------


async def test_a_client_that_stops_reading_costs_bounded_memory_then_times_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limit = 64 * 1024
    response = b"r" * 20_000
    go = trio.Event()

    async def big_answer(frame: bytes) -> bytes:
        await go.wait()
        return response

    with trio.fail_after(7200):  # virtual seconds (autojump clock)
        async with trio.open_nursery() as nursery:
            # lockstep: the proxy's writes to the client block until the client reads
            s = Served(
                lockstep=True, max_in_flight=512, max_client_buffer_bytes=limit, idle_timeout=600
            )
            s.start(nursery)
            nursery.start_soon(s.broker_loop, big_answer)
            # 2,000 pipelined requests (40 MB of responses), never read
            nursery.start_soon(
                send_ignoring_close, s.client, [opaque_request(c) for c in range(2000)]
            )
            await trio.testing.wait_all_tasks_blocked()
            assert s.requests_seen == 512  # max_in_flight
            go.set()  # the broker answers all 512 (10 MB) at once
            await trio.testing.wait_all_tasks_blocked()
            assert s.conn.client_full
            # the proxy stopped reading the broker's answers and the client's requests:
            # it holds at most the limit, one upstream read and one response
            assert s.conn.peak_buffered <= limit + UPSTREAM_RECEIVE_BYTES + len(response) + 4
            asked = s.requests_seen
            assert asked < 520  # a few more read while the first answers were below the limit
            stalled = trio.current_time()
            await s.ended.wait()  # and no byte moves: the stuck connection is closed, not kept
            assert s.requests_seen == asked
            nursery.cancel_scope.cancel()
    assert s.reason == "idle_timeout"
    assert 600 <= trio.current_time() - stalled < 601


async def test_a_client_that_reads_again_gets_every_response_in_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limit = 8 * 1024

    async def answer(frame: bytes) -> bytes:
        return frame[8:12] * 1000  # 4 KB, tagged with the proxy's correlation id

    with trio.fail_after(7200):  # virtual seconds (autojump clock)
        async with trio.open_nursery() as nursery:
            s = Served(lockstep=True, max_client_buffer_bytes=limit)
            s.start(nursery)
            nursery.start_soon(s.broker_loop, answer)

            async def pipeline() -> None:
                for c in range(200):
                    await s.client.send_all(encode_frame(opaque_request(c)))

            nursery.start_soon(pipeline)
            await trio.testing.wait_all_tasks_blocked()
            assert s.conn.client_full and s.requests_seen < 200
            decoder = FrameDecoder(1 << 20)
            got: list[int] = []
            while len(got) < 200:
                decoder.feed(await s.client.receive_some(65536))
                got += [struct.unpack(">i", f[:4])[0] for f in decoder.frames()]
            assert got == list(range(200))
            assert s.conn.peak_buffered <= limit + 4004 + UPSTREAM_RECEIVE_BYTES
            nursery.cancel_scope.cancel()


async def test_a_client_that_stops_reading_does_not_slow_the_others() -> None:
    limit = 256 * 1024
    with trio.fail_after(20):
        async with DevCluster(nodes=1, topics={"t": 3}) as cluster, trio.open_nursery() as nursery:
            proxy = await nursery.start(
                Proxy(settings(cluster.bootstrap, max_client_buffer_bytes=limit)).serve
            )
            await proxy.discovered.wait()
            port = proxy.bootstrap.port
            # the stuck client: a tiny receive window, thousands of pipelined
            # requests (megabytes of responses), and it never reads
            stuck = socket.create_connection(("127.0.0.1", port))
            stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stuck_stream = trio.SocketStream(trio.socket.from_stdlib_socket(stuck))
            await request(stuck_stream, FrameDecoder(1 << 20), API_VERSIONS)
            (live,) = proxy.live.values()
            conn = live.connection

            async def flood() -> None:
                burst = encode_frame(METADATA) * 200
                for _ in range(200):  # 40,000 Metadata requests
                    await stuck_stream.send_all(burst)

            nursery.start_soon(flood)
            await until(conn.wait_changed, lambda: conn.client_full)
            # another client keeps consuming at its normal pace meanwhile
            other = await trio.open_tcp_stream("127.0.0.1", port)
            decoder = FrameDecoder(1 << 20)
            with trio.fail_after(5):
                for c in range(200):
                    await request(other, decoder, fetch_v12(c, [0, 1, 2]))
            # the stuck client's responses held by the proxy stayed bounded
            assert conn.client_full
            assert conn.peak_buffered <= limit + 2 * UPSTREAM_RECEIVE_BYTES
            await other.aclose()
            nursery.cancel_scope.cancel()


# --- maximum partitions per fetch session -----------------------------------------------------------


async def test_a_client_session_larger_than_the_limit_is_served_without_a_session() -> None:
    with trio.fail_after(15):
        async with proxy_on_dev_cluster(topics={"t": 3}, max_fetch_session_partitions=2) as proxy:
            stream = await trio.open_tcp_stream("127.0.0.1", proxy.broker_address(0)[1])
            decoder = FrameDecoder(1 << 20)

            async def fetch(frame: bytes) -> Any:
                _, response = codec.decode_response(1, 12, await request(stream, decoder, frame))
                return response

            def served(response: Any) -> list[int]:
                return sorted(
                    int(p.partition_index) for t in response.responses for p in t.partitions
                )

            # a new session of 3 partitions: Kafka's answer when its cache cannot hold it
            full = await fetch(fetch_v12(1, [0, 1, 2], epoch=0))
            assert full.error_code == 0 and full.session_id == 0 and served(full) == [0, 1, 2]
            (cache,) = proxy.fetch_path.client_session_caches()
            assert cache.num_sessions == 0
            # 2 partitions fit: a session is created
            small = await fetch(fetch_v12(2, [0, 1], epoch=0))
            assert small.error_code == 0 and small.session_id != 0
            assert cache.num_sessions == 1 and cache.num_partitions == 2
            # growing it past the limit closes it; the answer covers every partition
            grown = await fetch(fetch_v12(3, [2], session_id=small.session_id, epoch=1))
            assert grown.error_code == 0 and grown.session_id == 0
            assert served(grown) == [0, 1, 2]
            assert cache.num_sessions == 0 and cache.num_partitions == 0
            gone = await fetch(fetch_v12(4, [], session_id=small.session_id, epoch=2))
            assert gone.error_code == 70  # FETCH_SESSION_ID_NOT_FOUND: it really is closed
            await stream.aclose()
