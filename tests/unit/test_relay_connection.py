"""Framing at the connection level, over in-memory streams: whole, split, oversized, truncated, garbage."""

from __future__ import annotations

import struct

import pytest
import trio
import trio.testing

from proxy.protocol.framing import FrameDecoder, encode_frame
from proxy.relay.relay import Relay
from proxy.server.connection import Connection


def resolve(node_id: int, host: str, port: int) -> tuple[str, int]:
    return ("proxy", 9000 + node_id)


def opaque_request(cid: int, body: bytes = b"") -> bytes:
    # OffsetCommit v2 (api key 8): not decoded by the proxy, relayed opaque
    return struct.pack(">hhi", 8, 2, cid) + b"\x00\x03app" + body


async def fake_broker(stream: trio.abc.Stream) -> None:
    """Answer every request with its own body, echoing the (proxy's) correlation id."""
    decoder = FrameDecoder(1 << 20)
    while True:
        try:
            data = await stream.receive_some(4096)
        except trio.ClosedResourceError:  # the test closed the broker side itself
            return
        if not data:
            return
        decoder.feed(data)
        for frame in decoder.frames():
            await stream.send_all(encode_frame(frame[4:8] + b"echo:" + frame[13:]))


class Harness:
    def __init__(self, max_frame_bytes: int = 1024) -> None:
        self.client, proxy_client_side = trio.testing.memory_stream_pair()
        proxy_upstream_side, self.broker = trio.testing.memory_stream_pair()
        self.conn = Connection(
            proxy_client_side,
            proxy_upstream_side,
            Relay(resolve),
            max_frame_bytes=max_frame_bytes,
        )
        self.reason: str | None = None

    async def run(self, nursery: trio.Nursery) -> None:
        async def run_conn() -> None:
            self.reason = await self.conn.run()
            await trio.aclose_forcefully(self.conn.client)
            await trio.aclose_forcefully(self.conn.upstream)

        nursery.start_soon(run_conn)
        nursery.start_soon(fake_broker, self.broker)

    async def read_responses(self, count: int) -> list[bytes]:
        decoder = FrameDecoder(1 << 20)
        out: list[bytes] = []
        while len(out) < count:
            data = await self.client.receive_some(4096)
            assert data, "connection closed before all responses arrived"
            decoder.feed(data)
            out += decoder.frames()
        return out

    async def read_until_closed(self) -> bytes:
        got = b""
        while data := await self.client.receive_some(4096):
            got += data
        return got


async def test_pipelined_requests_whole() -> None:
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            h = Harness()
            await h.run(nursery)
            wire = b"".join(encode_frame(opaque_request(cid, b"#%d" % cid)) for cid in (5, 6, 7))
            await h.client.send_all(wire)
            responses = await h.read_responses(3)
            assert responses == [struct.pack(">i", c) + b"echo:#%d" % c for c in (5, 6, 7)]
            await h.client.aclose()
    assert h.reason == "client_closed"


class CountingStream(trio.abc.Stream):
    """A stream that counts the ``send_all`` calls made on it."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.writes = 0

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.writes += 1
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_requests_read_together_go_upstream_in_one_write() -> None:
    """A client that pipelines pays one upstream write per read, not one per request:
    each write is a scheduler turn, and a busy proxy that took turns per request fell
    behind librdkafka producers until their requests timed out."""
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            h = Harness()
            upstream = CountingStream(h.conn.upstream)
            h.conn.upstream = upstream
            await h.run(nursery)
            cids = range(100, 120)
            wire = b"".join(encode_frame(opaque_request(cid, b"#%d" % cid)) for cid in cids)
            await h.client.send_all(wire)
            responses = await h.read_responses(len(cids))
            assert responses == [struct.pack(">i", c) + b"echo:#%d" % c for c in cids]
            assert upstream.writes == 1
            await h.client.aclose()
    assert h.reason == "client_closed"


async def test_a_response_sent_just_before_the_broker_closes_reaches_the_client() -> None:
    """Kafka answers a failed SaslAuthenticate and closes at once: the client must get the
    answer (then the close), not a bare close."""

    async def answer_once_and_close(stream: trio.abc.Stream) -> None:
        decoder = FrameDecoder(1 << 20)
        while not (frames := decoder.frames()):
            decoder.feed(await stream.receive_some(4096))
        await stream.send_all(encode_frame(frames[0][4:8] + b"bye"))
        await stream.aclose()

    class SlowClientSide(CountingStream):
        """Writes to the client take a few scheduler turns, as a TLS socket's do."""

        async def send_all(self, data: bytes | bytearray | memoryview) -> None:
            for _ in range(3):
                await trio.lowlevel.checkpoint()
            await super().send_all(data)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            h = Harness()
            h.conn.client = SlowClientSide(h.conn.client)

            async def run_conn() -> None:
                h.reason = await h.conn.run()
                await trio.aclose_forcefully(h.conn.client)

            nursery.start_soon(run_conn)
            nursery.start_soon(answer_once_and_close, h.broker)
            await h.client.send_all(encode_frame(opaque_request(77)))
            got = await h.read_until_closed()
    assert got == encode_frame(struct.pack(">i", 77) + b"bye")
    assert h.reason == "upstream_closed"


async def test_split_at_every_byte_boundary() -> None:
    wire = encode_frame(opaque_request(42, b"payload")) + encode_frame(opaque_request(43))
    with trio.fail_after(20):
        for cut in range(1, len(wire)):
            async with trio.open_nursery() as nursery:
                h = Harness()
                await h.run(nursery)
                await h.client.send_all(wire[:cut])
                await trio.testing.wait_all_tasks_blocked()
                await h.client.send_all(wire[cut:])
                responses = await h.read_responses(2)
                assert [r[:4] for r in responses] == [struct.pack(">i", 42), struct.pack(">i", 43)]
                await h.client.aclose()


async def test_byte_by_byte() -> None:
    wire = encode_frame(opaque_request(1, b"xyz"))
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            h = Harness()
            await h.run(nursery)
            for i in range(len(wire)):
                await h.client.send_all(wire[i : i + 1])
                await trio.testing.wait_all_tasks_blocked()
            assert await h.read_responses(1) == [struct.pack(">i", 1) + b"echo:xyz"]
            await h.client.aclose()


@pytest.mark.parametrize(
    "wire",
    [
        pytest.param(struct.pack(">i", 4096) + b"\x00" * 10, id="oversized-prefix"),
        pytest.param(struct.pack(">i", -1), id="negative-size"),
        pytest.param(encode_frame(b"\x00\x08\x00"), id="frame-shorter-than-header"),
        pytest.param(
            encode_frame(b"\x00\x08\x00\x02\x00\x00\x00\x01\x00\x09ab"), id="bad-client-id"
        ),
    ],
)
async def test_garbage_closes_only_that_connection(wire: bytes) -> None:
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            h = Harness(max_frame_bytes=1024)
            await h.run(nursery)
            await h.client.send_all(wire)
            assert await h.read_until_closed() == b""
    assert h.reason == "protocol_error"
    assert h.conn.outcome.error


async def test_truncated_frame_then_close() -> None:
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            h = Harness()
            await h.run(nursery)
            await h.client.send_all(encode_frame(opaque_request(1))[:-3])
            await h.client.send_eof()
            assert await h.read_until_closed() == b""
    assert h.reason == "protocol_error" and "TruncatedFrame" in (h.conn.outcome.error or "")


async def test_oversized_response_from_upstream_closes_the_client() -> None:
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            client, proxy_client_side = trio.testing.memory_stream_pair()
            proxy_upstream_side, broker = trio.testing.memory_stream_pair()
            conn = Connection(
                proxy_client_side, proxy_upstream_side, Relay(resolve), max_frame_bytes=1024
            )
            reason: list[str] = []

            async def run_conn() -> None:
                reason.append(await conn.run())
                await trio.aclose_forcefully(proxy_client_side)

            nursery.start_soon(run_conn)
            await client.send_all(encode_frame(opaque_request(9)))
            await broker.receive_some(4096)
            await broker.send_all(struct.pack(">i", 1 << 30))
            assert await client.receive_some(4096) == b""
    assert reason == ["protocol_error"]


async def test_upstream_drop_closes_the_client() -> None:
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            h = Harness()
            await h.run(nursery)
            await h.client.send_all(encode_frame(opaque_request(3)))
            await h.read_responses(1)
            await h.broker.aclose()
            assert await h.read_until_closed() == b""
    assert h.reason in ("upstream_closed", "io_error")
