import dataclasses
import types

import pytest
from support.fetch_model import make_request, schema, topic_name_or_id

from proxy.protocol import codec
from proxy.shaping.limits import (
    INT32_MAX,
    InvalidLimits,
    Limits,
    ResponseLimits,
    clamp_request,
    client_max_records,
    response_limits,
)

VERSIONS = range(4, 19)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_response_bytes": 0},
        {"max_partition_bytes": -1},
        {"max_records": INT32_MAX + 1},
        {"max_partition_records": True},
        {"max_records": 1.5},
        {"max_response_bytes": "10"},
    ],
)
def test_invalid_limits_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidLimits):
        Limits(**kwargs)  # type: ignore[arg-type]


def test_limits_defaults_unlimited() -> None:
    assert Limits().unlimited
    a = Limits(max_response_bytes=100, max_records=5)
    assert not a.unlimited and a.as_dict()["max_records"] == 5


@pytest.mark.parametrize("version", VERSIONS)
def test_no_fetch_version_in_kio_has_max_records(version: int) -> None:
    # KIP-1199 is a draft: the clamp relies on configuration only (see limits.py).
    names = {f.name for f in dataclasses.fields(schema(version, "request").FetchRequest)}
    assert "max_records" not in names
    assert client_max_records(make_request(version, {0: (0, 100)})) is None


def test_client_max_records_is_honoured_when_a_version_carries_it() -> None:
    req = types.SimpleNamespace(max_bytes=1000, max_records=7, topics=())
    assert client_max_records(req) == 7
    assert response_limits(Limits(max_records=10), req).response_records == 7
    assert response_limits(Limits(max_records=3), req).response_records == 3
    assert client_max_records(types.SimpleNamespace(max_records=0)) is None


@pytest.mark.parametrize("version", VERSIONS)
def test_clamp_request_every_version_round_trips(version: int) -> None:
    req = make_request(version, {0: (5, 1000), 1: (9, 50)}, max_bytes=5000)
    out = clamp_request(req, Limits(max_response_bytes=3000, max_partition_bytes=100))
    assert out.max_bytes == 3000
    assert [p.partition_max_bytes for p in out.topics[0].partitions] == [100, 50]
    assert [p.fetch_offset for p in out.topics[0].partitions] == [5, 9]
    _header, decoded = codec.decode_request(codec.encode_request(out, 7, "c"))
    assert decoded == out


def test_clamp_keeps_the_smaller_client_values_and_identity() -> None:
    req = make_request(12, {0: (0, 10)}, max_bytes=20)
    assert clamp_request(req, Limits(max_response_bytes=30, max_partition_bytes=15)) is req
    assert clamp_request(req, Limits()) is req


def test_clamp_budget_cap() -> None:
    req = make_request(12, {0: (0, 10)}, max_bytes=2000)
    assert clamp_request(req, Limits(max_response_bytes=1500), max_bytes_cap=700).max_bytes == 700
    assert clamp_request(req, Limits(), max_bytes_cap=5000).max_bytes == 2000
    with pytest.raises(ValueError):
        clamp_request(req, Limits(), max_bytes_cap=-1)


def test_response_limits_fold_client_and_session_values() -> None:
    req = make_request(13, {0: (0, 500), 1: (0, 50)}, max_bytes=1000)
    tk = topic_name_or_id(13)
    rl = response_limits(
        Limits(max_response_bytes=800, max_partition_bytes=100, max_partition_records=3),
        req,
        session_partition_max_bytes={(tk, 2): 20, (tk, 0): 1},
    )
    assert rl.response_bytes == 800
    assert rl.bytes_for((tk, 0)) == 100  # request value (500) replaces the session's, cap 100
    assert rl.bytes_for((tk, 1)) == 50
    assert rl.bytes_for((tk, 2)) == 20  # only in the session
    assert rl.bytes_for((tk, 3)) == 100  # unknown: the configured cap
    assert rl.partition_records == 3
    assert ResponseLimits().bytes_for((tk, 0)) is None
