"""The upstream fetch session client: each row of its session table, from the client side."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.protocol.error_codes import (
    FETCH_SESSION_ID_NOT_FOUND,
    FETCH_SESSION_TOPIC_ID_ERROR,
    INVALID_FETCH_SESSION_EPOCH,
)
from proxy.protocol.partition_key import PartitionKey
from proxy.protocol.partition_plan import PartitionPlan
from proxy.sessions.as_client_session import (
    FetchSessionClient,
    SessionMetadata,
    SessionStateError,
    Verdict,
)
from proxy.sessions.kip227 import MAX_EPOCH, next_epoch

A0 = ("a", 0)
A1 = ("a", 1)
B0 = ("b", 0)


def params(offset: int = 0, max_bytes: int = 1 << 20, **kw: int) -> PartitionPlan:
    return PartitionPlan(fetch_offset=offset, partition_max_bytes=max_bytes, **kw)


def respond(
    client: FetchSessionClient,
    keys: list[PartitionKey],
    *,
    session_id: int = 0,
    error_code: int = 0,
    throttle: int = 0,
) -> Verdict:
    return client.handle_response(
        error_code=error_code, session_id=session_id, throttle_time_ms=throttle, partitions=keys
    ).verdict


def established(session_id: int = 42) -> FetchSessionClient:
    """A client whose session (A0, A1, B0) has been created."""
    c = FetchSessionClient()
    c.build({A0: params(), A1: params(), B0: params()}, uses_topic_ids=False)
    assert respond(c, [A0, A1, B0], session_id=session_id) is Verdict.OK
    return c


def test_first_request_is_full_initial() -> None:
    c = FetchSessionClient()
    req = c.build({A0: params(5), B0: params(7)}, uses_topic_ids=False)
    assert req.metadata == SessionMetadata(0, 0)
    assert req.is_full
    assert list(req.to_send) == [A0, B0]
    assert req.to_forget == ()


def test_full_response_with_session_id_starts_incremental_at_epoch_one() -> None:
    c = established(42)
    req = c.build({A0: params(), A1: params(), B0: params()}, uses_topic_ids=False)
    assert req.metadata == SessionMetadata(42, 1)
    assert not req.is_full
    assert req.to_send == {} and req.to_forget == ()
    assert req.session_partitions == (A0, A1, B0)


def test_incremental_sends_only_added_and_altered_and_forgets_removed() -> None:
    c = established()
    want = {A0: params(10), B0: params(), ("c", 3): params(1)}
    req = c.build(want, uses_topic_ids=False)
    # Added partitions come first (the broker appends them), then altered ones.
    assert list(req.to_send) == [("c", 3), A0]
    assert req.to_forget == (A1,)
    assert req.session_partitions == (A0, B0, ("c", 3))


@pytest.mark.parametrize(
    "change",
    [
        {"offset": 1},
        {"max_bytes": 5},
        {"log_start_offset": 3},
        {"current_leader_epoch": 2},
        {"last_fetched_epoch": 1},
    ],
)
def test_each_cached_field_makes_a_partition_altered(change: dict[str, int]) -> None:
    c = established()
    req = c.build({A0: params(**change), A1: params(), B0: params()}, uses_topic_ids=False)
    assert list(req.to_send) == [A0]


def test_epoch_increments_per_incremental_response() -> None:
    c = established(9)
    want = {A0: params(), A1: params(), B0: params()}
    for epoch in range(1, 6):
        req = c.build(want, uses_topic_ids=False)
        assert req.metadata == SessionMetadata(9, epoch)
        assert respond(c, [], session_id=9) is Verdict.OK


def test_epoch_wraps_to_one() -> None:
    assert next_epoch(MAX_EPOCH) == 1
    assert next_epoch(0) == 1
    assert next_epoch(-1) == -1
    c = established(9)
    c._next = SessionMetadata(9, MAX_EPOCH)  # fast-forward two billion fetches
    want = {A0: params(), A1: params(), B0: params()}
    assert c.build(want, uses_topic_ids=False).metadata == SessionMetadata(9, MAX_EPOCH)
    respond(c, [], session_id=9)
    assert c.build(want, uses_topic_ids=False).metadata == SessionMetadata(9, 1)


@given(st.integers(min_value=-1, max_value=MAX_EPOCH))
def test_next_epoch_stays_in_range(epoch: int) -> None:
    n = next_epoch(epoch)
    assert n == -1 if epoch == -1 else 1 <= n <= MAX_EPOCH


def test_session_id_not_found_restarts_with_initial() -> None:
    c = established(42)
    c.build({A0: params()}, uses_topic_ids=False)
    assert respond(c, [], error_code=FETCH_SESSION_ID_NOT_FOUND) is Verdict.ERROR
    req = c.build({A0: params()}, uses_topic_ids=False)
    assert req.metadata == SessionMetadata(0, 0)
    assert list(req.to_send) == [A0]


@pytest.mark.parametrize(
    "code", [INVALID_FETCH_SESSION_EPOCH, FETCH_SESSION_TOPIC_ID_ERROR, -1, 29]
)
def test_other_top_level_errors_close_and_recreate_the_session(code: int) -> None:
    c = established(42)
    c.build({A0: params(), A1: params(), B0: params()}, uses_topic_ids=False)
    assert respond(c, [], session_id=42, error_code=code) is Verdict.ERROR
    req = c.build({A0: params(), A1: params(), B0: params()}, uses_topic_ids=False)
    assert req.metadata == SessionMetadata(42, 0)
    assert req.is_full and list(req.to_send) == [A0, A1, B0]


def test_full_response_missing_a_partition_is_invalid_and_restarts() -> None:
    c = FetchSessionClient()
    c.build({A0: params(), A1: params()}, uses_topic_ids=False)
    assert respond(c, [A0], session_id=42) is Verdict.INVALID
    assert c.build({A0: params()}, uses_topic_ids=False).metadata == SessionMetadata(0, 0)


def test_full_response_with_extra_partition_is_invalid() -> None:
    c = FetchSessionClient()
    c.build({A0: params()}, uses_topic_ids=False)
    assert respond(c, [A0, B0], session_id=42) is Verdict.INVALID
    assert c.next_metadata == SessionMetadata(0, 0)


def test_full_response_with_duplicate_partition_is_invalid() -> None:
    c = FetchSessionClient()
    c.build({A0: params(), A1: params()}, uses_topic_ids=False)
    assert respond(c, [A0, A1, A0], session_id=42) is Verdict.INVALID


def test_incremental_response_with_extra_partition_closes_the_session() -> None:
    c = established(42)
    c.build({A0: params()}, uses_topic_ids=False)  # forgets A1, B0
    assert respond(c, [B0], session_id=42) is Verdict.INVALID
    req = c.build({A0: params()}, uses_topic_ids=False)
    assert req.metadata == SessionMetadata(42, 0)


def test_incremental_response_may_omit_partitions() -> None:
    c = established(42)
    c.build({A0: params(), A1: params(), B0: params()}, uses_topic_ids=False)
    assert respond(c, [A1], session_id=42) is Verdict.OK


def test_incremental_response_closing_the_session() -> None:
    c = established(42)
    c.build({}, uses_topic_ids=False)
    assert respond(c, [], session_id=0) is Verdict.OK
    assert c.next_metadata == SessionMetadata(0, 0)


def test_cache_full_falls_back_to_sessionless_then_retries() -> None:
    c = FetchSessionClient(sessionless_backoff=2)
    want = {A0: params()}
    assert c.build(want, uses_topic_ids=False).metadata == SessionMetadata(0, 0)
    assert respond(c, [A0], session_id=0) is Verdict.OK  # no slot for us
    for _ in range(2):
        req = c.build(want, uses_topic_ids=False)
        assert req.metadata == SessionMetadata(0, -1) and req.is_full
        assert respond(c, [A0], session_id=0) is Verdict.OK
    assert c.build(want, uses_topic_ids=False).metadata == SessionMetadata(0, 0)
    assert respond(c, [A0], session_id=77) is Verdict.OK
    assert c.build(want, uses_topic_ids=False).metadata == SessionMetadata(77, 1)


def test_zero_backoff_retries_a_session_every_time_like_kafka() -> None:
    c = FetchSessionClient(sessionless_backoff=0)
    c.build({A0: params()}, uses_topic_ids=False)
    respond(c, [A0], session_id=0)
    assert c.build({A0: params()}, uses_topic_ids=False).metadata == SessionMetadata(0, 0)


def test_throttled_empty_full_response() -> None:
    c = FetchSessionClient()
    c.build({A0: params()}, uses_topic_ids=False)
    assert respond(c, [], throttle=100) is Verdict.THROTTLED
    assert c.next_metadata == SessionMetadata(0, 0)


def test_throttled_empty_incremental_response_is_valid() -> None:
    c = established(42)
    c.build({A0: params(), A1: params(), B0: params()}, uses_topic_ids=False)
    assert respond(c, [], session_id=42, throttle=100) is Verdict.OK
    assert c.next_metadata == SessionMetadata(42, 2)


def test_empty_full_response_without_throttle_is_invalid() -> None:
    c = FetchSessionClient()
    c.build({A0: params()}, uses_topic_ids=False)
    assert respond(c, [], session_id=5) is Verdict.INVALID


def test_send_error_closes_and_recreates() -> None:
    c = established(42)
    c.build({A0: params()}, uses_topic_ids=False)
    c.handle_send_error()
    assert c.in_flight is None
    assert c.build({A0: params()}, uses_topic_ids=False).metadata == SessionMetadata(42, 0)


def test_revoke_last_response() -> None:
    c = established(42)
    c.revoke_last_response("cache gap")
    assert c.build({A0: params()}, uses_topic_ids=False).metadata == SessionMetadata(42, 0)


def test_switching_to_topic_ids_forces_a_full_request() -> None:
    c = established(42)
    tid = uuid.uuid4()
    req = c.build({(tid, 0): params()}, uses_topic_ids=True)
    assert req.metadata == SessionMetadata(42, 0)
    assert req.is_full and req.uses_topic_ids


def test_recreated_topic_id_is_forgotten_and_added() -> None:
    old, new = uuid.uuid4(), uuid.uuid4()
    c = FetchSessionClient()
    c.build({(old, 0): params()}, uses_topic_ids=True)
    respond(c, [(old, 0)], session_id=3)
    req = c.build({(new, 0): params()}, uses_topic_ids=True)
    assert list(req.to_send) == [(new, 0)]
    assert req.to_forget == ((old, 0),)


def test_mismatched_key_type_is_refused() -> None:
    with pytest.raises(ValueError):
        FetchSessionClient().build({A0: params()}, uses_topic_ids=True)


def test_one_request_in_flight() -> None:
    c = FetchSessionClient()
    c.build({A0: params()}, uses_topic_ids=False)
    with pytest.raises(SessionStateError):
        c.build({A0: params()}, uses_topic_ids=False)
    respond(c, [A0])
    with pytest.raises(SessionStateError):
        respond(c, [A0])


def test_without_session_support_every_request_is_sessionless() -> None:
    c = FetchSessionClient()
    for _ in range(3):
        req = c.build({A0: params()}, uses_topic_ids=False, supports_sessions=False)
        assert req.metadata == SessionMetadata(0, -1)
        assert respond(c, [A0]) is Verdict.OK


@st.composite
def wanted_sets(draw: st.DrawFn) -> dict[PartitionKey, PartitionPlan]:
    keys = draw(st.lists(st.sampled_from([A0, A1, B0, ("c", 0)]), unique=True))
    return {k: params(draw(st.integers(0, 3))) for k in keys}


@given(st.lists(wanted_sets(), min_size=1, max_size=8))
def test_broker_view_tracks_the_wanted_set(
    sequence: list[dict[PartitionKey, PartitionPlan]],
) -> None:
    """A model broker applying each request ends with exactly what was wanted, with its params."""
    c = FetchSessionClient()
    broker: dict[PartitionKey, PartitionPlan] = {}
    session_id = 0
    for want in sequence:
        req = c.build(want, uses_topic_ids=False)
        if req.is_full:
            broker = dict(req.to_send)
        else:
            for k, p in req.to_send.items():
                broker[k] = p
            for k in req.to_forget:
                del broker[k]
        assert broker == want
        assert set(req.session_partitions) == set(want)
        if req.is_full:
            session_id = 7
            respond(c, list(broker), session_id=session_id)
        else:
            respond(c, [], session_id=session_id)


def test_an_idle_session_repeats_its_last_request_at_the_next_epoch() -> None:
    c = established(9)
    want = {A0: params(), A1: params(), B0: params()}
    assert c.repeat() is None  # the last request was full: it sent every partition
    c.build(want, uses_topic_ids=False)
    assert respond(c, [], session_id=9) is Verdict.OK
    for epoch in (2, 3):
        req = c.repeat()
        assert req is not None and req.metadata == SessionMetadata(9, epoch)
        assert req.to_send == {} and req.to_forget == ()
        assert req.session_partitions == (A0, A1, B0)
        assert c.repeat() is None  # one request in flight
        assert respond(c, [A1], session_id=9) is Verdict.OK
    # after a request that changed something, or a response that ended the session, none
    c.build({A0: params(3), A1: params(), B0: params()}, uses_topic_ids=False)
    assert respond(c, [], session_id=9) is Verdict.OK
    assert c.repeat() is None
    c.build({A0: params(3), A1: params(), B0: params()}, uses_topic_ids=False)
    assert respond(c, [], session_id=9) is Verdict.OK
    assert c.repeat() is not None
    assert respond(c, [], error_code=FETCH_SESSION_ID_NOT_FOUND) is Verdict.ERROR
    assert c.repeat() is None
