"""The Kafka 4.x protocol through the relay: share groups, the new group protocol, rebootstrap.

Byte level: what the proxy changes (broker host and port) is compared with
kio's encoding of the changed message, and everything else, unknown tagged
fields at every level included, must come out byte for byte.
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
import sys
import uuid
from types import ModuleType
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import request as md12req
from kio.schema.metadata.v13 import response as md13
from kio.schema.types import BrokerId
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

from proxy.protocol import codec
from proxy.protocol.errors import DecodeError, ProtocolError
from proxy.relay import apiversions, endpoints, rewrite
from proxy.relay.relay import PassThroughFetch, Relay, produce_acks
from proxy.sessions.topic_ids import TopicIdMap

ZERO = i32Timedelta.parse(datetime.timedelta(0))
LOCK = i32Timedelta.parse(datetime.timedelta(seconds=30))
ADDRS = {1: ("proxy.local", 9101), 2: ("proxy.local", 9102), 3: ("proxy.local", 9103)}
REBOOTSTRAP_REQUIRED = 129


def resolve(node_id: int, host: str, port: int) -> tuple[str, int] | None:
    return ADDRS.get(node_id)


def response_module(api_key: int, version: int) -> ModuleType:
    schema = codec.response_schema(api_key, version)
    assert schema is not None
    return sys.modules[schema.__module__]


def request_module(api_key: int, version: int) -> ModuleType:
    schema = codec.request_schema(api_key, version)
    assert schema is not None
    return sys.modules[schema.__module__]


def kio_versions(api_key: int) -> list[int]:
    rng = apiversions.kio_range(api_key)
    assert rng is not None
    return list(range(rng[0], rng[1] + 1))


def make(cls: Any, **kwargs: Any) -> Any:
    """*cls* from the keyword arguments it has (versions differ in a few fields)."""
    return cls(**{k: v for k, v in kwargs.items() if k in cls.__dataclass_fields__})


def tagged(encoded: bytes, tag: bytes) -> bytes:
    """An encoded flexible entity with one unknown tagged field instead of none."""
    assert encoded.endswith(b"\x00")
    return encoded[:-1] + b"\x01" + tag


def inject(frame: bytes, entity: Any, tag: bytes) -> bytes:
    encoded = codec.encode_body(entity)
    assert frame.count(encoded) == 1
    return frame.replace(encoded, tagged(encoded, tag))


# --- ShareFetch (78) and ShareAcknowledge (79): NodeEndpoints -----------------------------

TOPIC = uuid.UUID(int=0x1234)
T_PART, T_END, T_TOP, T_TOPIC = b"\x21\x02pp", b"\x22\x03eee", b"\x23\x01t", b"\x24\x02tt"


def endpoints_of(mod: ModuleType) -> tuple[Any, ...]:
    return (
        mod.NodeEndpoint(node_id=BrokerId(2), host="kafka-2.internal", port=i32(9092), rack="a"),
        mod.NodeEndpoint(node_id=BrokerId(42), host="kafka-42", port=i32(9092), rack=None),
        mod.NodeEndpoint(node_id=BrokerId(3), host="k3", port=i32(19092), rack=None),
    )


def share_fetch_response(version: int, nodes: tuple[Any, ...] | None = None) -> Any:
    mod = response_module(78, version)
    part = mod.PartitionData(
        partition_index=i32(0),
        error_code=ErrorCode.not_leader_or_follower,
        error_message="moved",
        acknowledge_error_code=i16(0),
        acknowledge_error_message=None,
        current_leader=mod.LeaderIdAndEpoch(leader_id=i32(2), leader_epoch=i32(7)),
        records=b"\x00" * 61 + b"batch",
        acquired_records=(
            mod.AcquiredRecords(first_offset=i64(10), last_offset=i64(19), delivery_count=i16(1)),
        ),
    )
    return mod.ShareFetchResponse(
        throttle_time=ZERO,
        error_code=ErrorCode.none,
        error_message=None,
        acquisition_lock_timeout=LOCK,
        responses=(mod.ShareFetchableTopicResponse(topic_id=TOPIC, partitions=(part,)),),
        node_endpoints=endpoints_of(mod) if nodes is None else nodes,
    )


def share_acknowledge_response(version: int, nodes: tuple[Any, ...] | None = None) -> Any:
    mod = response_module(79, version)
    part = mod.PartitionData(
        partition_index=i32(0),
        error_code=ErrorCode.not_leader_or_follower,
        error_message=None,
        current_leader=mod.LeaderIdAndEpoch(leader_id=i32(3), leader_epoch=i32(2)),
    )
    return make(
        mod.ShareAcknowledgeResponse,
        throttle_time=ZERO,
        error_code=ErrorCode.none,
        error_message=None,
        acquisition_lock_timeout=LOCK,
        responses=(mod.ShareAcknowledgeTopicResponse(topic_id=TOPIC, partitions=(part,)),),
        node_endpoints=endpoints_of(mod) if nodes is None else nodes,
    )


def resolved(resp: Any) -> Any:
    """kio's view of the rewrite: known nodes point at the proxy, the rest is kept."""
    nodes = tuple(
        dataclasses.replace(e, host=ADDRS[e.node_id][0], port=i32(ADDRS[e.node_id][1]))
        if e.node_id in ADDRS
        else e
        for e in resp.node_endpoints
    )
    return dataclasses.replace(resp, node_endpoints=nodes)


def with_unknown_tags(frame: bytes, resp: Any) -> bytes:
    """*frame* (the encoding of *resp*) with unknown tagged fields at four levels."""
    topic = resp.responses[0]
    frame = inject(frame, topic.partitions[0], T_PART)
    frame = inject(frame, resp.node_endpoints[0], T_END)
    assert frame.endswith(b"\x00")
    frame = frame[:-1] + b"\x01" + T_TOP
    # the topic entity encodes its (already tagged) partition: find it by its tail
    encoded_topic = codec.encode_body(topic)
    head = encoded_topic[: -len(codec.encode_body(topic.partitions[0])) - 1]
    assert frame.count(head) == 1
    start = frame.index(head) + len(head)
    part_len = len(tagged(codec.encode_body(topic.partitions[0]), T_PART))
    end = start + part_len
    assert frame[end : end + 1] == b"\x00"
    return frame[:end] + b"\x01" + T_TOPIC + frame[end + 1 :]


SHARE_CASES = [(78, v, share_fetch_response) for v in kio_versions(78)] + [
    (79, v, share_acknowledge_response) for v in kio_versions(79)
]


@pytest.mark.parametrize(("api_key", "version", "build"), SHARE_CASES)
def test_share_responses_node_endpoints_rewritten_everything_else_byte_identical(
    api_key: int, version: int, build: Any
) -> None:
    resp = build(version)
    frame = with_unknown_tags(codec.encode_response(resp, 31), resp)
    with pytest.raises(DecodeError):  # kio itself refuses the unknown tags
        codec.decode_response(api_key, version, frame)
    out = rewrite.rewrite_response(api_key, version, frame, resolve)
    want = resolved(resp)
    expected = with_unknown_tags(codec.encode_response(want, 31), want)
    assert out == expected
    got = [(e.node_id, e.host, e.port, e.rack) for e in want.node_endpoints]
    assert got == [
        (2, "proxy.local", 9102, "a"),
        (42, "kafka-42", 9092, None),  # not resolved: kept
        (3, "proxy.local", 9103, None),
    ]


@pytest.mark.parametrize(("api_key", "version", "build"), SHARE_CASES)
def test_share_responses_without_endpoints_are_the_same_object(
    api_key: int, version: int, build: Any
) -> None:
    frame = codec.encode_response(build(version, nodes=()), 5)
    assert rewrite.rewrite_response(api_key, version, frame, resolve) is frame
    assert rewrite.collect_endpoints(
        api_key, version, codec.encode_response(build(version), 5)
    ) == {
        2: ("kafka-2.internal", 9092),
        42: ("kafka-42", 9092),
        3: ("k3", 19092),
    }


def share_fetch_request(version: int, epoch: int) -> Any:
    mod = request_module(78, version)
    return mod.ShareFetchRequest(
        group_id="share-g",
        member_id="m-" + "7" * 22,
        share_session_epoch=i32(epoch),
        max_wait=ZERO,
        min_bytes=i32(1),
        max_records=i32(500),
        batch_size=i32(500),
        topics=(
            mod.FetchTopic(
                topic_id=TOPIC,
                partitions=(
                    mod.FetchPartition(
                        partition_index=i32(0),
                        acknowledgement_batches=(
                            mod.AcknowledgementBatch(
                                first_offset=i64(0), last_offset=i64(9), acknowledge_types=(i8(1),)
                            ),
                        ),
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(
            mod.ForgottenTopic(topic_id=uuid.UUID(int=9), partitions=(i32(1),)),
        ),
    )


def upstream_cid(frame: bytes) -> int:
    return int(struct.unpack_from(">i", frame, 4)[0])


@pytest.mark.parametrize("version", kio_versions(78))
def test_share_session_passes_through_the_relay_intact(version: int) -> None:
    """Share session epochs and member ids are broker state: the relay forwards them as sent."""
    relay = Relay(resolve)
    requests = [
        codec.encode_request(share_fetch_request(version, epoch), cid, "share-consumer")
        for cid, epoch in ((10, 0), (11, 1), (12, -1))
    ]
    for r in requests:
        relay.client_frame(r)
    sent = relay.take_upstream()
    assert [f[:4] + f[8:] for f in sent] == [r[:4] + r[8:] for r in requests]
    responses = []
    for n, f in enumerate(sent):
        resp = share_fetch_response(version)
        frame = with_unknown_tags(codec.encode_response(resp, upstream_cid(f)), resp)
        relay.upstream_frame(frame)
        want = resolved(resp)
        responses.append(with_unknown_tags(codec.encode_response(want, 10 + n), want))
    assert relay.take_client() == responses


# --- Produce v13 / Fetch v18 (topic ids, KIP-1166): NodeEndpoints --------------------------


@pytest.mark.parametrize("version", range(10, 14))
def test_produce_node_endpoints_rewritten_up_to_v13(version: int) -> None:
    mod = response_module(0, version)
    topic_ref = {"topic_id": TOPIC} if version >= 13 else {"name": "orders"}
    resp = mod.ProduceResponse(
        responses=(
            mod.TopicProduceResponse(
                **topic_ref,
                partition_responses=(
                    mod.PartitionProduceResponse(
                        index=i32(0),
                        error_code=ErrorCode.not_leader_or_follower,
                        base_offset=i64(-1),
                        log_append_time=None,
                        record_errors=(),
                        current_leader=mod.LeaderIdAndEpoch(
                            leader_id=BrokerId(3), leader_epoch=i32(1)
                        ),
                    ),
                ),
            ),
        ),
        throttle_time=ZERO,
        node_endpoints=(mod.NodeEndpoint(node_id=BrokerId(3), host="k3", port=i32(1), rack="r"),),
    )
    frame = codec.encode_response(resp, 8)
    out = rewrite.rewrite_response(0, version, frame, resolve)
    body = codec.decode_response(0, version, out)[1]
    assert [(e.node_id, e.host, e.port, e.rack) for e in body.node_endpoints] == [
        (3, "proxy.local", 9103, "r")
    ]
    assert body.responses == resp.responses
    # the rewritten frame is kio's encoding of the resolved message, byte for byte
    endpoint = dataclasses.replace(resp.node_endpoints[0], host="proxy.local", port=i32(9103))
    assert out == codec.encode_response(dataclasses.replace(resp, node_endpoints=(endpoint,)), 8)


def test_produce_v13_acks_read_by_the_relay() -> None:
    mod = request_module(0, 13)
    for acks, expects in ((0, False), (1, True), (-1, True)):
        req = mod.ProduceRequest(transactional_id=None, acks=i16(acks), timeout=ZERO, topic_data=())
        frame = codec.encode_request(req, 4, "p")
        header = codec.parse_request_header(frame)
        assert produce_acks(header, frame) == acks
        relay = Relay(resolve)
        relay.client_frame(frame)
        assert (relay.in_flight == 1) is expects


def test_fetch_v18_node_endpoints_inside_the_tagged_section_with_an_unknown_tag() -> None:
    mod = response_module(1, 18)
    resp = mod.FetchResponse(
        throttle_time=ZERO,
        error_code=ErrorCode.none,
        session_id=i32(5),
        responses=(
            mod.FetchableTopicResponse(
                topic_id=TOPIC,
                partitions=(
                    mod.PartitionData(
                        partition_index=i32(0),
                        error_code=ErrorCode.not_leader_or_follower,
                        high_watermark=i64(-1),
                        aborted_transactions=None,
                        current_leader=mod.LeaderIdAndEpoch(
                            leader_id=BrokerId(1), leader_epoch=i32(4)
                        ),
                        records=None,
                    ),
                ),
            ),
        ),
        node_endpoints=(mod.NodeEndpoint(node_id=BrokerId(1), host="k1", port=i32(1), rack=None),),
    )
    frame = codec.encode_response(resp, 3)
    # the top-level tagged section holds NodeEndpoints (tag 0); add tag 9 after it
    value = b"\x02" + codec.encode_body(resp.node_endpoints[0])  # compact array of one
    field = b"\x00" + bytes([len(value)]) + value
    assert frame.endswith(b"\x01" + field)
    extra = b"\x09\x02xy"
    out = rewrite.rewrite_response(
        1, 18, frame[: -len(field) - 1] + b"\x02" + field + extra, resolve
    )
    endpoint = dataclasses.replace(resp.node_endpoints[0], host="proxy.local", port=i32(9101))
    want = codec.encode_response(dataclasses.replace(resp, node_endpoints=(endpoint,)), 3)
    new_value = b"\x02" + codec.encode_body(endpoint)
    new_field = b"\x00" + bytes([len(new_value)]) + new_value
    assert want.endswith(b"\x01" + new_field)
    assert out == want[: -len(new_field) - 1] + b"\x02" + new_field + extra


# --- Metadata v13: KIP-1102's top-level error ---------------------------------------------


def metadata_v13(error: int, brokers: tuple[tuple[int, str, int], ...]) -> md13.MetadataResponse:
    return md13.MetadataResponse(
        throttle_time=ZERO,
        brokers=tuple(
            md13.MetadataResponseBroker(node_id=BrokerId(n), host=h, port=i32(p), rack=None)
            for n, h, p in brokers
        ),
        cluster_id="c1",
        controller_id=BrokerId(-1),
        topics=(),
        error_code=ErrorCode(error),
    )


def test_rebootstrap_required_reaches_the_client_unchanged_except_addresses() -> None:
    with_brokers = metadata_v13(REBOOTSTRAP_REQUIRED, ((1, "k1", 9092), (2, "k2", 9092)))
    frame = codec.encode_response(with_brokers, 6)
    out = rewrite.rewrite_response(3, 13, frame, resolve)
    body = codec.decode_response(3, 13, out)[1]
    assert body.error_code == ErrorCode.rebootstrap_required
    assert out == codec.encode_response(
        metadata_v13(REBOOTSTRAP_REQUIRED, ((1, "proxy.local", 9101), (2, "proxy.local", 9102))), 6
    )
    bare = codec.encode_response(metadata_v13(REBOOTSTRAP_REQUIRED, ()), 6)
    assert rewrite.rewrite_response(3, 13, bare, resolve) is bare


def test_rebootstrap_required_through_the_relay_and_the_topic_id_learner() -> None:
    learnt = TopicIdMap()

    class Observer(PassThroughFetch):
        def observe(self, api_key: int, api_version: int, frame: bytes) -> None:
            learnt.learn_metadata(codec.decode_response(api_key, api_version, frame)[1])

    relay = Relay(resolve, fetch_handler=Observer())
    request = md12req.MetadataRequest(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    frame = codec.encode_request(request, 17, "app")
    relay.client_frame(frame[:2] + struct.pack(">h", 13) + frame[4:])  # v12 and v13 share a layout
    [sent] = relay.take_upstream()
    relay.upstream_frame(
        codec.encode_response(
            metadata_v13(REBOOTSTRAP_REQUIRED, ((2, "k2", 1),)), upstream_cid(sent)
        )
    )
    [out] = relay.take_client()
    assert out == codec.encode_response(
        metadata_v13(REBOOTSTRAP_REQUIRED, ((2, "proxy.local", 9102),)), 17
    )
    assert len(learnt) == 0


def test_a_top_level_metadata_error_teaches_no_topic_ids() -> None:
    mod = response_module(3, 13)
    topic = mod.MetadataResponseTopic(
        error_code=ErrorCode.none,
        name="orders",
        topic_id=TOPIC,
        is_internal=False,
        partitions=(),
        topic_authorized_operations=i32(-2147483648),
    )
    ids = TopicIdMap()
    failed = dataclasses.replace(metadata_v13(REBOOTSTRAP_REQUIRED, ()), topics=(topic,))
    ids.learn_metadata(failed)
    assert ids.id_for("orders") is None
    ids.learn_metadata(dataclasses.replace(failed, error_code=ErrorCode.none))
    assert ids.id_for("orders") == TOPIC


# --- the new group protocol (KIP-848, KIP-932, KIP-1071): pass-through ---------------------

GROUP_APIS = {
    68: "ConsumerGroupHeartbeat",
    69: "ConsumerGroupDescribe",
    76: "ShareGroupHeartbeat",
    77: "ShareGroupDescribe",
    88: "StreamsGroupHeartbeat",
    89: "StreamsGroupDescribe",
    90: "DescribeShareGroupOffsets",
    91: "AlterShareGroupOffsets",
    92: "DeleteShareGroupOffsets",
}


@pytest.mark.parametrize("api_key", sorted(GROUP_APIS))
def test_group_protocol_apis_carry_no_broker_address_and_are_advertised_in_full(
    api_key: int,
) -> None:
    versions = kio_versions(api_key)
    assert codec.response_schema(api_key, versions[0]).__name__.startswith(GROUP_APIS[api_key])
    for v in versions:
        assert endpoints.address_entities(api_key, v) == ()
        assert not rewrite.needs_rewrite(api_key, v) and not endpoints.refused(api_key, v)
    assert apiversions.proxy_range(api_key, (0, 99)) == (versions[0], versions[-1])


@pytest.mark.parametrize("api_key", sorted(GROUP_APIS))
def test_group_protocol_requests_and_responses_relayed_byte_for_byte(api_key: int) -> None:
    version = kio_versions(api_key)[-1]
    relay = Relay(resolve)
    # Opaque to the relay: any body is forwarded, any answer returned, unknown tags and all.
    request = struct.pack(">hhi", api_key, version, 77) + b"\x00\x03app\x00" + b"\x05\x01\x07\x01q"
    relay.client_frame(request)
    [sent] = relay.take_upstream()
    assert sent[:4] + sent[8:] == request[:4] + request[8:]
    body = b"\x00\x00\x00\x00" + b"\x00\x00" + b"\x01\x63\x02zz" + b"streams endpoint 10.0.0.9:8080"
    relay.upstream_frame(struct.pack(">i", upstream_cid(sent)) + b"\x00" + body)
    assert relay.take_client() == [struct.pack(">i", 77) + b"\x00" + body]


def test_streams_application_endpoints_are_not_broker_addresses() -> None:
    for api_key in (88, 89):
        schema = codec.response_schema(api_key, 0)
        seen: dict[type, None] = {}
        endpoints._entities(schema, seen)
        hosts = [c for c in seen if {"host", "port"} <= {f.name for f in dataclasses.fields(c)}]
        assert [c.__name__ for c in hosts] == ["Endpoint"]
        assert (api_key, "Endpoint") in endpoints.APPLICATION_ENDPOINTS


# --- fail closed at the relay ---------------------------------------------------------------


@pytest.mark.parametrize(("api_key", "version"), [(55, 2), (52, 1), (82, 0), (78, 0), (1, 99)])
def test_requests_whose_answers_would_leak_addresses_close_the_connection(
    api_key: int, version: int
) -> None:
    relay = Relay(resolve)
    with pytest.raises(ProtocolError, match="broker addresses"):
        relay.client_frame(struct.pack(">hhi", api_key, version, 1) + b"\x00\x00\x00")
    assert relay.take_upstream() == []


def test_describe_quorum_v1_is_still_relayed() -> None:
    relay = Relay(resolve)
    relay.client_frame(struct.pack(">hhi", 55, 1, 1) + b"\x00\x00\x00\x00")
    assert len(relay.take_upstream()) == 1


def test_a_follower_fetch_v18_passes_through_with_its_high_watermark() -> None:
    """KIP-1166's HighWatermark (tag 1 of FetchPartition) is a follower's: relayed as sent."""
    from proxy.config import FetchPathConfig
    from proxy.fetchpath import FetchPath

    mod = request_module(1, 18)
    request = mod.FetchRequest(
        replica_state=mod.ReplicaState(replica_id=BrokerId(2), replica_epoch=i64(5)),
        max_wait=ZERO,
        min_bytes=i32(1),
        session_id=i32(0),
        session_epoch=i32(-1),
        topics=(
            mod.FetchTopic(
                topic_id=TOPIC,
                partitions=(
                    mod.FetchPartition(
                        partition=i32(0),
                        fetch_offset=i64(40),
                        partition_max_bytes=i32(1 << 20),
                        replica_directory_id=uuid.UUID(int=7),
                        high_watermark=i64(38),
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )
    frame = codec.encode_request(request, 9, "broker-2")
    handler = FetchPath(FetchPathConfig(), shaping=False).handler()
    relay = Relay(resolve, fetch_handler=handler)
    relay.client_frame(frame)
    [sent] = relay.take_upstream()
    assert sent[:4] + sent[8:] == frame[:4] + frame[8:]
    assert codec.decode_request(sent)[1].topics[0].partitions[0].high_watermark == 38
