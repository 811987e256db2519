"""The API versions the dev cluster implements, and how it answers ApiVersions.

The ranges are those of Apache Kafka 4.4 (kio's generated schemas, which
follow Kafka's message JSON after KIP-896 removed the oldest versions; Fetch
v18, Produce v13 and ListOffsets v11 included), capped where a newer version
needs semantics the dev cluster does not implement (the differential test,
tests/integration/test_differential.py, lists these gaps against real Kafka):

- InitProducerId v6 (KIP-939 two-phase commit) is left out (Kafka 4.4 advertises v5 too);
- ApiVersions v5 and Produce v0-v2, which Kafka 4.4 advertises, have no kio
  schema (Kafka refuses Produce v0-v2 anyway; it lists them for old librdkafka);
- transactions V2 (KIP-890 part 2) is not implemented: EndTxn v5 (the epoch
  bumped at the end of every transaction, returned in the response),
  TxnOffsetCommit v5+ (kio has no v6 schema either) and AddPartitionsToTxn v4+
  (the brokers' batched verification form).  The dev cluster finalizes no
  features in ApiVersions, so clients use transactions V1 with the versions
  advertised here.  Kafka 4.4 finalizes transaction.version 2 on a fresh
  cluster and then also adds partitions implicitly on transactional Produce
  v12+; the dev cluster answers those TRANSACTION_ABORTABLE unless
  AddPartitionsToTxn added the partition (what V1 clients always do first).

OffsetCommit v10 and OffsetFetch v10 (topics by id, KIP-848 era) are implemented
(:mod:`devbroker.offsets`).

Sans-I/O: no trio here.
"""

from __future__ import annotations

import re
from typing import Any

from kio.schema.errors import ErrorCode

from proxy.protocol import codec
from proxy.protocol.apis import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    API_VERSIONS,
    CREATE_TOPICS,
    DESCRIBE_CLUSTER,
    END_TXN,
    FETCH,
    FIND_COORDINATOR,
    HEARTBEAT,
    INIT_PRODUCER_ID,
    JOIN_GROUP,
    LEAVE_GROUP,
    LIST_OFFSETS,
    METADATA,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    PRODUCE,
    SYNC_GROUP,
    TXN_OFFSET_COMMIT,
)

from .build import build

_CAPS: dict[int, int] = {
    PRODUCE: 13,
    FETCH: 18,
    LIST_OFFSETS: 11,
    METADATA: 13,
    OFFSET_COMMIT: 10,
    OFFSET_FETCH: 10,
    FIND_COORDINATOR: 6,
    JOIN_GROUP: 9,
    HEARTBEAT: 4,
    LEAVE_GROUP: 5,
    SYNC_GROUP: 5,
    API_VERSIONS: 4,
    CREATE_TOPICS: 7,
    INIT_PRODUCER_ID: 5,
    ADD_PARTITIONS_TO_TXN: 3,
    ADD_OFFSETS_TO_TXN: 4,
    END_TXN: 4,
    TXN_OFFSET_COMMIT: 4,
    DESCRIBE_CLUSTER: 2,
}


def _kio_range(api_key: int, cap: int) -> tuple[int, int]:
    known = [v for v in range(cap + 1) if codec.request_schema(api_key, v) is not None]
    if not known:
        raise RuntimeError(f"kio knows no version of api key {api_key}")
    return min(known), max(known)


SUPPORTED: dict[int, tuple[int, int]] = {key: _kio_range(key, cap) for key, cap in _CAPS.items()}
"""api_key -> (min_version, max_version), inclusive."""


def is_supported(api_key: int, version: int) -> bool:
    r = SUPPORTED.get(api_key)
    return r is not None and r[0] <= version <= r[1]


# Kafka's ApiVersionsRequest.isValid pattern for client software name and version (v3+).
_SOFTWARE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


def api_versions_response(version: int, request: Any | None) -> Any:
    """The ApiVersions response for a request at *version* (None: version too new).

    A version we do not support gets a v0 response with UNSUPPORTED_VERSION
    listing only ApiVersions' own range (KIP-511), as Kafka answers.
    """
    if not is_supported(API_VERSIONS, version) or request is None:
        cls = codec.response_schema(API_VERSIONS, 0)
        lo, hi = SUPPORTED[API_VERSIONS]
        return build(
            cls,
            {
                "error_code": ErrorCode.unsupported_version,
                "api_keys": [{"api_key": API_VERSIONS, "min_version": lo, "max_version": hi}],
            },
        )
    cls = codec.response_schema(API_VERSIONS, version)
    error = ErrorCode.none
    if version >= 3 and not (
        _SOFTWARE.fullmatch(request.client_software_name)
        and _SOFTWARE.fullmatch(request.client_software_version)
    ):
        error = ErrorCode.invalid_request
    keys = (
        []
        if error
        else [
            {"api_key": k, "min_version": lo, "max_version": hi}
            for k, (lo, hi) in sorted(SUPPORTED.items())
        ]
    )
    return build(cls, {"error_code": error, "api_keys": keys, "throttle_time": 0})
