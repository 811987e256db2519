"""Fetch requests and responses for protocol and session tests: built to order, or drawn at random.

    mod = request_module(1, 12)
    part = make(mod.FetchPartition, partition=0, fetch_offset=5, partition_max_bytes=1 << 20)
    fetch_request(12, fetch_topics(12, [("orders", part)]))   # a consumer's sessionless Fetch
    fetch_request(13, topics, session_id=9, session_epoch=2)  # any field told otherwise
    fetch_response(12, [make(mod.FetchableTopicResponse, ..., partitions=(
        partition_data(12, 0, high_watermark=9, records=b"..."),))])

:func:`fetch_request` fills what a Java consumer sends (:data:`CONSUMER_FETCH`: no
replica, ``max_wait`` 0 so an upstream answers at once, sessionless);
:func:`fetch_topics` groups (topic, partition) pairs into a topic per run of one
topic; :func:`partition_data` and :func:`fetch_response` build the answer, a
partition with no error and no records unless told; :func:`fetch_body` and
:func:`partition_body` are the same request as the plain dict ``devbroker.build`` takes.  :func:`random_fetch_messages`
draws a Fetch request or response of any version with Hypothesis (tagged fields,
null records and empty arrays included), with the path of its partitions, under
:data:`RANDOM_FETCH_SETTINGS`; :func:`counted` runs a generator of ranges (the
``*_in_ranges`` walks) to its value and counts its yields.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from datetime import timedelta
from typing import Any, NamedTuple, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from proxy.protocol import codec
from proxy.protocol.messages import make, request_module, response_module

from . import kio_classes  # noqa: F401  (registers the Records strategy)

T = TypeVar("T")

FETCH_VERSIONS = range(4, 18)
"""The Fetch versions the proxy speaks."""

CONSUMER_FETCH: dict[str, Any] = {
    "replica_id": -1,
    "max_wait": timedelta(0),
    "min_bytes": 1,
    "max_bytes": 50 << 20,
    "isolation_level": 0,
    "session_id": 0,
    "session_epoch": -1,
    "forgotten_topics_data": (),
}
"""A consumer's Fetch fields other than its topics: sessionless, answered at once."""

NO_DATA: dict[str, Any] = {
    "error_code": ErrorCode.none,
    "high_watermark": 0,
    "last_stable_offset": -1,
    "log_start_offset": 0,
    "aborted_transactions": (),
    "records": None,
}
"""A Fetch response partition's fields other than its index: no error, no records."""


def fetch_topics(version: int, parts: Iterable[tuple[Any, Any]]) -> tuple[Any, ...]:
    """FetchTopics of (topic, FetchPartition) pairs, one for each run of the same topic.

    The topic (a name, or an id from v13) is given as both ``topic`` and ``topic_id``:
    kio keeps the one its version has."""
    runs: list[tuple[Any, list[Any]]] = []
    for ref, part in parts:
        if runs and runs[-1][0] == ref:
            runs[-1][1].append(part)
        else:
            runs.append((ref, [part]))
    mod = request_module(1, version)
    return tuple(
        make(mod.FetchTopic, topic=ref, topic_id=ref, partitions=tuple(ps)) for ref, ps in runs
    )


def fetch_request(version: int, topics: Iterable[Any], **fields: Any) -> Any:
    """A consumer's Fetch of *topics* at *version*: :data:`CONSUMER_FETCH` but for *fields*."""
    mod = request_module(1, version)
    return make(mod.FetchRequest, **{**CONSUMER_FETCH, "topics": tuple(topics), **fields})


def partition_data(version: int, index: int, **fields: Any) -> Any:
    """A Fetch response's partition *index*: :data:`NO_DATA` but for *fields*."""
    mod = response_module(1, version)
    return make(mod.PartitionData, **{**NO_DATA, "partition_index": index, **fields})


def fetch_response(version: int, topics: Iterable[Any], **fields: Any) -> Any:
    """A Fetch response of *topics* (FetchableTopicResponses): no error, no session, no
    throttle, but for *fields*."""
    mod = response_module(1, version)
    whole = {"throttle_time": timedelta(0), "error_code": ErrorCode.none, "session_id": 0}
    return make(mod.FetchResponse, **{**whole, "responses": tuple(topics), **fields})


def fetch_body(topics: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    """A consumer's Fetch as a plain dict for ``devbroker.build`` (``rawclient.make_request``,
    ``Harness.request``): :data:`CONSUMER_FETCH` but for *fields*, of *topics* (dicts with
    ``topic`` or ``topic_id`` and ``partitions``, see :func:`partition_body`)."""
    return {**CONSUMER_FETCH, "rack_id": "", "topics": topics, **fields}


def partition_body(partition: int, fetch_offset: int, partition_max_bytes: int) -> dict[str, Any]:
    """One partition of :func:`fetch_body`, as a consumer names it (no leader epoch known)."""
    return {
        "partition": partition,
        "current_leader_epoch": -1,
        "fetch_offset": fetch_offset,
        "last_fetched_epoch": -1,
        "log_start_offset": -1,
        "partition_max_bytes": partition_max_bytes,
    }


class RandomFetch(NamedTuple):
    message: Any
    """A kio FetchRequest or FetchResponse."""
    is_response: bool
    path: tuple[str, ...]
    """Where its partitions are (``codec.FETCH_REQUEST_PARTITIONS`` or ``..._RESPONSE_...``)."""


@st.composite
def random_fetch_messages(draw: st.DrawFn) -> RandomFetch:
    """A random Fetch request or response of a version in :data:`FETCH_VERSIONS`."""
    version = draw(st.sampled_from(FETCH_VERSIONS))
    response = draw(st.booleans())
    if response:
        cls = response_module(1, version).FetchResponse
        path = codec.FETCH_RESPONSE_PARTITIONS
    else:
        cls = request_module(1, version).FetchRequest
        path = codec.FETCH_REQUEST_PARTITIONS
    return RandomFetch(draw(st.from_type(cls)), response, path)


RANDOM_FETCH_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
"""For tests over :func:`random_fetch_messages`: reproducible, large messages allowed."""


def counted(ranges: Generator[Any, None, T]) -> tuple[T, int]:
    """(value, yields) of a generator of ranges, run to its end."""
    yields = 0
    while True:
        try:
            next(ranges)
        except StopIteration as done:
            return done.value, yields
        yields += 1
