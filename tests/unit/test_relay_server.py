"""The proxy process over loopback with an in-process dev cluster (no client libraries).

Start-up retries with backoff until the upstream answers; garbage on one
connection closes that connection only; an upstream drop closes the client.
"""

from __future__ import annotations

import datetime
import struct
from typing import Any

import trio
import trio.testing
from kio.schema.api_versions.v0 import request as av0req
from kio.schema.api_versions.v0 import response as av0
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import response as md12
from kio.schema.metadata.v13 import response as md13
from kio.schema.types import BrokerId
from kio.static.primitive import i16, i32, i32Timedelta
from support.dev_proxy import proxy_on_dev_cluster
from support.loopback import API_VERSIONS, METADATA, free_port, request, settings

from devbroker.cluster import DevCluster
from proxy import config
from proxy.protocol import codec
from proxy.protocol.framing import FrameDecoder, encode_frame
from proxy.server.proxy import Proxy


async def test_unreachable_upstream_is_retried_until_it_appears() -> None:
    port = free_port()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            proxy = await nursery.start(Proxy(settings(f"127.0.0.1:{port}")).serve)
            await trio.sleep(0.3)  # several failed attempts with backoff
            ready, checks = proxy.readiness()
            assert not ready and checks["bootstrap_listener_bound"]
            assert not proxy.discovered.is_set()
            async with DevCluster(nodes=1, port=port):
                await proxy.discovered.wait()
                await proxy.wait_ready()
                ready, checks = proxy.readiness()
                assert ready and checks["broker_0_reachable"]
                nursery.cancel_scope.cancel()


async def test_metadata_through_proxy_has_proxy_addresses_and_garbage_does_not_hurt() -> None:
    with trio.fail_after(20):
        async with DevCluster(nodes=3, topics={"t": 3}) as cluster, trio.open_nursery() as nursery:
            proxy = await nursery.start(Proxy(settings(cluster.bootstrap)).serve)
            await proxy.discovered.wait()
            port = proxy.bootstrap.port
            # a garbage connection: closed by the proxy, nothing else affected
            bad = await trio.open_tcp_stream("127.0.0.1", port)
            await bad.send_all(struct.pack(">i", 2**30) + b"junk")
            assert await bad.receive_some(100) == b""
            await bad.aclose()
            # a good connection afterwards
            good = await trio.open_tcp_stream("127.0.0.1", port)
            decoder = FrameDecoder(1 << 24)
            cid, versions = codec.decode_response(18, 3, await request(good, decoder, API_VERSIONS))
            assert cid == 7 and versions.error_code == 0
            cid, body = codec.decode_response(3, 12, await request(good, decoder, METADATA))
            assert cid == 8
            advertised = {(b.host, b.port) for b in body.brokers}
            assert advertised == {proxy.broker_address(n) for n in range(3)}
            assert not advertised & {(n.host, n.port) for n in cluster.nodes}
            # a connection to broker 1's listener
            other = await trio.open_tcp_stream("127.0.0.1", proxy.broker_address(1)[1])
            d1 = FrameDecoder(1 << 24)
            await request(other, d1, API_VERSIONS)
            # an upstream drop closes the client connection (the client reconnects)
            node0 = await trio.open_tcp_stream("127.0.0.1", proxy.broker_address(0)[1])
            d0 = FrameDecoder(1 << 24)
            await request(node0, d0, API_VERSIONS)
            await cluster.stop_node(0)
            assert await node0.receive_some(100) == b""
            await node0.aclose()
            # the bootstrap connection was relayed to node 0 as well: closed too
            assert await good.receive_some(100) == b""
            await good.aclose()
            # connections to other brokers are still served
            cid, _ = codec.decode_response(18, 3, await request(other, d1, API_VERSIONS))
            assert cid == 7
            await other.aclose()
            nursery.cancel_scope.cancel()


class FakeBroker:
    """A one-node upstream that announces whatever brokers the test lists (Metadata v12 only)."""

    def __init__(self, rebootstrap: bool = False) -> None:
        self.extra: list[tuple[int, str, int]] = []
        self.port = 0
        self.rebootstrap = rebootstrap
        """Answer Metadata v13 with KIP-1102's REBOOTSTRAP_REQUIRED and no brokers."""

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._connection, listeners)

    async def _connection(self, stream: trio.SocketStream) -> None:
        decoder = FrameDecoder(1 << 20)
        while data := await stream.receive_some(65536):
            decoder.feed(data)
            for frame in decoder.frames():
                header = codec.parse_request_header(frame)
                if header.api_key == 18:
                    resp: Any = av0.ApiVersionsResponse(
                        error_code=ErrorCode.none,
                        api_keys=(
                            av0.ApiVersion(api_key=i16(18), min_version=i16(0), max_version=i16(3)),
                            av0.ApiVersion(
                                api_key=i16(3),
                                min_version=i16(1),
                                max_version=i16(13 if self.rebootstrap else 12),
                            ),
                        ),
                    )
                    out = codec.encode_response_header(
                        header.correlation_id, 0
                    ) + codec.encode_body(resp)
                elif self.rebootstrap:
                    assert (header.api_key, header.api_version) == (3, 13)
                    resp = md13.MetadataResponse(
                        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
                        brokers=(),
                        cluster_id=None,
                        controller_id=BrokerId(-1),
                        topics=(),
                        error_code=ErrorCode(129),
                    )
                    out = codec.encode_response(resp, header.correlation_id)
                else:
                    assert (header.api_key, header.api_version) == (3, 12)
                    brokers = [(0, "127.0.0.1", self.port), *self.extra]
                    resp = md12.MetadataResponse(
                        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
                        brokers=tuple(
                            md12.MetadataResponseBroker(node_id=BrokerId(n), host=h, port=i32(p))
                            for n, h, p in brokers
                        ),
                        cluster_id="fake",
                        controller_id=BrokerId(0),
                        topics=(),
                    )
                    out = codec.encode_response(resp, header.correlation_id)
                await stream.send_all(encode_frame(out))


async def test_broker_seen_later_gets_a_listener_before_the_client_hears_of_it() -> None:
    explicit = free_port()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            fake = FakeBroker()
            await nursery.start(fake.serve)
            proxy = await nursery.start(
                Proxy(settings(f"127.0.0.1:{fake.port}", broker_ports={"1000": explicit})).serve
            )
            await proxy.discovered.wait()
            assert proxy.broker_address(0) is not None and proxy.broker_address(7) is None
            fake.extra = [(7, "127.0.0.1", fake.port), (1000, "127.0.0.1", fake.port)]
            client = await trio.open_tcp_stream("127.0.0.1", proxy.bootstrap.port)
            decoder = FrameDecoder(1 << 20)
            _, body = codec.decode_response(3, 12, await request(client, decoder, METADATA))
            ports = {b.node_id: b.port for b in body.brokers}
            assert ports[1000] == explicit  # the explicit node-id -> port map
            assert ports[7] == proxy.broker_address(7)[1]
            # the new listener accepted connections before the response reached us
            for node in (7, 1000):
                conn = await trio.open_tcp_stream("127.0.0.1", ports[node])
                ask = codec.encode_request(av0req.ApiVersionsRequest(), 5, "t")
                response = await request(conn, FrameDecoder(1 << 20), ask)
                cid, _ = codec.decode_response(18, 0, response)
                assert cid == 5
                await conn.aclose()
            await client.aclose()
            nursery.cancel_scope.cancel()


async def test_metadata_rebootstrap_error_is_not_a_discovery_the_next_upstream_is_tried() -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            fake = FakeBroker(rebootstrap=True)
            await nursery.start(fake.serve)
            async with DevCluster(nodes=1) as cluster:
                s = config.validate(
                    {
                        "upstream": [f"127.0.0.1:{fake.port}", cluster.bootstrap],
                        "listen": "127.0.0.1:0",
                        "broker_port_base": 0,
                        "connect_timeout_seconds": 2,
                        "retry_backoff_initial_seconds": 0.02,
                        "retry_backoff_max_seconds": 0.1,
                    }
                )
                proxy = await nursery.start(Proxy(s).serve)
                await proxy.discovered.wait()
                # the dev cluster's node 0, not an empty broker list from the fake
                assert proxy.book.upstream == {0: ("127.0.0.1", cluster.nodes[0].port)}
                nursery.cancel_scope.cancel()


async def test_connections_beyond_the_limit_are_closed_at_once() -> None:
    with trio.fail_after(20):
        async with proxy_on_dev_cluster(max_connections=1) as proxy:
            port = proxy.bootstrap.port
            first = await trio.open_tcp_stream("127.0.0.1", port)
            await request(first, FrameDecoder(1 << 20), API_VERSIONS)  # being served
            second = await trio.open_tcp_stream("127.0.0.1", port)
            assert await second.receive_some(100) == b""
            await second.aclose()
            await first.aclose()
            with trio.move_on_after(5):
                while proxy.open_connections:  # the first connection's task notices the close
                    await trio.testing.wait_all_tasks_blocked()
            third = await trio.open_tcp_stream("127.0.0.1", port)
            cid, _ = codec.decode_response(
                18, 3, await request(third, FrameDecoder(1 << 20), API_VERSIONS)
            )
            assert cid == 7
            await third.aclose()


async def test_connection_and_request_metrics() -> None:
    from proxy.observe.metrics import Metrics

    metrics = Metrics()
    value = metrics.registry.get_sample_value
    with trio.fail_after(20):
        async with proxy_on_dev_cluster(metrics=metrics) as proxy:
            conn = await trio.open_tcp_stream("127.0.0.1", proxy.broker_address(0)[1])
            await request(conn, FrameDecoder(1 << 20), API_VERSIONS)
            await conn.aclose()
            with trio.move_on_after(5):
                while proxy.open_connections:
                    await trio.testing.wait_all_tasks_blocked()
    assert value("kafka_fetch_proxy_client_connections_accepted_total") == 1
    assert value("kafka_fetch_proxy_client_connections_closed_total", {"cause": "peer_closed"}) == 1
    assert value("kafka_fetch_proxy_broker_connections_opened_total", {"node": "0"}) == 1
    assert value("kafka_fetch_proxy_client_to_proxy_requests_total", {"api": "api_versions"}) == 1
