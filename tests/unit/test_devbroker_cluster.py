"""The dev cluster's trio edge over loopback: ordering, bad input, long polls, fault hooks."""

from __future__ import annotations

import struct
from typing import Any

import pytest
import structlog
import trio
from kio.schema.errors import ErrorCode as E
from support.batches import make_batch
from support.fetch_messages import fetch_body, partition_body

from devbroker.build import build
from devbroker.cluster import DevCluster
from proxy.protocol import codec
from proxy.protocol.framing import FrameDecoder, encode_frame

TIMEOUT = 10
METADATA, API_VERSIONS, PRODUCE, FETCH = 3, 18, 0, 1


class RawClient:
    """A minimal Kafka client: encodes kio requests, reads responses in order."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder()
        self.cid = 0
        self.sent: list[tuple[int, int, int]] = []

    @classmethod
    async def connect(cls, address: str) -> RawClient:
        host, port = address.rsplit(":", 1)
        return cls(await trio.open_tcp_stream(host, int(port)))

    async def send(self, api_key: int, version: int, data: dict[str, Any]) -> int:
        self.cid += 1
        req = build(codec.request_schema(api_key, version), data)
        await self.stream.send_all(encode_frame(codec.encode_request(req, self.cid, "raw")))
        self.sent.append((api_key, version, self.cid))
        return self.cid

    async def frame(self) -> bytes | None:
        while (frame := self.decoder.next_frame()) is None:
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.decoder.feed(data)
        return frame

    async def recv(self) -> tuple[int, Any]:
        api_key, version, _cid = self.sent.pop(0)
        frame = await self.frame()
        assert frame is not None, "connection closed"
        return codec.decode_response(api_key, version, frame)

    async def call(self, api_key: int, version: int, data: dict[str, Any]) -> Any:
        await self.send(api_key, version, data)
        return (await self.recv())[1]

    async def closed_by_peer(self) -> bool:
        try:
            return await self.frame() is None
        except trio.BrokenResourceError:
            return True

    async def aclose(self) -> None:
        await self.stream.aclose()


METADATA_ALL = {"topics": None, "include_topic_authorized_operations": False}


def fetch_request(
    topic_id: Any, partition: int, *, max_wait: int, session_id: int = 0, epoch: int = -1
) -> dict[str, Any]:
    topic = {"topic_id": topic_id, "partitions": [partition_body(partition, 0, 1 << 20)]}
    return fetch_body(
        [topic], max_wait=max_wait, max_bytes=1 << 20, session_id=session_id, session_epoch=epoch
    )


def produce_request(topic: str, partition: int, data: bytes) -> dict[str, Any]:
    return {
        "transactional_id": None,
        "acks": -1,
        "timeout": 1000,
        "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": data}]}],
    }


async def test_pipelined_requests_are_answered_in_order() -> None:
    with trio.fail_after(TIMEOUT):
        async with DevCluster(nodes=3, topics={"t": 3}) as cluster:
            client = await RawClient.connect(cluster.bootstrap)
            ids = [
                await client.send(METADATA, 12, METADATA_ALL),
                await client.send(
                    API_VERSIONS, 3, {"client_software_name": "raw", "client_software_version": "1"}
                ),
                await client.send(METADATA, 1, {"topics": None}),
            ]
            got = [(await client.recv())[0] for _ in ids]
            assert got == ids
            await client.aclose()


async def test_bad_frames_close_only_that_connection() -> None:
    with structlog.testing.capture_logs() as logs:
        await _bad_frames(logs)
    closed = [(e["reason"], e["error"]) for e in logs if e["event"] == "connection_closed"]
    assert ("protocol_error", "frame of 1000000 bytes exceeds the maximum of 4096 bytes") in closed
    assert ("unsupported_request", "unknown or unsupported api key 4242") in closed
    assert any(
        r == "protocol_error" and e.startswith("cannot decode api key 3 v1") for r, e in closed
    )
    assert all(e["log_level"] == "warning" for e in logs)


async def _bad_frames(logs: list[dict[str, Any]]) -> None:
    with trio.fail_after(TIMEOUT):
        async with DevCluster(nodes=1, max_frame_bytes=4096) as cluster:
            oversized = await RawClient.connect(cluster.bootstrap)
            await oversized.stream.send_all(struct.pack(">i", 1_000_000))
            assert await oversized.closed_by_peer()
            unknown = await RawClient.connect(cluster.bootstrap)
            await unknown.stream.send_all(encode_frame(struct.pack(">hhih", 4242, 0, 1, -1)))
            assert await unknown.closed_by_peer()
            garbage = await RawClient.connect(cluster.bootstrap)
            await garbage.stream.send_all(
                encode_frame(struct.pack(">hhih", METADATA, 1, 1, -1) + b"\xff\xff\xff")
            )
            assert await garbage.closed_by_peer()
            truncated = await RawClient.connect(cluster.bootstrap)
            await truncated.stream.send_all(struct.pack(">i", 100) + b"\x00" * 10)
            await truncated.aclose()
            # Everyone else is still served.
            healthy = await RawClient.connect(cluster.bootstrap)
            assert (await healthy.call(METADATA, 12, METADATA_ALL)).brokers
            # The server notices the truncated stream on its own schedule; no event to await.
            while not any("stream ended inside a frame" in e.get("error", "") for e in logs):
                await trio.testing.wait_all_tasks_blocked()
            for c in (oversized, unknown, garbage, healthy):
                await c.aclose()


@pytest.mark.parametrize("acks", [-1, 0])
async def test_long_poll_fetch_is_woken_by_produce(acks: int) -> None:
    with trio.fail_after(TIMEOUT):
        async with DevCluster(nodes=3, topics={"t": 3}) as cluster:
            leader = cluster.nodes[cluster.leader_of("t", 1)]
            topic_id = cluster.state.topics["t"].topic_id
            fetcher = await RawClient.connect(leader.address)
            producer = await RawClient.connect(leader.address)
            # max_wait is far beyond the test's timeout: only the produce can answer it.
            await fetcher.send(FETCH, 13, fetch_request(topic_id, 1, max_wait=60_000))
            request = produce_request("t", 1, make_batch(0, 4)) | {"acks": acks}
            if acks == 0:
                await producer.send(PRODUCE, 9, request)  # no response to wait for
            else:
                resp = await producer.call(PRODUCE, 9, request)
                assert resp.responses[0].partition_responses[0].error_code == E.none
            _cid, fetched = await fetcher.recv()
            part = fetched.responses[0].partitions[0]
            assert (part.error_code, part.high_watermark) == (E.none, 4)
            assert part.records is not None and len(part.records) == len(make_batch(0, 4))
            await fetcher.aclose()
            await producer.aclose()


async def test_fetch_without_data_answers_after_max_wait() -> None:
    with trio.fail_after(TIMEOUT):
        async with DevCluster(nodes=1, topics={"t": 1}) as cluster:
            client = await RawClient.connect(cluster.bootstrap)
            resp = await client.call(
                FETCH, 13, fetch_request(cluster.state.topics["t"].topic_id, 0, max_wait=50)
            )
            part = resp.responses[0].partitions[0]
            assert (part.error_code, part.high_watermark) == (E.none, 0)
            assert not part.records
            await client.aclose()


async def test_stop_and_restart_a_node_on_the_same_port() -> None:
    with trio.fail_after(TIMEOUT):
        async with DevCluster(nodes=3, topics={"t": 3}) as cluster:
            node1 = cluster.nodes[1]
            port = node1.port
            connected = await RawClient.connect(node1.address)
            await cluster.stop_node(1)
            assert await connected.closed_by_peer()
            with pytest.raises(OSError):
                await trio.open_tcp_stream("127.0.0.1", port)
            other = await RawClient.connect(cluster.nodes[0].address)
            meta = await other.call(METADATA, 12, METADATA_ALL)
            assert sorted(b.node_id for b in meta.brokers) == [0, 2]
            await cluster.restart_node(1)
            assert node1.port == port
            back = await RawClient.connect(node1.address)
            meta = await back.call(METADATA, 12, METADATA_ALL)
            assert sorted(b.node_id for b in meta.brokers) == [0, 1, 2]
            for c in (connected, other, back):
                await c.aclose()


async def test_drop_connections_keeps_the_listener() -> None:
    with trio.fail_after(TIMEOUT):
        async with DevCluster(nodes=2) as cluster:
            a = await RawClient.connect(cluster.nodes[0].address)
            b = await RawClient.connect(cluster.nodes[1].address)
            await a.call(METADATA, 12, METADATA_ALL)
            await b.call(METADATA, 12, METADATA_ALL)
            cluster.drop_connections(0)
            assert await a.closed_by_peer()
            assert (await b.call(METADATA, 12, METADATA_ALL)).brokers
            again = await RawClient.connect(cluster.nodes[0].address)
            assert (await again.call(METADATA, 12, METADATA_ALL)).brokers
            for c in (a, b, again):
                await c.aclose()


async def test_delayed_node_answers_after_an_undelayed_one() -> None:
    order: list[int] = []
    with trio.fail_after(TIMEOUT):
        async with DevCluster(nodes=2) as cluster:
            cluster.set_delay(0, 1.0)
            slow = await RawClient.connect(cluster.nodes[0].address)
            fast = await RawClient.connect(cluster.nodes[1].address)

            async def ask(client: RawClient, node: int) -> None:
                await client.call(METADATA, 12, METADATA_ALL)
                order.append(node)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask, slow, 0)
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(ask, fast, 1)
            await slow.aclose()
            await fast.aclose()
    assert order == [1, 0]


async def test_evicting_fetch_sessions() -> None:
    with trio.fail_after(TIMEOUT):
        async with DevCluster(nodes=1, topics={"t": 1}) as cluster:
            topic_id = cluster.state.topics["t"].topic_id
            client = await RawClient.connect(cluster.bootstrap)
            created = await client.call(
                FETCH, 13, fetch_request(topic_id, 0, max_wait=0, session_id=0, epoch=0)
            )
            assert created.error_code == E.none and created.session_id != 0
            cluster.evict_fetch_sessions()
            inc = fetch_request(topic_id, 0, max_wait=0, session_id=created.session_id, epoch=1)
            inc["topics"] = []
            gone = await client.call(FETCH, 13, inc)
            assert gone.error_code == E.fetch_session_id_not_found
            await client.aclose()


async def test_a_restarted_node_has_forgotten_its_fetch_sessions() -> None:
    with trio.fail_after(TIMEOUT):
        async with DevCluster(nodes=1, topics={"t": 1}) as cluster:
            topic_id = cluster.state.topics["t"].topic_id
            client = await RawClient.connect(cluster.bootstrap)
            created = await client.call(
                FETCH, 13, fetch_request(topic_id, 0, max_wait=0, session_id=0, epoch=0)
            )
            assert created.session_id != 0
            await cluster.stop_node(0)
            await cluster.restart_node(0)
            again = await RawClient.connect(cluster.bootstrap)
            inc = fetch_request(topic_id, 0, max_wait=0, session_id=created.session_id, epoch=1)
            gone = await again.call(FETCH, 13, inc)
            assert gone.error_code == E.fetch_session_id_not_found
            await client.aclose()
            await again.aclose()
