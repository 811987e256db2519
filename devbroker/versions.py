"""The API versions the dev cluster implements, and how it answers ApiVersions.

The ranges are those of Apache Kafka 4.4 (kio's generated schemas, which
follow Kafka's message JSON after KIP-896 removed the oldest versions; Fetch
v18, Produce v13 and ListOffsets v11 included), capped where a newer version
needs semantics the dev cluster does not implement (the differential test,
tests/integration/test_differential.py, lists these gaps against real Kafka):

- InitProducerId v6 (KIP-939 two-phase commit) is left out (Kafka 4.4 advertises v5 too);
- ApiVersions v5 and Produce v0-v2, which Kafka 4.4 advertises, have no kio
  schema (Kafka refuses Produce v0-v2 anyway; it lists them for old librdkafka);
- TxnOffsetCommit v6 (topics by id) has no kio schema.

Transactions V2 (KIP-890 part 2) are implemented as Kafka 4.4 runs them
(:mod:`devbroker.transactions`): ApiVersions v3+ finalizes the feature
``transaction.version`` = 2, as a fresh Kafka 4.4 cluster does; EndTxn v5 bumps
the epoch at the end of every transaction and returns it; transactional Produce
v12+ and TxnOffsetCommit v5 add their partition to the transaction implicitly;
AddPartitionsToTxn v4+ is the brokers' batched form (verify-only or add, V2).
Kafka 4.4 also finalizes ``group.version`` = 1 (the KIP-848 consumer protocol),
which the dev cluster does not implement and so does not finalize.

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
    ADD_PARTITIONS_TO_TXN: 5,
    ADD_OFFSETS_TO_TXN: 4,
    END_TXN: 5,
    TXN_OFFSET_COMMIT: 6,
    DESCRIBE_CLUSTER: 2,
}


def _kio_range(api_key: int, cap: int) -> tuple[int, int]:
    known = [v for v in range(cap + 1) if codec.request_schema(api_key, v) is not None]
    if not known:
        raise RuntimeError(f"kio knows no version of api key {api_key}")
    return min(known), max(known)


def derive_supported() -> dict[int, tuple[int, int]]:
    """:data:`SUPPORTED` from kio's schemas and the caps above (imports every schema module
    of every version up to its cap: about 1.3 s of CPU, which the start paid before)."""
    return {key: _kio_range(key, cap) for key, cap in _CAPS.items()}


SUPPORTED: dict[int, tuple[int, int]] = {
    PRODUCE: (3, 13),
    FETCH: (4, 18),
    LIST_OFFSETS: (1, 11),
    METADATA: (0, 13),
    OFFSET_COMMIT: (2, 10),
    OFFSET_FETCH: (1, 10),
    FIND_COORDINATOR: (0, 6),
    JOIN_GROUP: (0, 9),
    HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 5),
    SYNC_GROUP: (0, 5),
    API_VERSIONS: (0, 4),
    CREATE_TOPICS: (2, 7),
    INIT_PRODUCER_ID: (0, 5),
    ADD_PARTITIONS_TO_TXN: (0, 5),
    ADD_OFFSETS_TO_TXN: (0, 4),
    END_TXN: (0, 5),
    TXN_OFFSET_COMMIT: (0, 5),
    DESCRIBE_CLUSTER: (0, 2),
}
"""api_key -> (min_version, max_version), inclusive: :func:`derive_supported`'s value, as a
table (tests/unit/test_devbroker_versions.py keeps them equal; its failure shows the new one)."""


def is_supported(api_key: int, version: int) -> bool:
    r = SUPPORTED.get(api_key)
    return r is not None and r[0] <= version <= r[1]


TRANSACTION_VERSION_FEATURE = "transaction.version"
TRANSACTION_VERSION = 2
"""Transactions V2 (KIP-890 part 2), finalized as on a fresh Kafka 4.4 cluster."""
FINALIZED_FEATURES_EPOCH = 1
"""The finalized features' epoch (Kafka's is a metadata offset; clients only compare it)."""


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
    features: dict[str, Any] = {}
    if version >= 3 and not error:
        features = {
            "supported_features": [
                {"name": TRANSACTION_VERSION_FEATURE, "min_version": 0, "max_version": 2}
            ],
            "finalized_features_epoch": FINALIZED_FEATURES_EPOCH,
            "finalized_features": [
                {
                    "name": TRANSACTION_VERSION_FEATURE,
                    "max_version_level": TRANSACTION_VERSION,
                    "min_version_level": TRANSACTION_VERSION,
                }
            ],
        }
    return build(cls, {"error_code": error, "api_keys": keys, "throttle_time": 0} | features)
