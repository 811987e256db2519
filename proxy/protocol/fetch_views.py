"""Decode a Fetch response with its records left as views into the received frame.

kio copies every records field out of the frame, and the frame stays alive
until the response is answered anyway: pointing into it avoids the copies
(a Fetch response's data is then held once, not twice).  The shaping layer
copies what it keeps (``Run.split_view``), so no view outlives the exchange.

:func:`decode_fetch_response` decodes the frame in one validating pass
(:mod:`.readers`) that takes each partition's records as a view of the frame
directly: no check walk, no kio copy, no second pass to replace the copies.
:func:`records_as_views` does the replacement for a response kio already decoded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from typing import Any

from . import codec, readers, walk
from .apis import FETCH
from .errors import DecodeError


def _is_partition_data(cls: type) -> bool:
    return cls.__name__ == "PartitionData"


def decode_fetch_response(version: int, frame: bytes | bytearray) -> Any:
    """The kio FetchResponse in *frame*, its records (when not empty) views of *frame*."""
    _, response = codec.decode_response(FETCH, version, frame, views=readers.FETCH_RECORDS)
    return response


def decode_fetch_response_in_ranges(
    version: int, frame: bytes | bytearray, every: int
) -> Generator[None, None, Any]:
    """``decode_fetch_response``, yielding after every *every* partitions (0: never)."""
    response = yield from codec.decode_response_in_ranges(
        FETCH,
        version,
        frame,
        views=readers.FETCH_RECORDS,
        path=codec.FETCH_RESPONSE_PARTITIONS,
        every=every,
    )
    return response


def records_as_views(response: Any, version: int, frame: bytes) -> Any:
    """*response* (decoded from *frame*) with each partition's records a view of *frame*."""
    schema = codec.response_schema(FETCH, version)
    hv = codec.response_header_version(FETCH, version)
    if schema is None or hv is None:
        return response
    try:
        spans = walk.field_spans(
            schema, frame, codec.response_body_offset(frame, hv), _is_partition_data, "records"
        )
    except DecodeError:
        return response
    return _point_into(response, frame, spans)


def _point_into(response: Any, frame: bytes, spans: list[walk.Span]) -> Any:
    if len(spans) != sum(len(t.partitions) for t in response.responses):
        return response
    view = memoryview(frame)
    ends = iter(end for _, end in spans)
    topics = []
    changed = False
    for topic in response.responses:
        parts = []
        for pd in topic.partitions:
            end = next(ends)
            records = pd.records
            if records:
                pd = dataclasses.replace(pd, records=view[end - len(records) : end])
            parts.append(pd)
        if all(a is b for a, b in zip(parts, topic.partitions, strict=True)):
            topics.append(topic)  # no records here: the entry as kio decoded it
        else:
            changed = True
            topics.append(dataclasses.replace(topic, partitions=tuple(parts)))
    return dataclasses.replace(response, responses=tuple(topics)) if changed else response
