"""SASL passes through the proxy per connection, unchanged (kcat with SASL/PLAIN).

The dev cluster has no SASL, so the upstream here is a small fake broker that
requires SaslHandshake v1 + SaslAuthenticate (PLAIN) before anything else and
records the tokens it received.
"""

from __future__ import annotations

import datetime
from dataclasses import fields
from typing import Any

import kafka
import pytest
import trio
from kio.schema.errors import ErrorCode
from kio.schema.types import BrokerId
from kio.static.primitive import i16, i32, i32Timedelta, i64Timedelta

from proxy import config
from proxy.protocol import codec
from proxy.protocol.framing import FrameDecoder, encode_frame
from proxy.server.proxy import Proxy

pytestmark = pytest.mark.integration

ZERO = i32Timedelta.parse(datetime.timedelta(0))
SUPPORTED = {18: (0, 3), 17: (0, 1), 36: (0, 2), 3: (1, 12)}


def build(api_key: int, version: int, **values: Any) -> Any:
    schema = codec.response_schema(api_key, version)
    assert schema is not None
    names = {f.name for f in fields(schema)}
    return schema(**{k: v for k, v in values.items() if k in names})


class SaslBroker:
    """``legacy``: SaslHandshake v0 only, then a raw (header-less) PLAIN token exchange."""

    def __init__(self, legacy: bool = False) -> None:
        self.legacy = legacy
        self.supported = dict(SUPPORTED)
        if legacy:
            self.supported[17] = (0, 0)
            del self.supported[36]
        self.port = 0
        self.tokens: list[bytes] = []
        self.refused: list[int] = []

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._connection, listeners)

    def _answer(self, header: codec.RequestHeader, frame: bytes, authenticated: bool) -> Any:
        key, v = header.api_key, header.api_version
        if key == 18:
            mod = __import__(f"kio.schema.api_versions.v{v}.response", fromlist=["ApiVersion"])
            keys = tuple(
                mod.ApiVersion(api_key=i16(k), min_version=i16(lo), max_version=i16(hi))
                for k, (lo, hi) in self.supported.items()
            )
            return build(18, v, error_code=ErrorCode.none, api_keys=keys, throttle_time=ZERO)
        if key == 17:
            return build(17, v, error_code=ErrorCode.none, mechanisms=("PLAIN",))
        if key == 36:
            body = codec.decode_request_body(header, frame)
            self.tokens.append(body.auth_bytes)
            ok = body.auth_bytes == b"\x00alice\x00s3cret"
            return build(
                36,
                v,
                error_code=ErrorCode.none if ok else ErrorCode.sasl_authentication_failed,
                error_message=None if ok else "bad credentials",
                auth_bytes=b"",
                session_lifetime=i64Timedelta.parse(datetime.timedelta(0)),
            )
        if not authenticated:
            self.refused.append(key)
            return None
        assert key == 3
        mod = __import__(f"kio.schema.metadata.v{v}.response", fromlist=["MetadataResponseBroker"])
        broker = mod.MetadataResponseBroker(
            node_id=BrokerId(0), host="127.0.0.1", port=i32(self.port)
        )
        return build(
            3,
            v,
            throttle_time=ZERO,
            brokers=(broker,),
            cluster_id="sasl",
            controller_id=BrokerId(0),
            topics=(),
        )

    async def _connection(self, stream: trio.SocketStream) -> None:
        decoder = FrameDecoder(1 << 20)
        authenticated = False
        raw_token_next = False
        while data := await stream.receive_some(65536):
            decoder.feed(data)
            for frame in decoder.frames():
                if raw_token_next:  # SaslHandshake v0: a bare token, answered by a bare frame
                    raw_token_next = False
                    self.tokens.append(frame)
                    if not frame.endswith(b"\x00alice\x00s3cret"):  # [authzid] NUL user NUL pass
                        await stream.aclose()
                        return
                    authenticated = True
                    await stream.send_all(encode_frame(b""))
                    continue
                header = codec.parse_request_header(frame)
                raw_token_next = header.api_key == 17 and header.api_version == 0
                resp = self._answer(header, frame, authenticated)
                if resp is None:  # Kafka closes unauthenticated connections that skip SASL
                    await stream.aclose()
                    return
                if header.api_key == 36 and resp.error_code == ErrorCode.none:
                    authenticated = True
                if header.api_key == 18:
                    out = codec.encode_response_header(
                        header.correlation_id, 0
                    ) + codec.encode_body(resp)
                else:
                    out = codec.encode_response(resp, header.correlation_id)
                await stream.send_all(encode_frame(out))


async def kcat(*args: str) -> tuple[int, str, str]:
    done = await trio.run_process(
        ["kcat", *args], capture_stdout=True, capture_stderr=True, check=False
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode(errors="replace")


async def test_sasl_plain_passes_through_per_connection() -> None:
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            broker = SaslBroker()
            await nursery.start(broker.serve)
            settings = config.validate(
                {
                    "upstream": [f"127.0.0.1:{broker.port}"],
                    "listen": "127.0.0.1:0",
                    "broker_port_base": 0,
                }
            )
            proxy = await nursery.start(Proxy(settings).serve)
            bootstrap = f"127.0.0.1:{proxy.bootstrap.port}"
            # the proxy's own discovery is refused by this broker (no credentials) ...
            with trio.move_on_after(0.5):
                await proxy.discovered.wait()
            assert broker.refused
            sasl = ["-X", "security.protocol=sasl_plaintext", "-X", "sasl.mechanisms=PLAIN"]
            rc, out, err = await kcat(
                "-b",
                bootstrap,
                *sasl,
                "-X",
                "sasl.username=alice",
                "-X",
                "sasl.password=s3cret",
                "-L",
            )
            # ... but a client's own SASL exchange passes through and its metadata is rewritten
            assert rc == 0, err
            assert f"broker 0 at 127.0.0.1:{proxy.broker_address(0)[1]}" in out
            assert b"\x00alice\x00s3cret" in broker.tokens
            rc, _, err = await kcat(
                "-b",
                bootstrap,
                *sasl,
                "-X",
                "sasl.username=alice",
                "-X",
                "sasl.password=wrong",
                "-L",
                "-m",
                "2",
            )
            assert rc != 0 and "uthentication" in err
            assert b"\x00alice\x00wrong" in broker.tokens
            nursery.cancel_scope.cancel()


async def test_sasl_handshake_v0_raw_tokens_kafka_python() -> None:
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            broker = SaslBroker(legacy=True)
            await nursery.start(broker.serve)
            settings = config.validate(
                {
                    "upstream": [f"127.0.0.1:{broker.port}"],
                    "listen": "127.0.0.1:0",
                    "broker_port_base": 0,
                }
            )
            proxy = await nursery.start(Proxy(settings).serve)
            bootstrap = f"127.0.0.1:{proxy.bootstrap.port}"

            def list_brokers() -> set[tuple[str, int]]:
                consumer = kafka.KafkaConsumer(
                    bootstrap_servers=bootstrap,
                    security_protocol="SASL_PLAINTEXT",
                    sasl_mechanism="PLAIN",
                    sasl_plain_username="alice",
                    sasl_plain_password="s3cret",
                    request_timeout_ms=20000,
                )
                try:
                    consumer.topics()
                    return {(b.host, b.port) for b in consumer._client.cluster.brokers()}
                finally:
                    consumer.close()

            seen = await trio.to_thread.run_sync(list_brokers)
            assert seen == {proxy.broker_address(0)}
            assert b"alice\x00alice\x00s3cret" in broker.tokens  # kafka-python sends an authzid
            nursery.cancel_scope.cancel()
