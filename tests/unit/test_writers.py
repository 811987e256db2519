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
