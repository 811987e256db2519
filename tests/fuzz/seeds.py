"""The seed corpus of each fuzz target, built at run time from kio (``corpus``), never committed."""

from __future__ import annotations

import random
import struct
import uuid
from datetime import timedelta
from functools import cache

from proxy.protocol import codec, framing
from proxy.protocol.apis import API_VERSIONS, FETCH
from proxy.protocol.messages import make, request_module, response_module

from . import corpus, targets

MIN_CLIENT_FETCH = 4


def fetch_exchange(version: int, rng: random.Random, *, epoch: int = -1) -> tuple[bytes, bytes]:
    """A consumer Fetch request at *version* and an upstream response that answers it."""
    req_mod = request_module(FETCH, version)
    resp_mod = response_module(FETCH, version)
    topics = []
    answers = []
    offset = 0
    for t in range(rng.randint(1, 2)):
        name = f"topic-{t}"
        topic_id = uuid.UUID(int=t + 1)
        parts = []
        data = []
        for p in range(rng.randint(1, 3)):
            parts.append(
                make(
                    req_mod.FetchPartition,
                    partition=p,
                    fetch_offset=offset,
                    partition_max_bytes=1 << 20,
                    log_start_offset=-1,
                    current_leader_epoch=-1,
                    last_fetched_epoch=-1,
                )
            )
            count = rng.randint(1, 3)
            data.append(
                make(
                    resp_mod.PartitionData,
                    partition_index=p,
                    error_code=corpus.ErrorCode(0),
                    high_watermark=offset + 10,
                    last_stable_offset=offset + 10,
                    log_start_offset=0,
                    aborted_transactions=(),
                    preferred_read_replica=-1,
                    records=corpus.record_batch(offset, count)
                    + corpus.record_batch(offset + count, 2),
                )
            )
        topics.append(
            make(req_mod.FetchTopic, topic=name, topic_id=topic_id, partitions=tuple(parts))
        )
        answers.append(
            make(
                resp_mod.FetchableTopicResponse,
                topic=name,
                topic_id=topic_id,
                partitions=tuple(data),
            )
        )
    request = make(
        req_mod.FetchRequest,
        replica_id=-1,
        max_wait=timedelta(milliseconds=500),
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=rng.choice([0, 1]),
        session_id=0,
        session_epoch=epoch,
        topics=tuple(topics),
        forgotten_topics_data=(),
        rack_id="",
    )
    response = make(
        resp_mod.FetchResponse,
        throttle_time=timedelta(0),
        error_code=corpus.ErrorCode(0),
        session_id=rng.choice([0, 7]),
        responses=tuple(answers),
        node_endpoints=(),
    )
    cid = rng.randint(0, 1000)
    return codec.encode_request(request, cid, "fuzz"), codec.encode_response(response, cid)


def _relay_seeds(rng: random.Random) -> list[bytes]:
    out = []
    requests: dict[tuple[int, int], list[bytes]] = {}
    for api_key, version, frame in corpus.encoded_requests(per_version=1):
        requests.setdefault((api_key, version), []).append(frame)
    for api_key, version, frame in corpus.encoded_responses(per_version=1):
        for req in requests.get((api_key, version), ()):
            if api_key == FETCH:
                continue  # random Fetch requests are mostly follower fetches: built below
            out.append(
                bytes([rng.randrange(3)])
                + targets.event(targets.CLIENT, req)
                + targets.event(targets.UPSTREAM, frame)
            )
    fetch_versions = [v for v in corpus.versions(FETCH, response=False) if v >= MIN_CLIENT_FETCH]
    for version in fetch_versions:
        for config in range(3):
            for epoch in (-1, 0):
                if epoch == 0 and version < 7:
                    continue
                req, resp = fetch_exchange(version, rng, epoch=epoch)
                req2, resp2 = fetch_exchange(version, rng, epoch=epoch)
                out.append(
                    bytes([config])
                    + targets.event(targets.CLIENT, req)
                    + targets.event(targets.UPSTREAM, resp)
                    + targets.event(targets.WRITTEN, b"")
                    + targets.event(targets.CLIENT, req2)
                    + targets.event(targets.UPSTREAM, resp2)
                    + targets.event(targets.WRITTEN, b"")
                )
    return out


def _framing_seeds() -> list[bytes]:
    frames = [frame for _, _, frame in corpus.encoded_requests(per_version=1)][:20]
    stream = b"".join(framing.encode_frame(f) for f in frames)
    return [
        bytes([3, 2, 5]) + stream,
        bytes([2, 0, 1]) + stream[:500],
        bytes([0, 0, 0]) + struct.pack(">i", 20) + b"x" * 20,
        bytes([1, 1, 3]) + struct.pack(">i", -1),
        bytes([0, 0, 0]) + struct.pack(">i", 2**31 - 1) + b"abc",
    ]


def _session_seeds(rng: random.Random) -> list[bytes]:
    return [bytes(rng.randrange(256) for _ in range(n)) for n in (8, 32, 64, 128, 256)]


@cache
def seeds(target: str) -> tuple[bytes, ...]:
    """Valid (or nearly valid) inputs that reach deep into *target*."""
    rng = random.Random(1)
    if target == "framing":
        out = _framing_seeds()
    elif target == "request":
        out = [frame for _, _, frame in corpus.encoded_requests()]
    elif target == "response":
        pairs = corpus.response_pairs()
        out = [targets.selector(k, v, pairs) + frame for k, v, frame in corpus.encoded_responses()]
    elif target == "rewrite":
        pairs = corpus.rewritten_pairs()
        out = [
            targets.selector(k, v, pairs) + frame
            for k, v, frame in corpus.encoded_responses()
            if (k, v) in pairs
        ]
        out.append(targets.selector(API_VERSIONS, 3, pairs) + b"\0\0\0\1\0\0")
    elif target == "records":
        out = [corpus.records_value(rng) for _ in range(20)]
        out += [corpus.record_batch(5, 3, b"p" * 20, attributes=a) for a in (0, 0x10, 0x20, 0x07)]
    elif target == "relay":
        out = _relay_seeds(rng)
    else:
        out = _session_seeds(rng)
    return tuple(out)
