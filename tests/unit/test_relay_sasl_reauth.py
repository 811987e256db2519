"""SASL (re-)authentication in the sans-I/O relay: the proxy's own requests wait for it.

A broker closes the connection when anything but SaslAuthenticate arrives between
a SaslHandshake and the exchange's final SaslAuthenticate response (KIP-368
re-authentication happens on a live connection, under load).  The client sends
nothing else then, but the Fetch path does: a held-back fetch starting, a resend,
its Metadata for topic ids.  Here: client frames into the Relay, the upstream
frames it queues looked at and answered by hand (SASL) or by the dev broker's
dispatcher (Fetch, Metadata).
"""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest
from support.dev_upstream import batch, client_fetch

from devbroker.build import build
from devbroker.fetch import NodeFetcher
from devbroker.membership import GroupCoordinator
from devbroker.node import NodeDispatcher
from devbroker.outcome import Reply, Wait
from devbroker.state import ClusterState
from proxy.config import FetchPathConfig
from proxy.fetchpath import FetchPath
from proxy.protocol import codec
from proxy.protocol.apis import FETCH, METADATA, SASL_AUTHENTICATE, SASL_HANDSHAKE
from proxy.protocol.errors import ProtocolError
from proxy.protocol.framing import payload_bytes
from proxy.relay.relay import ClientRequest, Relay, Upstream
from proxy.sessions.as_broker_cache import FetchSessionCache
from proxy.shaping.limits import Limits

SASL_AUTHENTICATION_FAILED = 58


def resolve(node_id: int, host: str, port: int) -> tuple[str, int] | None:
    return None


def request(api_key: int, version: int, cid: int, **data: Any) -> bytes:
    schema = codec.request_schema(api_key, version)
    assert schema is not None
    return codec.encode_request(build(schema, data), cid, "app")


def handshake(cid: int, mechanism: str) -> bytes:
    return request(SASL_HANDSHAKE, 1, cid, mechanism=mechanism)


def authenticate(cid: int, token: bytes) -> bytes:
    return request(SASL_AUTHENTICATE, 2, cid, auth_bytes=token)


def response(api_key: int, version: int, upstream_frame: bytes, **data: Any) -> bytes:
    """The answer to *upstream_frame* (the relay's correlation id)."""
    schema = codec.response_schema(api_key, version)
    assert schema is not None
    (cid,) = struct.unpack_from(">i", upstream_frame, 4)
    return codec.encode_response(build(schema, data), cid)


def handshake_ok(upstream_frame: bytes) -> bytes:
    return response(SASL_HANDSHAKE, 1, upstream_frame, error_code=0, mechanisms=["PLAIN"])


def authenticate_answer(upstream_frame: bytes, *, lifetime_ms: int = 0, error: int = 0) -> bytes:
    return response(
        SASL_AUTHENTICATE,
        2,
        upstream_frame,
        error_code=error,
        error_message=None,
        auth_bytes=b"server-token",
        session_lifetime_ms=lifetime_ms,
    )


def api_key(frame: bytes) -> int:
    return int(struct.unpack_from(">h", frame)[0])


def fetch_v4(cid: int) -> bytes:
    """A Fetch header (v4, non-flexible) and a body the test handler never decodes."""
    return struct.pack(">hhi", FETCH, 4, cid) + b"\x00\x03app" + b"fetch-body"


class HeldBack:
    """A FetchHandler that holds every fetch back until the test starts it (as the Fetch path
    does while a fetch waits for memory budget or for the connection's previous fetch), and
    sends Metadata of its own (as the Fetch path does for topic ids)."""

    def __init__(self) -> None:
        self.queue: list[ClientRequest] = []
        self.port: Upstream | None = None
        self.metadata_answers: list[bytes] = []

    def handle_fetch(self, request: ClientRequest, upstream: Upstream) -> None:
        self.port = upstream
        self.queue.append(request)

    def observe(self, api_key: int, api_version: int, frame: bytes) -> None:
        return None

    def start(self) -> None:
        assert self.port is not None
        fetch = self.queue.pop(0)
        self.port.send(fetch.frame, api_key=FETCH, api_version=4, on_response=fetch.reply)

    def own_metadata(self) -> None:
        assert self.port is not None
        frame = (
            struct.pack(">hhi", METADATA, 1, 0) + b"\x00\x11kafka-fetch-proxy" + b"\x00\x00\x00\x00"
        )
        self.port.send(
            frame, api_key=METADATA, api_version=1, on_response=self.metadata_answers.append
        )


def echo(frame: bytes) -> bytes:
    """An answer to an opaque upstream request: its correlation id and a marker."""
    return frame[4:8] + b"answer"


def client_cids(relay: Relay) -> list[int]:
    return [codec.peek_correlation_id(payload_bytes(p)) for p in relay.take_client()]


def scram_exchange(relay: Relay, h: bytes, first_cid: int) -> None:
    """The rest of a SCRAM exchange whose SaslHandshake *h* went upstream: the handshake's
    answer, then two SaslAuthenticate round trips, the client sending each only once it
    has the previous answer (as clients do)."""
    relay.upstream_frame(handshake_ok(h))
    assert first_cid - 1 in client_cids(relay)  # the client has the handshake's answer
    relay.client_frame(authenticate(first_cid, b"client-first"))
    [s1] = relay.take_upstream()
    assert api_key(s1) == SASL_AUTHENTICATE
    relay.upstream_frame(authenticate_answer(s1))  # SCRAM's first round trip of two
    assert relay.take_upstream() == [] and relay.sasl.active
    assert client_cids(relay) == [first_cid]
    relay.client_frame(authenticate(first_cid + 1, b"client-final"))
    [s2] = relay.take_upstream()
    relay.upstream_frame(authenticate_answer(s2, lifetime_ms=5000))


def test_a_reauthentication_waits_for_the_fetch_the_proxy_holds_back() -> None:
    """The Java client starts re-authenticating with a fetch in flight; the proxy still holds
    that fetch (budget): it goes first, then the handshake, and the client's order stays."""
    handler = HeldBack()
    relay = Relay(resolve, fetch_handler=handler)
    relay.client_frame(fetch_v4(1))  # held back by the handler
    relay.client_frame(handshake(2, "SCRAM-SHA-512"))
    assert relay.take_upstream() == [], "a fetch started after it would break the exchange"
    assert relay.in_flight == 2

    handler.start()
    [f] = relay.take_upstream()
    assert api_key(f) == FETCH  # the fetch goes before the handshake, as the client sent them
    relay.upstream_frame(echo(f))
    [h] = relay.take_upstream()
    assert api_key(h) == SASL_HANDSHAKE
    assert client_cids(relay) == [1]
    scram_exchange(relay, h, 3)
    assert client_cids(relay) == [4]
    assert not relay.sasl.active and relay.sasl.authentications == 1


def test_requests_the_proxy_makes_during_an_exchange_wait_for_its_final_response() -> None:
    handler = HeldBack()
    relay = Relay(resolve, fetch_handler=handler)
    relay.client_frame(fetch_v4(1))
    handler.start()
    [f] = relay.take_upstream()
    relay.upstream_frame(echo(f))
    assert client_cids(relay) == [1]

    relay.client_frame(handshake(2, "SCRAM-SHA-512"))
    [h] = relay.take_upstream()
    handler.own_metadata()  # e.g. topic ids, between SaslHandshake and SaslAuthenticate
    assert relay.take_upstream() == [], "sent into the broker's authenticator: it closes"
    scram_exchange(relay, h, 3)
    [m] = relay.take_upstream()
    assert api_key(m) == METADATA
    relay.upstream_frame(echo(m))
    assert handler.metadata_answers and client_cids(relay) == [4]


def test_frames_after_a_waiting_handshake_keep_their_order() -> None:
    handler = HeldBack()
    relay = Relay(resolve, fetch_handler=handler)
    relay.client_frame(fetch_v4(1))
    relay.client_frame(handshake(2, "PLAIN"))
    relay.client_frame(authenticate(3, b"\x00alice\x00pw"))  # pipelined (legal, if unusual)
    assert relay.take_upstream() == []
    handler.start()
    [f] = relay.take_upstream()
    relay.upstream_frame(echo(f))
    h, a = relay.take_upstream()
    assert (api_key(h), api_key(a)) == (SASL_HANDSHAKE, SASL_AUTHENTICATE)
    relay.upstream_frame(handshake_ok(h))
    relay.upstream_frame(authenticate_answer(a))
    assert client_cids(relay) == [1, 2, 3]


def _after_one_fetch() -> tuple[HeldBack, Relay]:
    """A relay whose handler has served one fetch (so it has the upstream port)."""
    handler = HeldBack()
    relay = Relay(resolve, fetch_handler=handler)
    relay.client_frame(fetch_v4(1))
    handler.start()
    [f] = relay.take_upstream()
    relay.upstream_frame(echo(f))
    client_cids(relay)
    return handler, relay


def test_one_round_trip_ends_plain_without_a_session_lifetime() -> None:
    handler, relay = _after_one_fetch()
    relay.client_frame(handshake(2, "PLAIN"))
    [h] = relay.take_upstream()
    handler.own_metadata()
    relay.upstream_frame(handshake_ok(h))
    relay.client_frame(authenticate(3, b"\x00alice\x00pw"))
    [s] = relay.take_upstream()
    assert relay.take_upstream() == []
    relay.upstream_frame(authenticate_answer(s))  # no re-authentication configured
    assert [api_key(f) for f in relay.take_upstream()] == [METADATA]
    assert relay.sasl.authentications == 1


def test_a_failed_exchange_releases_what_was_held() -> None:
    handler, relay = _after_one_fetch()
    relay.client_frame(handshake(2, "SCRAM-SHA-256"))
    [h] = relay.take_upstream()
    handler.own_metadata()
    relay.upstream_frame(handshake_ok(h))
    relay.client_frame(authenticate(3, b"client-first"))
    [s] = relay.take_upstream()
    relay.upstream_frame(authenticate_answer(s, error=SASL_AUTHENTICATION_FAILED))
    assert [api_key(f) for f in relay.take_upstream()] == [METADATA]  # the broker closes anyway
    assert not relay.sasl.active and relay.sasl.authentications == 0


def test_a_mechanism_of_unknown_length_ends_at_the_clients_next_request() -> None:
    handler, relay = _after_one_fetch()
    relay.client_frame(handshake(2, "GSSAPI"))
    [h] = relay.take_upstream()
    handler.own_metadata()
    relay.upstream_frame(handshake_ok(h))
    for cid in (3, 4, 5):  # no session lifetime: the broker re-authenticates nobody
        relay.client_frame(authenticate(cid, b"token"))
        [s] = relay.take_upstream()
        relay.upstream_frame(authenticate_answer(s))
        assert relay.take_upstream() == []
    relay.client_frame(request(METADATA, 1, 6, topics=[]))  # the client is done
    frames = relay.take_upstream()
    assert [api_key(f) for f in frames] == [METADATA, METADATA]
    assert b"kafka-fetch-proxy" in frames[0]  # the held one first, then the client's
    assert b"kafka-fetch-proxy" not in frames[1]


def test_each_reauthentication_is_counted() -> None:
    relay = Relay(resolve)
    cid = 0
    for _ in range(3):
        cid += 1
        relay.client_frame(handshake(cid, "SCRAM-SHA-512"))
        [h] = relay.take_upstream()
        relay.upstream_frame(handshake_ok(h))
        for _ in range(2):
            cid += 1
            relay.client_frame(authenticate(cid, b"t"))
            [s] = relay.take_upstream()
            relay.upstream_frame(authenticate_answer(s, lifetime_ms=5000))
    assert (relay.sasl.handshakes, relay.sasl.authentications) == (3, 3)
    assert client_cids(relay) == list(range(1, cid + 1))


# -- the real Fetch path: pipelined fetches, one at a time, and a re-authentication ------


class Broker:
    """The dev broker's sans-I/O dispatcher, answering the proxy's upstream fetches."""

    def __init__(self) -> None:
        self.state = ClusterState("dev", [1])
        self.state.create_topic("orders", 2)
        for p in range(2):
            part = self.state.partition("orders", p)
            assert part is not None
            part.log.append(batch(20), part.leader_epoch)
        self.dispatcher = NodeDispatcher(
            1,
            self.state,
            GroupCoordinator(self.state),
            fetcher=NodeFetcher(1, self.state, FetchSessionCache(rng=random.Random(1))),
        )

    def answer(self, frame: bytes) -> bytes:
        outcome = self.dispatcher.handle(frame)
        if isinstance(outcome, Wait):
            assert outcome.pending.poll(0.0)
            return codec.encode_response(outcome.pending.complete(), outcome.correlation_id)
        assert isinstance(outcome, Reply), outcome
        return codec.encode_response(outcome.response, outcome.correlation_id)


def test_a_reauthentication_waits_for_the_fetch_paths_pipelined_fetches() -> None:
    broker = Broker()
    # No reuse buffer: every fetch goes upstream (held data would answer the second one
    # without a round trip, and this test is about fetches the broker sees).
    path = FetchPath(FetchPathConfig(limits=Limits(max_records=5), reuse_buffer_bytes=0))
    relay = Relay(resolve, fetch_handler=path.handler(1))

    class Up:
        state = broker.state

    parts = [("orders", 0, 0), ("orders", 1, 0)]
    first = codec.encode_request(client_fetch(Up(), 12, parts), 1, "app")  # type: ignore[arg-type]
    second = codec.encode_request(client_fetch(Up(), 12, parts), 2, "app")  # type: ignore[arg-type]
    relay.client_frame(first)
    relay.client_frame(second)  # pipelined: waits until the first is answered
    [f1] = relay.take_upstream()
    assert api_key(f1) == FETCH

    relay.client_frame(handshake(3, "SCRAM-SHA-512"))  # re-authentication begins
    assert relay.take_upstream() == []
    relay.upstream_frame(broker.answer(f1))  # the first is answered: the second starts
    [f2] = relay.take_upstream()
    assert api_key(f2) == FETCH, "the handshake waits for the fetches the client sent before it"
    relay.upstream_frame(broker.answer(f2))
    [h] = relay.take_upstream()
    assert api_key(h) == SASL_HANDSHAKE
    relay.upstream_frame(handshake_ok(h))
    relay.client_frame(authenticate(4, b"client-first"))
    [s1] = relay.take_upstream()
    relay.upstream_frame(authenticate_answer(s1))
    relay.client_frame(authenticate(5, b"client-final"))
    [s2] = relay.take_upstream()
    relay.upstream_frame(authenticate_answer(s2, lifetime_ms=5000))
    assert relay.take_upstream() == []
    out = [payload_bytes(p) for p in relay.take_client()]
    assert [codec.peek_correlation_id(f) for f in out] == [1, 2, 3, 4, 5]
    for frame in out[:2]:
        _, body = codec.decode_response(FETCH, 12, frame)
        assert int(body.error_code) == 0
        records = sum(
            h.records_count
            for t in body.responses
            for p in t.partitions
            for h in _batches(p.records)
        )
        assert records > 0


def _batches(records: Any) -> list[Any]:
    from proxy.protocol.records import iter_batches

    return list(iter_batches(records or b""))


def test_frames_waiting_behind_a_handshake_count_against_max_in_flight() -> None:
    relay = Relay(resolve, fetch_handler=HeldBack(), max_in_flight=3)
    relay.client_frame(fetch_v4(1))
    relay.client_frame(handshake(2, "PLAIN"))
    relay.client_frame(authenticate(3, b"\x00alice\x00pw"))
    assert not relay.can_accept and relay.in_flight == 3
    with pytest.raises(ProtocolError):
        relay.client_frame(authenticate(4, b"more"))


def test_frames_waiting_behind_a_handshake_count_as_held_request_bytes() -> None:
    handler = HeldBack()
    relay = Relay(resolve, fetch_handler=handler)
    relay.client_frame(fetch_v4(1))
    before = relay.held_bytes
    waiting = [handshake(2, "PLAIN"), authenticate(3, b"\x00alice\x00pw")]
    for frame in waiting:
        relay.client_frame(frame)
    assert relay.held_bytes == before + sum(len(f) for f in waiting)
    handler.start()
    [f] = relay.take_upstream()
    relay.upstream_frame(echo(f))
    assert len(relay.take_upstream()) == 2 and relay.held_bytes == 0
