"""Address rewriting: each API/version family, NodeEndpoints, unknown tagged fields kept."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import pytest
from kio.schema.describe_cluster.v2 import response as dc2
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v16 import response as f16
from kio.schema.fetch.v17 import response as f17
from kio.schema.find_coordinator.v0 import response as fc0
from kio.schema.find_coordinator.v3 import response as fc3
from kio.schema.find_coordinator.v6 import response as fc6
from kio.schema.metadata.v1 import response as md1
from kio.schema.metadata.v12 import response as md12
from kio.schema.produce.v10 import response as p10
from kio.schema.types import BrokerId
from kio.static.primitive import i8, i32, i32Timedelta, i64

from proxy.protocol import codec, varint
from proxy.protocol.errors import DecodeError, ProtocolError
from proxy.relay import rewrite

ZERO = i32Timedelta.parse(datetime.timedelta(0))
ADDRS = {1: ("proxy.local", 9101), 2: ("proxy.local", 9102), 3: ("proxy.local", 9103)}


def resolve(node_id: int, host: str, port: int) -> tuple[str, int] | None:
    return ADDRS.get(node_id)


def roundtrip(obj: Any, cid: int = 77) -> Any:
    frame = codec.encode_response(obj, cid)
    out = rewrite.rewrite_response(int(obj.__api_key__), int(obj.__version__), frame, resolve)
    got_cid, body = codec.decode_response(int(obj.__api_key__), int(obj.__version__), out)
    assert got_cid == cid
    return body


def metadata_v12(brokers: list[tuple[int, str, int]]) -> md12.MetadataResponse:
    return md12.MetadataResponse(
        throttle_time=ZERO,
        brokers=tuple(
            md12.MetadataResponseBroker(node_id=BrokerId(n), host=h, port=i32(p), rack="r1")
            for n, h, p in brokers
        ),
        cluster_id="c1",
        controller_id=BrokerId(1),
        topics=(
            md12.MetadataResponseTopic(
                error_code=ErrorCode.none,
                name="orders",
                topic_id=uuid.uuid4(),
                is_internal=False,
                partitions=(
                    md12.MetadataResponsePartition(
                        error_code=ErrorCode.none,
                        partition_index=i32(0),
                        leader_id=BrokerId(2),
                        leader_epoch=i32(5),
                        replica_nodes=(BrokerId(2),),
                        isr_nodes=(BrokerId(2),),
                        offline_replicas=(),
                    ),
                ),
                topic_authorized_operations=i32(-2147483648),
            ),
        ),
    )


def test_metadata_v12_brokers_rewritten_node_ids_and_topics_kept() -> None:
    resp = metadata_v12([(1, "kafka-1.internal", 9092), (2, "kafka-2.internal", 9092)])
    body = roundtrip(resp)
    assert [(b.node_id, b.host, b.port, b.rack) for b in body.brokers] == [
        (1, "proxy.local", 9101, "r1"),
        (2, "proxy.local", 9102, "r1"),
    ]
    assert body.topics == resp.topics and body.cluster_id == "c1"


def test_metadata_v1_legacy_strings() -> None:
    resp = md1.MetadataResponse(
        brokers=(
            md1.MetadataResponseBroker(
                node_id=BrokerId(3), host="a-very-long-host-name", port=i32(1), rack=None
            ),
        ),
        controller_id=BrokerId(3),
        topics=(),
    )
    body = roundtrip(resp)
    assert [(b.node_id, b.host, b.port, b.rack) for b in body.brokers] == [
        (3, "proxy.local", 9103, None)
    ]


def test_find_coordinator_v0_and_v3_single_node() -> None:
    v0 = fc0.FindCoordinatorResponse(
        error_code=ErrorCode.none, node_id=BrokerId(2), host="k2", port=i32(9092)
    )
    body0 = roundtrip(v0)
    assert (body0.node_id, body0.host, body0.port) == (2, "proxy.local", 9102)
    v3 = fc3.FindCoordinatorResponse(
        throttle_time=ZERO,
        error_code=ErrorCode.none,
        error_message=None,
        node_id=BrokerId(1),
        host="k1",
        port=i32(9092),
    )
    body3 = roundtrip(v3)
    assert (body3.node_id, body3.host, body3.port) == (1, "proxy.local", 9101)


def test_find_coordinator_error_answer_untouched() -> None:
    v3 = fc3.FindCoordinatorResponse(
        throttle_time=ZERO,
        error_code=ErrorCode.coordinator_not_available,
        error_message="x",
        node_id=BrokerId(-1),
        host="",
        port=i32(-1),
    )
    frame = codec.encode_response(v3, 5)
    assert rewrite.rewrite_response(10, 3, frame, resolve) is frame


def test_find_coordinator_v6_coordinator_list() -> None:
    resp = fc6.FindCoordinatorResponse(
        throttle_time=ZERO,
        coordinators=(
            fc6.Coordinator(
                key="g1",
                node_id=BrokerId(3),
                host="k3",
                port=i32(9092),
                error_code=ErrorCode.none,
                error_message=None,
            ),
            fc6.Coordinator(
                key="g2",
                node_id=BrokerId(-1),
                host="",
                port=i32(-1),
                error_code=ErrorCode.coordinator_not_available,
                error_message="no",
            ),
            fc6.Coordinator(
                key="g3",
                node_id=BrokerId(1),
                host="k1",
                port=i32(9092),
                error_code=ErrorCode.none,
                error_message=None,
            ),
        ),
    )
    body = roundtrip(resp)
    assert [(c.key, c.node_id, c.host, c.port) for c in body.coordinators] == [
        ("g1", 3, "proxy.local", 9103),
        ("g2", -1, "", -1),
        ("g3", 1, "proxy.local", 9101),
    ]


def test_describe_cluster_v2() -> None:
    resp = dc2.DescribeClusterResponse(
        throttle_time=ZERO,
        error_code=ErrorCode.none,
        error_message=None,
        endpoint_type=i8(1),
        cluster_id="c",
        controller_id=BrokerId(2),
        brokers=(
            dc2.DescribeClusterBroker(
                broker_id=BrokerId(2), host="k2", port=i32(1), rack=None, is_fenced=False
            ),
            dc2.DescribeClusterBroker(
                broker_id=BrokerId(1), host="k1", port=i32(2), rack="z", is_fenced=True
            ),
        ),
        cluster_authorized_operations=i32(7),
    )
    body = roundtrip(resp)
    assert [(b.broker_id, b.host, b.port, b.rack, b.is_fenced) for b in body.brokers] == [
        (2, "proxy.local", 9102, None, False),
        (1, "proxy.local", 9101, "z", True),
    ]
    assert body.cluster_authorized_operations == 7


def fetch_response(module: Any, endpoints: tuple[Any, ...]) -> Any:
    part = module.PartitionData(
        partition_index=i32(0),
        error_code=ErrorCode.not_leader_or_follower,
        high_watermark=i64(-1),
        current_leader=module.LeaderIdAndEpoch(leader_id=BrokerId(3), leader_epoch=i32(4)),
        aborted_transactions=None,
        records=b"\x00" * 70,
    )
    return module.FetchResponse(
        throttle_time=ZERO,
        error_code=ErrorCode.none,
        session_id=i32(0),
        responses=(module.FetchableTopicResponse(topic_id=uuid.uuid4(), partitions=(part,)),),
        node_endpoints=endpoints,
    )


@pytest.mark.parametrize("module", [f16, f17])
def test_fetch_node_endpoints_rewritten(module: Any) -> None:
    resp = fetch_response(
        module, (module.NodeEndpoint(node_id=BrokerId(3), host="k3", port=i32(9092), rack="r"),)
    )
    body = roundtrip(resp)
    assert [(e.node_id, e.host, e.port, e.rack) for e in body.node_endpoints] == [
        (3, "proxy.local", 9103, "r")
    ]
    assert body.responses == resp.responses  # records and CurrentLeader untouched


def test_fetch_without_endpoints_is_the_same_object() -> None:
    frame = codec.encode_response(fetch_response(f16, ()), 9)
    assert rewrite.rewrite_response(1, 16, frame, resolve) is frame


def test_fetch_before_v16_not_walked() -> None:
    garbage = b"\x00\x00\x00\x09" + b"\xff" * 3
    assert rewrite.rewrite_response(1, 15, garbage, resolve) is garbage


def test_produce_v10_node_endpoints() -> None:
    resp = p10.ProduceResponse(
        responses=(
            p10.TopicProduceResponse(
                name="t",
                partition_responses=(
                    p10.PartitionProduceResponse(
                        index=i32(0),
                        error_code=ErrorCode.not_leader_or_follower,
                        base_offset=i64(-1),
                        log_append_time=None,
                        record_errors=(),
                        current_leader=p10.LeaderIdAndEpoch(
                            leader_id=BrokerId(2), leader_epoch=i32(1)
                        ),
                    ),
                ),
            ),
        ),
        throttle_time=ZERO,
        node_endpoints=(
            p10.NodeEndpoint(node_id=BrokerId(2), host="k2", port=i32(9092), rack=None),
        ),
    )
    body = roundtrip(resp)
    assert [(e.node_id, e.host, e.port) for e in body.node_endpoints] == [(2, "proxy.local", 9102)]
    assert body.responses == resp.responses


def inject_tag(frame: bytes, entity_bytes: bytes, tag: bytes) -> bytes:
    """Replace the empty tagged-field section ending ``entity_bytes`` by one unknown tag."""
    assert entity_bytes.endswith(b"\x00") and frame.count(entity_bytes) == 1
    return frame.replace(entity_bytes, entity_bytes[:-1] + b"\x01" + tag)


def test_unknown_tagged_fields_survive_at_every_level() -> None:
    resp = metadata_v12([(1, "kafka-1", 9092)])
    frame = codec.encode_response(resp, 3)
    broker = codec.encode_body(resp.brokers[0])
    nested = b"\x63\x03abc"  # tag 99, 3 bytes
    top = b"\x64\x02zz"  # tag 100, 2 bytes
    frame = inject_tag(frame, broker, nested)
    assert frame.endswith(b"\x00")
    frame = frame[:-1] + b"\x01" + top
    with pytest.raises(DecodeError):  # kio itself refuses unknown tags
        codec.decode_response(3, 12, frame)
    out = rewrite.rewrite_response(3, 12, frame, resolve)
    assert out.endswith(b"\x01" + top)
    new_broker = codec.encode_body(
        md12.MetadataResponseBroker(
            node_id=BrokerId(1), host="proxy.local", port=i32(9101), rack="r1"
        )
    )
    assert new_broker[:-1] + b"\x01" + nested in out
    # removing the unknown tags again gives exactly what kio would have produced
    clean = out.replace(new_broker[:-1] + b"\x01" + nested, new_broker)[: -1 - len(top)] + b"\x00"
    assert codec.decode_response(3, 12, clean)[1].brokers[0].host == "proxy.local"


def test_endpoint_inside_tagged_field_resizes_the_tag() -> None:
    resp = fetch_response(
        f16, (f16.NodeEndpoint(node_id=BrokerId(1), host="k", port=i32(1), rack=None),)
    )
    frame = codec.encode_response(resp, 1)
    out = rewrite.rewrite_response(1, 16, frame, resolve)
    assert len(out) == len(frame) + len("proxy.local") - 1
    assert codec.decode_response(1, 16, out)[1].node_endpoints[0].host == "proxy.local"


def test_unknown_nodes_are_kept_and_collect_reports_them() -> None:
    resp = metadata_v12([(1, "k1", 1), (42, "k42", 2)])
    frame = codec.encode_response(resp, 1)
    body = codec.decode_response(3, 12, rewrite.rewrite_response(3, 12, frame, resolve))[1]
    assert [(b.host, b.port) for b in body.brokers] == [("proxy.local", 9101), ("k42", 2)]
    assert rewrite.collect_endpoints(3, 12, frame) == {1: ("k1", 1), 42: ("k42", 2)}


@pytest.mark.parametrize("cut", [1, 5, 9, 20])
def test_truncated_response_is_a_protocol_error(cut: int) -> None:
    frame = codec.encode_response(metadata_v12([(1, "k1", 1)]), 1)
    with pytest.raises(ProtocolError):
        rewrite.rewrite_response(3, 12, frame[:-cut], resolve)


def test_trailing_garbage_is_a_protocol_error() -> None:
    frame = codec.encode_response(metadata_v12([(1, "k1", 1)]), 1)
    with pytest.raises(ProtocolError):
        rewrite.rewrite_response(3, 12, frame + b"\x00", resolve)


def test_huge_array_count_rejected_without_allocating() -> None:
    # header v1 (cid + empty tags), throttle, brokers count = 2**28
    frame = b"\x00\x00\x00\x01\x00" + b"\x00\x00\x00\x00" + varint.write_uvarint(2**28)
    with pytest.raises(ProtocolError):
        rewrite.rewrite_response(3, 12, frame, resolve)


def test_huge_primitive_array_count_fails_fast() -> None:
    """A damaged count of an int32 array (replica nodes) is refused, not walked 2**31 times."""
    partition = md1.MetadataResponsePartition(
        error_code=ErrorCode(0), partition_index=0, leader_id=1, replica_nodes=(7,), isr_nodes=(7,)
    )
    obj = md1.MetadataResponse(
        brokers=(md1.MetadataResponseBroker(node_id=1, host="h", port=9, rack=None),),
        controller_id=1,
        topics=(
            md1.MetadataResponseTopic(
                error_code=ErrorCode(0), name="t", is_internal=False, partitions=(partition,)
            ),
        ),
    )
    frame = bytearray(codec.encode_response(obj, 1))
    i = frame.index(bytes.fromhex("00000001 00000007"))  # replica_nodes: count 1, node 7
    frame[i : i + 4] = bytes.fromhex("7fffffff")
    with pytest.raises(DecodeError, match="cannot fit"):
        rewrite.rewrite_response(3, 1, bytes(frame), lambda node, host, port: None)


@pytest.mark.parametrize("module", [f16, f17])
def test_decoded_node_endpoints_rewritten_as_the_bytes_would_be(module: Any) -> None:
    # The fetch path encodes its replies itself: the object rewrite must give the
    # very bytes the frame rewrite gives, and keep unresolved and negative nodes.
    resp = fetch_response(
        module,
        (
            module.NodeEndpoint(node_id=BrokerId(3), host="k3", port=i32(9092), rack="r"),
            module.NodeEndpoint(node_id=BrokerId(42), host="k42", port=i32(1), rack=None),
            module.NodeEndpoint(node_id=BrokerId(-1), host="", port=i32(-1), rack=None),
        ),
    )
    frame = codec.encode_response(resp, 5)
    by_object = codec.encode_response(rewrite.rewrite_node_endpoints(resp, resolve), 5)
    assert by_object == rewrite.rewrite_response(
        1, module.FetchResponse.__version__, frame, resolve
    )
    assert by_object != frame


def test_decoded_without_endpoints_or_changes_is_the_same_object() -> None:
    resp = fetch_response(f16, ())
    assert rewrite.rewrite_node_endpoints(resp, resolve) is resp
    kept = fetch_response(
        f16, (f16.NodeEndpoint(node_id=BrokerId(42), host="k42", port=i32(1), rack=None),)
    )
    assert rewrite.rewrite_node_endpoints(kept, resolve) is kept
    metadata = metadata_v12([(1, "k1", 1)])  # no NodeEndpoints field at all
    assert rewrite.rewrite_node_endpoints(metadata, resolve) is metadata
