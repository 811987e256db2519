"""ApiVersions: upstream ranges intersected with what the proxy can decode."""

from __future__ import annotations

import datetime

from kio.schema.api_versions.v0 import response as av0
from kio.schema.api_versions.v3 import response as av3
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32Timedelta, i64

from proxy.protocol import codec
from proxy.relay import apiversions

ZERO = i32Timedelta.parse(datetime.timedelta(0))


def v3(ranges: dict[int, tuple[int, int]]) -> av3.ApiVersionsResponse:
    return av3.ApiVersionsResponse(
        error_code=ErrorCode.none,
        api_keys=tuple(
            av3.ApiVersion(api_key=i16(k), min_version=i16(lo), max_version=i16(hi))
            for k, (lo, hi) in ranges.items()
        ),
        throttle_time=ZERO,
        finalized_features_epoch=i64(7),
        finalized_features=(
            av3.FinalizedFeatureKey(
                name="metadata.version", max_version_level=i16(21), min_version_level=i16(21)
            ),
        ),
    )


def ranges(body: object) -> dict[int, tuple[int, int]]:
    return {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in body.api_keys}  # type: ignore[attr-defined]


def test_every_api_capped_at_what_kio_knows_unknown_apis_dropped() -> None:
    fetch_max = apiversions.kio_range(1)
    commit_max = apiversions.kio_range(8)
    assert fetch_max is not None and commit_max is not None
    upstream = {
        0: (3, 99),  # Produce: capped at kio
        1: (4, fetch_max[1] + 5),  # Fetch: capped
        3: (0, 12),  # Metadata: within kio, unchanged
        8: (2, 42),  # OffsetCommit: relayed opaque, yet capped (a newer version may add addresses)
        1000: (0, 3),  # an API kio has never heard of: not advertised
        18: (0, 4),
    }
    frame = codec.encode_response(v3(upstream), 11)
    out = apiversions.rewrite_api_versions(3, frame)
    cid, body = codec.decode_response(18, 3, out)
    got = ranges(body)
    assert cid == 11
    assert got[0] == (3, apiversions.kio_range(0)[1])  # type: ignore[index]
    assert got[1] == (4, fetch_max[1])
    assert got[3] == (0, 12) and got[8] == (2, commit_max[1]) and 1000 not in got
    assert (
        body.finalized_features_epoch == 7 and body.finalized_features[0].name == "metadata.version"
    )


def test_describe_quorum_capped_below_its_controller_endpoints() -> None:
    # v2 lists each voter's controller listeners (host, port): never advertised
    frame = codec.encode_response(v3({55: (0, 2), 82: (0, 0), 8: (2, 9)}), 1)
    body = codec.decode_response(18, 3, apiversions.rewrite_api_versions(3, frame))[1]
    assert ranges(body) == {55: (0, 1), 8: (2, 9)}  # UpdateRaftVoter v0 (leader endpoint): gone


def test_empty_intersection_removes_the_api() -> None:
    top = apiversions.kio_range(3)
    assert top is not None
    frame = codec.encode_response(v3({3: (top[1] + 1, top[1] + 3), 8: (2, 9)}), 1)
    body = codec.decode_response(18, 3, apiversions.rewrite_api_versions(3, frame))[1]
    assert ranges(body) == {8: (2, 9)}


def test_within_range_is_unchanged_bytes() -> None:
    frame = codec.encode_response(v3({3: (0, 12), 8: (2, 9)}), 1)
    assert apiversions.rewrite_api_versions(3, frame) is frame


def test_versions_older_than_kio_knows_are_not_offered() -> None:
    # OffsetCommit v0-1 (removed by Kafka 4.0) from a 3.x broker: kio cannot vouch for them
    frame = codec.encode_response(v3({8: (0, 9), 76: (0, 1)}), 1)
    body = codec.decode_response(18, 3, apiversions.rewrite_api_versions(3, frame))[1]
    assert ranges(body) == {8: (2, 9), 76: (1, 1)}  # ShareGroupHeartbeat v0: early access


def test_unsupported_version_answer_in_v0_is_read_as_v0() -> None:
    # a broker answering a too-new ApiVersions request: error 35 in a v0 body
    resp = av0.ApiVersionsResponse(
        error_code=ErrorCode.unsupported_version,
        api_keys=(av0.ApiVersion(api_key=i16(18), min_version=i16(0), max_version=i16(9)),),
    )
    frame = codec.encode_response(resp, 4)
    out = apiversions.rewrite_api_versions(3, frame)
    body = codec.decode_response(18, 0, out)[1]
    assert body.error_code == ErrorCode.unsupported_version
    assert ranges(body) == {18: apiversions.kio_range(18)}


def test_proxy_answers_too_new_api_versions_request() -> None:
    top = apiversions.kio_range(18)
    assert top is not None
    assert apiversions.supports_request_version(top[1])
    assert not apiversions.supports_request_version(top[1] + 1)
    cid, body = codec.decode_response(18, 0, apiversions.unsupported_version_response(123))
    assert cid == 123 and body.error_code == ErrorCode.unsupported_version
    assert ranges(body) == {18: top}


def test_unknown_tags_in_api_versions_survive() -> None:
    frame = codec.encode_response(v3({0: (3, 99)}), 1)
    entry = codec.encode_body(
        av3.ApiVersion(api_key=i16(0), min_version=i16(3), max_version=i16(99))
    )
    tagged = frame.replace(entry, entry[:-1] + b"\x01\x55\x01x")
    out = apiversions.rewrite_api_versions(3, tagged)
    assert b"\x01\x55\x01x" in out
