"""Whatever a client sends, a dev-cluster node answers or closes the connection; it never crashes."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.static.primitive import Records
from support.batches import make_batch
from support.dispatch import Harness

from devbroker.outcome import Close, NoReply, Reply, Wait
from devbroker.versions import SUPPORTED
from proxy.protocol import codec

# kio has no strategy for record sets: mix valid batches (to reach the log) with noise.
st.register_type_strategy(
    Records,
    st.one_of(
        st.binary(max_size=80),
        st.builds(make_batch, st.integers(0, 5), st.integers(1, 4)),
    ).map(Records),
)

PAIRS = sorted((k, v) for k, (lo, hi) in SUPPORTED.items() for v in range(lo, hi + 1))


@pytest.mark.parametrize(("api_key", "version"), PAIRS)
# 10 well-formed requests for each of the 147 (api, version) pairs (15 until 2026-11-26: cut
# to keep the suite within 15 minutes, some 15 s of a worker).
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_well_formed_request_gets_an_outcome(
    api_key: int, version: int, data: st.DataObject
) -> None:
    h = Harness(3, {"orders": 4, "t": 1})
    request = data.draw(st.from_type(codec.request_schema(api_key, version)))
    node = data.draw(st.integers(0, 2))
    outcome = h.send(node, request)
    assert isinstance(outcome, Reply | Close | NoReply | Wait)
    if isinstance(outcome, Reply):
        # The response encodes and decodes at the request's version.
        h.decode(outcome, api_key, version)
    if isinstance(outcome, Wait):
        outcome.pending.poll(h.now + 3600)


@settings(max_examples=300, deadline=None)
@given(
    pair=st.sampled_from(PAIRS),
    cid=st.integers(-(2**31), 2**31 - 1),
    body=st.binary(max_size=200),
)
def test_random_bodies_are_answered_or_refused(
    pair: tuple[int, int], cid: int, body: bytes
) -> None:
    h = Harness(3, {"orders": 4})
    api_key, version = pair
    frame = struct.pack(">hhih", api_key, version, cid, 1) + b"c" + body
    outcome = h.send_raw(0, frame)
    assert isinstance(outcome, Reply | Close | NoReply | Wait)


@given(frame=st.binary(max_size=64))
def test_random_frames(frame: bytes) -> None:
    outcome = Harness(1).send_raw(0, frame)
    assert isinstance(outcome, Reply | Close | NoReply | Wait)
