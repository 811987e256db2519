"""The compiled writers (proxy.protocol.writers) write kio's bytes, for every class kio knows.

Random messages of every class are checked in ``test_kio_agreement.py``, which draws each
message once for the writers, readers and walk.
"""

from __future__ import annotations

import io
import uuid
from datetime import timedelta
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from support.kio_agreement import Collect, compiled_bytes, kio_bytes
from support.kio_classes import SCHEMAS, schema_id

from proxy.protocol import writers
from proxy.protocol.messages import make, request_module, response_module


@pytest.mark.parametrize("schema", SCHEMAS, ids=schema_id)
def test_each_class_compiles(schema: type) -> None:
    """Every request and response class (and so every entity they hold) has a writer."""
    assert callable(writers.writer_for(schema))


def _fetch_response(version: int, *, records: Any, tagged: bool) -> Any:
    mod = response_module(1, version)
    extra: dict[str, Any] = {}
    if tagged and hasattr(mod, "LeaderIdAndEpoch"):
        extra["current_leader"] = mod.LeaderIdAndEpoch(leader_id=3, leader_epoch=7)
    pd = make(
        mod.PartitionData,
        partition_index=2,
        error_code=ErrorCode.not_leader_or_follower,
        high_watermark=10,
        last_stable_offset=9,
        log_start_offset=0,
        aborted_transactions=(mod.AbortedTransaction(producer_id=5, first_offset=4),),
        preferred_read_replica=-1,
        records=records,
        **extra,
    )
    ref = uuid.UUID(int=9) if version >= 13 else "orders"
    endpoints = ()
    if tagged and hasattr(mod, "NodeEndpoint"):
        endpoints = (mod.NodeEndpoint(node_id=1, host="h", port=9, rack=None),)
    return make(
        mod.FetchResponse,
        throttle_time=timedelta(milliseconds=5),
        error_code=ErrorCode(0),
        session_id=77,
        responses=(make(mod.FetchableTopicResponse, topic=ref, topic_id=ref, partitions=(pd,)),),
        node_endpoints=endpoints,
    )


@pytest.mark.parametrize("version", range(4, 19))
@pytest.mark.parametrize("tagged", [False, True])
@pytest.mark.parametrize("records", [None, b"", b"\x01" * 300])
def test_fetch_responses_as_kio(version: int, tagged: bool, records: Any) -> None:
    obj = _fetch_response(version, records=records, tagged=tagged)
    assert compiled_bytes(obj) == kio_bytes(obj)


@pytest.mark.parametrize("version", range(4, 19))
def test_fetch_requests_as_kio(version: int) -> None:
    mod = request_module(1, version)
    ref = uuid.UUID(int=9) if version >= 13 else "orders"
    obj = make(
        mod.FetchRequest,
        replica_id=-1,
        max_wait=timedelta(milliseconds=500),
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=1,
        session_id=5,
        session_epoch=3,
        topics=(
            make(
                mod.FetchTopic,
                topic=ref,
                topic_id=ref,
                partitions=(
                    make(
                        mod.FetchPartition,
                        partition=1,
                        fetch_offset=2**40,
                        partition_max_bytes=1000,
                        current_leader_epoch=4,
                        log_start_offset=-1,
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(
            make(mod.ForgottenTopic, topic=ref, topic_id=ref, partitions=(1, 2, 3)),
        )
        if hasattr(mod, "ForgottenTopic")
        else (),
        rack_id="rack-a",
    )
    assert compiled_bytes(obj) == kio_bytes(obj)


def test_records_are_handed_over_as_the_object_held() -> None:
    """What lets the gathered encoding reference a response's records instead of copying."""
    view = memoryview(b"\x07" * 100)[10:90]
    obj = _fetch_response(12, records=view, tagged=False)
    out = Collect()
    writers.encode(obj, out)
    assert any(piece is view for piece in out)


@pytest.mark.parametrize("value", [0, 1, 127, 128, 255, 16383, 16384, 2**31 - 1, 2**35])
def test_uvarint_as_kio(value: int) -> None:
    from kio.serial.writers import write_unsigned_varint

    buffer = io.BytesIO()
    write_unsigned_varint(buffer, value)  # type: ignore[arg-type]
    assert writers.uvarint(value) == buffer.getvalue()


def test_a_null_where_none_is_allowed_fails_as_in_kio() -> None:
    mod = response_module(1, 12)
    obj = mod.FetchableTopicResponse(topic=None, partitions=())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        kio_bytes(obj)
    with pytest.raises(TypeError):
        compiled_bytes(obj)


@pytest.mark.parametrize("version", [11, 12, 13, 16])
def test_a_partition_written_again_is_kio_s_bytes_and_only_small_bytes_are_remembered(
    version: int,
) -> None:
    """The gathered encoding of a Fetch response remembers a small partition entry's bytes
    by the entry itself; written again, they are kio's, and neither records nor a view (it
    would pin its frame) is remembered; what the last two responses did not give is let go."""
    from proxy.protocol import codec

    written = writers.Written()

    def encode(obj: Any) -> bytes:
        gathered = codec.drain(
            codec.encode_response_gathered_in_ranges(
                obj, 7, path=codec.FETCH_RESPONSE_PARTITIONS, every=1, remember=written
            )
        )
        data = b"".join(gathered.parts)
        assert data == codec.encode_response(obj, 7)
        assert data.endswith(kio_bytes(obj))
        return data

    view = memoryview(b"\x07" * 100)[10:10]  # empty, but a view of a larger buffer
    responses = [
        _fetch_response(version, records=records, tagged=False)
        for records in (None, b"", b"\x01" * 300, view)
    ]
    for obj, remembered in zip(responses, (True, True, False, False), strict=True):
        first = encode(obj)
        assert encode(obj) == first  # written from what was remembered
        entry = obj.responses[0].partitions[0]
        kept = {id(e): data for e, data in (*written.now.values(), *written.last.values())}
        assert (id(entry) in kept) == remembered
        assert all(type(d) is bytes and len(d) < writers.WRITTEN_BELOW for d in kept.values())
    # Responses that give other entries: the old ones are let go after two turns.
    for _ in range(2):
        encode(_fetch_response(version, records=b"", tagged=False))
    assert len(written) == 2
    assert all(e is not responses[1].responses[0].partitions[0] for e, _ in written.now.values())
    assert all(e is not responses[1].responses[0].partitions[0] for e, _ in written.last.values())
    # A large entry's records are still handed over as the object held.
    big = responses[2]
    pieces = Collect()
    codec.drain(
        writers.encode_in_ranges(big, pieces, codec.FETCH_RESPONSE_PARTITIONS, 1, remember=written)
    )
    assert any(piece is big.responses[0].partitions[0].records for piece in pieces)


def test_a_turn_while_the_walk_waits_sends_its_later_hits_to_the_new_generation() -> None:
    """The walk reads the remembered entries again after each of its yields: the hits it
    makes after a turn (another response of the connection) go to the new ``now``."""
    from proxy.protocol import codec

    one = _fetch_response(12, records=b"", tagged=False)
    topic = one.responses[0]
    second = make(
        type(topic.partitions[0]),
        **{
            **{
                f: getattr(topic.partitions[0], f)
                for f in (
                    "error_code",
                    "high_watermark",
                    "last_stable_offset",
                    "log_start_offset",
                    "aborted_transactions",
                    "preferred_read_replica",
                    "records",
                )
            },
            "partition_index": 3,
        },
    )
    obj = make(
        type(one), throttle_time=one.throttle_time, error_code=one.error_code,
        session_id=one.session_id, node_endpoints=(),
        responses=(make(type(topic), topic=topic.topic, topic_id=topic.topic, partitions=(topic.partitions[0], second)),),
    )  # fmt: skip
    written = writers.Written()
    codec.drain(writers.encode_in_ranges(obj, Collect(), codec.FETCH_RESPONSE_PARTITIONS, 1, remember=written))  # fmt: skip
    assert id(second) in written.now  # both entries remembered
    pieces = Collect()
    walk = writers.encode_in_ranges(obj, pieces, codec.FETCH_RESPONSE_PARTITIONS, 1, remember=written)  # fmt: skip
    next(walk)  # the first entry is written from memory; the walk waits after it
    written.turn()
    codec.drain(walk)
    assert id(second) in written.now  # found in the last generation, kept in the new one
    assert b"".join(pieces) == kio_bytes(obj)
