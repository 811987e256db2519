"""The fetch path's per-partition vocabulary: one key, one plan, one result, one validation.

``proxy.protocol.partition_key`` (the key sessions, shaping and the relay share),
``partition_plan`` (what a Fetch asks of a partition), ``partition_result`` (what an
answer says of it) and ``sessions.client_fetch.ClientFetch.validate`` (whose fetch it
is, read once at decode).
"""

from __future__ import annotations

import sys
import uuid
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from proxy.protocol import partition_result
from proxy.protocol.codec import request_schema, response_schema
from proxy.protocol.messages import make
from proxy.protocol.partition_key import partition_name, topic_key
from proxy.protocol.partition_plan import NO_EPOCH, PartitionPlan, plan_of
from proxy.protocol.partition_result import PartitionResult, result_of
from proxy.sessions.as_broker_cache import TopicIdPartition
from proxy.sessions.client_fetch import ClientFetch, TranslationError

TID = uuid.UUID(int=7)


def _request_mod(version: int) -> Any:
    return sys.modules[request_schema(1, version).__module__]


def _response_mod(version: int) -> Any:
    return sys.modules[response_schema(1, version).__module__]


def _fetch(version: int, **kw: Any) -> Any:
    mod = _request_mod(version)
    fields: dict[str, Any] = {
        "replica_id": -1,
        "max_wait": timedelta(milliseconds=100),
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": (),
        "forgotten_topics_data": (),
        "rack_id": "",
    }
    fields.update(kw)
    if version >= 15:
        fields["replica_state"] = make(
            mod.ReplicaState, replica_id=fields["replica_id"], replica_epoch=-1
        )
    return make(mod.FetchRequest, **fields)


@pytest.mark.parametrize("version", [4, 12, 13, 17])
def test_topic_key_names_a_topic_as_its_version_does(version: int) -> None:
    req, resp = _request_mod(version), _response_mod(version)
    ref: str | uuid.UUID = TID if version >= 13 else "t"
    topic = make(req.FetchTopic, topic=ref, topic_id=ref, partitions=())
    answer = make(resp.FetchableTopicResponse, topic=ref, topic_id=ref, partitions=())
    assert topic_key(topic) == topic_key(answer) == ref
    # a stand-in (tests) is read by its own attributes
    assert topic_key(SimpleNamespace(topic_id=TID)) == TID
    assert topic_key(SimpleNamespace(topic="t")) == "t"


def test_a_key_is_a_plain_tuple_named_like_kafka() -> None:
    key = (TID, 3)
    assert type(key) is tuple and hash(key) == hash((TID, 3))
    assert partition_name(key) == f"{TID}-3" and partition_name(("t", 0)) == "t-0"
    # the broker-side cache keeps id and name; its identity in a session is the key
    assert TopicIdPartition(TID, "t", 3).session_key == key
    assert TopicIdPartition(None, "t", 3).session_key == ("t", 3)


def test_plan_of_reads_any_version_absent_and_empty_epochs_as_minus_one() -> None:
    v4 = make(_request_mod(4).FetchPartition, partition=0, fetch_offset=5, partition_max_bytes=9)
    assert plan_of(v4) == PartitionPlan(5, 9, -1, NO_EPOCH, NO_EPOCH)
    mod = _request_mod(12)
    p = make(
        mod.FetchPartition,
        partition=0,
        fetch_offset=5,
        partition_max_bytes=9,
        log_start_offset=2,
        current_leader_epoch=-5,  # not an epoch: Kafka's Optional is empty below 0
        last_fetched_epoch=4,
    )
    assert plan_of(p) == PartitionPlan(5, 9, 2, NO_EPOCH, 4)


@pytest.mark.parametrize("version", range(4, 19))
def test_plan_of_is_the_same_plan_on_its_fast_path(version: int) -> None:
    """From v9 a request partition carries the epochs and log start offset, from v12 all five
    fields: after the first, plan_of reads them straight (``FROM_V9``, ``_FROM_V12``);
    every version gives the plan the general path gives."""
    from proxy.protocol import partition_plan

    fields = {
        "partition": 0,
        "fetch_offset": 5,
        "partition_max_bytes": 9,
        "log_start_offset": 2,
        "current_leader_epoch": -5,
        "last_fetched_epoch": 4,
    }
    cls = _request_mod(version).FetchPartition
    p = make(cls, **fields)
    expected = PartitionPlan(
        5,
        9,
        2 if version >= 5 else -1,
        NO_EPOCH,
        4 if version >= 12 else NO_EPOCH,
    )
    first, second = plan_of(p), plan_of(make(cls, **{**fields, "current_leader_epoch": 3}))
    assert first == expected and type(first) is PartitionPlan
    assert second == expected._replace(current_leader_epoch=3 if version >= 9 else NO_EPOCH)
    assert type(second) is PartitionPlan
    assert (cls in partition_plan.FROM_V9) == (version >= 9)
    assert (cls in partition_plan._FROM_V12) == (version >= 12)
    assert cls in partition_plan._SEEN
    # anything else than kio's classes keeps the general path (and its int())
    fake = SimpleNamespace(**{**fields, "fetch_offset": True})
    assert plan_of(fake) == (1, 9, 2, NO_EPOCH, 4) and plan_of(fake).fetch_offset is not True
    assert SimpleNamespace not in partition_plan.FROM_V9


def test_result_of_reads_a_partition_of_any_version() -> None:
    v4 = make(
        _response_mod(4).PartitionData,
        partition_index=0,
        error_code=0,
        high_watermark=8,
        last_stable_offset=7,
        aborted_transactions=None,
        records=None,
    )
    assert result_of(v4) == PartitionResult(0, 8, -1, 0, last_stable_offset=7)


@pytest.mark.parametrize("version", [4, 7, 12, 15, 18])
def test_a_consumers_fetch_is_validated_once_and_a_followers_is_not_ours(version: int) -> None:
    consumer = ClientFetch.validate(_fetch(version))
    assert consumer is not None and consumer.version == version and consumer.sessionless
    assert (consumer.session_id, consumer.session_epoch) == (0, -1)
    if version >= 7:
        session = ClientFetch.validate(_fetch(version, session_id=9, session_epoch=3))
        assert session is not None and not session.sessionless
        assert (session.session_id, session.session_epoch) == (9, 3)
    # a follower's (from v15 its replica id is in replica_state) passes through
    assert ClientFetch.validate(_fetch(version, replica_id=2)) is None


def test_anything_but_a_fetch_v4_is_refused() -> None:
    # (kio has no Fetch below v4: stand-ins with a Fetch v3's and a Metadata v12's key)
    v3 = SimpleNamespace(__api_key__=1, __version__=3, replica_id=-1)
    metadata = SimpleNamespace(__api_key__=3, __version__=12)
    for request in (v3, metadata):
        with pytest.raises(TranslationError):
            ClientFetch.validate(request)


@pytest.mark.parametrize("version", [4, 11, 12, 16, 17, 18])
@pytest.mark.parametrize("read_committed", [False, True])
def test_an_empty_entry_is_one_object_per_state_equal_to_the_entry_built_anew(
    version: int, read_committed: bool
) -> None:
    """Held answers and the upstream session's answers share it (``empty_entry``): the same
    object for the same (version, partition, watermarks, isolation), equal to what each of
    them built before, and another object when anything of it differs."""
    mod = _response_mod(version)
    entry = partition_result.empty_entry(mod, 3, 120, 110, 5, read_committed=read_committed)
    assert entry is partition_result.empty_entry(mod, 3, 120, 110, 5, read_committed=read_committed)
    assert entry == make(
        mod.PartitionData,
        partition_index=3,
        error_code=0,
        high_watermark=120,
        last_stable_offset=110,
        log_start_offset=5,
        aborted_transactions=() if read_committed else None,
        preferred_read_replica=-1,
        records=b"",
    )
    # (log_start_offset from v5 on)
    assert result_of(entry) == PartitionResult(0, 120, 5 if version >= 5 else -1, 0, 110, -1, -1)
    others = [
        partition_result.empty_entry(mod, 4, 120, 110, 5, read_committed=read_committed),
        partition_result.empty_entry(mod, 3, 121, 110, 5, read_committed=read_committed),
        partition_result.empty_entry(mod, 3, 120, 111, 5, read_committed=read_committed),
        partition_result.empty_entry(mod, 3, 120, 110, 6, read_committed=read_committed),
        partition_result.empty_entry(mod, 3, 120, 110, 5, read_committed=not read_committed),
        partition_result.empty_entry(
            _response_mod(13 if version != 13 else 12),
            3,
            120,
            110,
            5,
            read_committed=read_committed,
        ),
    ]
    assert all(other is not entry for other in others)


def test_the_empty_entries_kept_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """At ``EMPTY_ENTRIES_MAX`` entries the cache starts over: it never holds more."""
    monkeypatch.setattr(partition_result, "EMPTY_ENTRIES_MAX", 8)
    monkeypatch.setattr(partition_result, "_EMPTY_ENTRIES", {})
    mod = _response_mod(12)
    first = partition_result.empty_entry(mod, 0, 1, 1, 0, read_committed=False)
    for p in range(1, 20):
        partition_result.empty_entry(mod, p, 1, 1, 0, read_committed=False)
        assert len(partition_result._EMPTY_ENTRIES) <= 8
    again = partition_result.empty_entry(mod, 0, 1, 1, 0, read_committed=False)
    assert again == first and again is not first  # built anew after the cache started over
