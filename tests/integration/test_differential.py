"""The dev cluster against real Apache Kafka: the same raw requests, the same answers.

Every scenario runs one request script twice, against a dev cluster and against a
real Kafka 4.x broker, over plain TCP (:mod:`support.rawclient`: kio requests
encoded by the project's codec).  The decoded responses are reduced to plain
values by :class:`Normaliser`, which replaces only what differs from run to run
or from cluster to cluster for reasons that are not behaviour:

- node ids become roles (``n0`` for a single node; ``leader`` / ``asked`` /
  ``other`` on three nodes), hosts, ports and the cluster id are dropped;
- topic ids are not normalised away: the script runs against Kafka first and the
  dev cluster creates each topic with the id Kafka gave it (Kafka orders some
  answers by hash codes of topic ids); they are shown as ``id:<name>``;
- fetch session ids become ``<session>`` (non-zero) or 0;
- throttle times are dropped (no quotas in either cluster);
- the controller id of a 3-node KRaft cluster is a random live broker: it is
  compared as such.

Everything else, records bytes included, must be equal: records are produced
as identical batches with fixed timestamps, so the bytes each broker returns
are comparable byte for byte.  A difference is a dev-cluster bug, or a gap
listed (with its reason) in ``API_VERSION_GAPS``.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import itertools
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from crc32c import crc32c
from kio.schema.errors import ErrorCode
from support.batches import make_record_batch
from support.cluster import ThreadedCluster
from support.kafka import KafkaCluster
from support.rawclient import RawClient

TEST_TIMEOUT = 30.0
"""Absolute time limit of one test's network operations (seconds)."""

PRODUCE, FETCH, LIST_OFFSETS, METADATA, API_VERSIONS = 0, 1, 2, 3, 18
FETCH_NEW, FETCH_OLD = 18, 12
LIST_OFFSETS_NEW, LIST_OFFSETS_OLD = 11, 7
PRODUCE_NEW, PRODUCE_NAMES = 13, 12

SHARDS = 8
"""Kafka's fetch session cache shards (KafkaBroker.NumFetchSessionCacheShards)."""
EVICTION_SLOTS = 2 * SHARDS
"""max.incremental.fetch.session.cache.slots of the small-cache clusters: two per
cache shard of Kafka's eight, so that eviction has a choice of victim."""
FOLLOWER_ID = 100
"""A replica id >= 0 that names no broker: its fetches are privileged (follower) fetches."""

BASE_TS = 1_700_000_000_000
EARLIEST, LATEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED, EARLIEST_PENDING = (
    -2,
    -1,
    -3,
    -4,
    -5,
    -6,
)


# -- the two backends -------------------------------------------------------------------


@dataclasses.dataclass
class Backend:
    """One cluster as the scenarios see it: addresses and topic creation."""

    name: str
    addresses: dict[int, str]
    """node id -> host:port"""
    create: Callable[[str, int], None]
    deadline: float = 0.0

    def client(self, node: int | None = None) -> RawClient:
        address = self.addresses[node if node is not None else min(self.addresses)]
        return RawClient(address, deadline=self.deadline)


TopicIds = dict[str, uuid.UUID]
"""name -> the topic id Kafka gave it: the dev cluster creates its topics with the same ids
(Kafka orders some answers by hash codes of topic ids, see devbroker.jvm_order)."""


def dev_backend(cluster: ThreadedCluster, ids: TopicIds) -> Backend:
    dev = cluster.cluster
    assert dev is not None

    def create(name: str, partitions: int) -> None:
        cluster.run_sync(dev.create_topic, name, partitions, ids[name])

    return Backend("devbroker", {n.node_id: n.address for n in dev.nodes}, create)


def kafka_backend(cluster: KafkaCluster, ids: TopicIds) -> Backend:
    backend = Backend("kafka", {i: n.address for i, n in cluster.nodes.items()}, lambda n, p: None)

    def create(name: str, partitions: int) -> None:
        cluster.create_topic(name, partitions, replication_factor=1)
        wait_writable(backend, name, partitions)
        with backend.client() as c:
            ids.update({name: topic_id for topic_id, name in topic_ids(c, name).items()})

    backend.create = create
    return backend


def wait_writable(b: Backend, topic: str, partitions: int) -> None:
    """Until every node knows the topic's leaders and each leader answers ListOffsets.

    CreateTopics returns once the controller committed the topic; a broker serves
    a partition only after it applied that metadata, which it reports through no
    request, so the test asks until the answers say so (bounded by the deadline).
    """
    leaders: dict[int, int] = {}
    for node in b.addresses:
        with b.client(node) as c:
            while True:
                meta = metadata(c, [topic])
                parts = meta.topics[0].partitions if meta.topics else ()
                if len(parts) == partitions and all(p.leader_id >= 0 for p in parts):
                    leaders = {p.partition_index: p.leader_id for p in parts}
                    break
                time.sleep(0.05)
    for index, leader in leaders.items():
        with b.client(leader) as c:
            while (
                list_offsets(c, LIST_OFFSETS_OLD, topic, [(index, LATEST)])
                .topics[0]
                .partitions[0]
                .error_code
                != ErrorCode.none
            ):
                time.sleep(0.05)


@pytest.fixture(scope="module")
def dev1() -> Iterator[ThreadedCluster]:
    with ThreadedCluster(1) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def dev3() -> Iterator[ThreadedCluster]:
    with ThreadedCluster(3) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def dev_small_cache() -> Iterator[ThreadedCluster]:
    with ThreadedCluster(1, session_cache_slots=EVICTION_SLOTS) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def kafka_small_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """A single Kafka node whose fetch session cache has EVICTION_SLOTS slots."""
    workdir: Path = tmp_path_factory.mktemp("kafka-small-cache")
    cluster = KafkaCluster(
        1,
        workdir=workdir,
        config={"max.incremental.fetch.session.cache.slots": str(EVICTION_SLOTS)},
    ).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def deadline() -> float:
    return time.monotonic() + TEST_TIMEOUT


@pytest.fixture
def pair(dev1: ThreadedCluster, kafka: KafkaCluster, deadline: float) -> tuple[Backend, Backend]:
    ids: TopicIds = {}
    dev, real = dev_backend(dev1, ids), kafka_backend(kafka, ids)
    dev.deadline = real.deadline = deadline
    return dev, real


@pytest.fixture
def pair3(dev3: ThreadedCluster, kafka3: KafkaCluster, deadline: float) -> tuple[Backend, Backend]:
    ids: TopicIds = {}
    dev, real = dev_backend(dev3, ids), kafka_backend(kafka3, ids)
    dev.deadline = real.deadline = deadline
    return dev, real


@pytest.fixture
def pair_small_cache(
    dev_small_cache: ThreadedCluster, kafka_small_cache: KafkaCluster, deadline: float
) -> tuple[Backend, Backend]:
    ids: TopicIds = {}
    dev, real = dev_backend(dev_small_cache, ids), kafka_backend(kafka_small_cache, ids)
    dev.deadline = real.deadline = deadline
    return dev, real


def topic_name(prefix: str) -> str:
    return f"diff-{prefix}-{uuid.uuid4().hex[:8]}"


# -- normalising -------------------------------------------------------------------------

NODE_FIELDS = frozenset(
    {"node_id", "leader_id", "controller_id", "replica_nodes", "isr_nodes", "offline_replicas"}
)
DROPPED_FIELDS = frozenset({"throttle_time", "host", "port", "cluster_id"})


def records_summary(data: bytes | None) -> Any:
    """A readable stand-in for a records field: its batches (whole or cut) and a digest."""
    if data is None:
        return None
    batches: list[tuple[int, int, str]] = []
    pos = 0
    while pos + 12 <= len(data):
        base, size = struct.unpack_from(">qi", data, pos)
        whole = pos + 12 + size <= len(data)
        count = struct.unpack_from(">i", data, pos + 57)[0] if pos + 61 <= len(data) else -1
        batches.append((base, count, "whole" if whole else f"cut at {len(data) - pos} bytes"))
        pos += 12 + size
    return {
        "size": len(data),
        "batches": batches,
        "sha256": hashlib.sha256(data).hexdigest()[:16],
    }


@dataclasses.dataclass
class Normaliser:
    nodes: dict[int, str]
    """node id -> role"""
    topics: dict[uuid.UUID, str] = dataclasses.field(default_factory=dict)

    def node(self, value: int) -> Any:
        return value if value < 0 else self.nodes.get(value, f"<node {value}?>")

    def __call__(self, value: Any, name: str | None = None) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {
                f.name: self(getattr(value, f.name), f.name)
                for f in dataclasses.fields(value)
                if f.name not in DROPPED_FIELDS
            }
        if isinstance(value, tuple | list):
            return [self(v, name) for v in value]
        if isinstance(value, ErrorCode):
            return f"{int(value)} {value.name}"
        if isinstance(value, datetime.timedelta):
            return int(value.total_seconds() * 1000)
        if name in NODE_FIELDS and isinstance(value, int):
            return self.node(value)
        if name == "topic_id":
            if value is None or value == uuid.UUID(int=0):
                return None
            known = self.topics.get(value)
            return f"id:{known}" if known is not None else f"unknown id {value}"
        if name == "session_id":
            return "<session>" if value else 0
        if name == "records":
            return records_summary(value)
        return value


# -- running a script against both --------------------------------------------------------

Step = tuple[str, Any]


def leaf_differences(d: Any, k: Any, path: str = "") -> list[str]:
    """Where two normalised answers differ, as paths (the first few)."""
    if isinstance(d, dict) and isinstance(k, dict) and d.keys() == k.keys():
        return [x for key in d for x in leaf_differences(d[key], k[key], f"{path}.{key}")]
    if isinstance(d, list) and isinstance(k, list) and len(d) == len(k):
        return [
            x
            for i, (a, b) in enumerate(zip(d, k, strict=True))
            for x in leaf_differences(a, b, f"{path}[{i}]")
        ]
    return [] if d == k else [f"{path or '.'}: devbroker {d!r} / kafka {k!r}"]


def differences(dev: list[Step], real: list[Step]) -> list[str]:
    out = []
    if [label for label, _ in dev] != [label for label, _ in real]:
        out.append(f"steps differ: {[s for s, _ in dev]} vs {[s for s, _ in real]}")
    for (label, d), (_, k) in zip(dev, real, strict=False):
        if d != k:
            where = "\n    ".join(leaf_differences(d, k)[:4])
            out.append(f"{label}:\n    {where}\n  devbroker: {d!r}\n  kafka:     {k!r}")
    return out


def assert_same(
    backends: tuple[Backend, Backend], script: Callable[[Backend], list[Step]]
) -> dict[str, Any]:
    """Run *script* against both clusters; their steps must agree.

    Returns Kafka's steps by label: each test then checks that its script reached
    the states it is about (so that agreeing on nothing cannot pass).
    """
    dev, real = backends
    got_real = script(real)  # first: the dev cluster takes the topic ids Kafka chose
    got_dev = script(dev)
    diff = differences(got_dev, got_real)
    assert not diff, "the dev cluster answers differently from Kafka:\n" + "\n".join(diff)
    return dict(got_real)


# -- request builders (newest field names; build() keeps what a version has) ---------------


def metadata(c: RawClient, topics: list[str] | None, version: int = 12) -> Any:
    return c.call(
        METADATA,
        version,
        {
            "topics": None if topics is None else [{"name": t, "topic_id": None} for t in topics],
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False,
            "include_cluster_authorized_operations": False,
        },
    )


def topic_ids(c: RawClient, *topics: str) -> dict[uuid.UUID, str]:
    meta = metadata(c, list(topics))
    ids = {t.topic_id: t.name for t in meta.topics if t.error_code == ErrorCode.none}
    assert len(ids) == len(topics), meta
    return ids


def produce(
    c: RawClient,
    topic: str,
    partition: int,
    batch: bytes,
    *,
    version: int = PRODUCE_NAMES,
    topic_id: uuid.UUID | None = None,
    check: bool = True,
) -> Any:
    r = c.call(
        PRODUCE,
        version,
        {
            "transactional_id": None,
            "acks": -1,
            "timeout": 10_000,
            "topic_data": [
                {
                    "name": topic,
                    "topic_id": topic_id,
                    "partition_data": [{"index": partition, "records": batch}],
                }
            ],
        },
    )
    if check:
        error = r.responses[0].partition_responses[0].error_code
        assert error == ErrorCode.none, f"produce to {topic}-{partition}: {error!r}"
    return r


def batch(n_records: int, value_size: int, ts: int = BASE_TS) -> bytes:
    """Identical bytes for both clusters: fixed timestamps, fixed values."""
    return make_record_batch(
        [ts + i for i in range(n_records)],
        values=[bytes([65 + i % 26]) * value_size for i in range(n_records)],
    )


def fetch_request(
    version: int,
    partitions: list[tuple[str, uuid.UUID | None, int, int, int]],
    *,
    session_id: int = 0,
    epoch: int = -1,
    max_bytes: int = 50 * 1024 * 1024,
    forgotten: list[tuple[str, uuid.UUID | None, list[int]]] | None = None,
    replica_id: int = -1,
) -> dict[str, Any]:
    """partitions: (topic, topic id, partition, fetch offset, partition max bytes).

    *replica_id* >= 0 makes it a follower fetch (``replica_id`` before v15,
    ``replica_state.replica_id`` from v15): its session, if one is created, is privileged.
    """
    topics: list[dict[str, Any]] = []
    for topic, tid, index, offset, pmax in partitions:
        entry = {
            "partition": index,
            "current_leader_epoch": -1,
            "fetch_offset": offset,
            "last_fetched_epoch": -1,
            "log_start_offset": -1,
            "partition_max_bytes": pmax,
        }
        if topics and (topics[-1]["topic"], topics[-1]["topic_id"]) == (topic, tid):
            topics[-1]["partitions"].append(entry)
        else:
            topics.append({"topic": topic, "topic_id": tid, "partitions": [entry]})
    return {
        "cluster_id": None,
        "replica_id": replica_id,
        "replica_state": {"replica_id": replica_id, "replica_epoch": -1},
        "max_wait": 0,
        "min_bytes": 1,
        "max_bytes": max_bytes,
        "isolation_level": 0,
        "session_id": session_id,
        "session_epoch": epoch,
        "topics": topics,
        "forgotten_topics_data": [
            {"topic": t, "topic_id": tid, "partitions": parts} for t, tid, parts in forgotten or []
        ],
        "rack_id": "",
    }


def list_offsets(
    c: RawClient, version: int, topic: str, partitions: list[tuple[int, int]], isolation: int = 0
) -> Any:
    return c.call(
        LIST_OFFSETS,
        version,
        {
            "replica_id": -1,
            "isolation_level": isolation,
            "topics": [
                {
                    "name": topic,
                    "partitions": [
                        {"partition_index": p, "current_leader_epoch": -1, "timestamp": ts}
                        for p, ts in partitions
                    ],
                }
            ],
            "timeout": 10_000,
        },
    )


# -- KIP-227: the fetch session table -----------------------------------------------------


@pytest.mark.parametrize("version", [FETCH_NEW, FETCH_OLD])
def test_fetch_session_table(pair: tuple[Backend, Backend], version: int) -> None:
    topic = topic_name("sessions")

    def script(b: Backend) -> list[Step]:
        b.create(topic, 2)
        steps: list[Step] = []
        with b.client() as c:
            ids = topic_ids(c, topic)
            norm = Normaliser({min(b.addresses): "n0"}, ids)
            tid = next(iter(ids)) if version >= 13 else None
            produce(c, topic, 0, batch(3, 20))

            everything = [(topic, tid, 0, 0, 1 << 20), (topic, tid, 1, 0, 1 << 20)]

            def fetch(label: str, parts: list[Any] | None = None, **kw: Any) -> Any:
                request = fetch_request(version, everything if parts is None else parts, **kw)
                r = c.call(FETCH, version, request)
                steps.append((label, norm(r)))
                return r

            full = fetch("full fetch, create a session", epoch=0)
            sid = full.session_id
            steps.append(("session created", sid != 0))
            fetch("incremental epoch 1, nothing changed", session_id=sid, epoch=1, parts=[])
            produce(c, topic, 1, batch(2, 10, BASE_TS + 100))
            fetch("incremental epoch 2, new data on p1", session_id=sid, epoch=2, parts=[])
            fetch(
                "incremental epoch 3, p0 moves to offset 3",
                session_id=sid,
                epoch=3,
                parts=[(topic, tid, 0, 3, 1 << 20)],
            )
            fetch("wrong epoch", session_id=sid, epoch=7, parts=[])
            unknown = 12345 if sid != 12345 else 12346
            fetch("unknown session id", session_id=unknown, epoch=1, parts=[])
            other = FETCH_OLD if version >= 13 else FETCH_NEW
            r = c.call(
                FETCH,
                other,
                fetch_request(
                    other,
                    [(topic, next(iter(ids)) if other >= 13 else None, 0, 3, 1 << 20)],
                    session_id=sid,
                    epoch=4,
                ),
            )
            steps.append(("same session at a version with(out) topic ids", norm(r)))
            fetch("incremental epoch 4 still valid", session_id=sid, epoch=4, parts=[])
            fetch(
                "forget every partition: sessionless",
                session_id=sid,
                epoch=5,
                parts=[],
                forgotten=[(topic, tid, [0, 1])],
            )
            fetch("the forgotten session is gone", session_id=sid, epoch=6, parts=[])
            full = fetch("new session", epoch=0)
            sid = full.session_id
            fetch("close it: epoch -1", session_id=sid, epoch=-1)
            fetch("the closed session is gone", session_id=sid, epoch=1, parts=[])
            full = fetch("new session again", epoch=0)
            fetch(
                "full fetch naming a session closes it and opens another",
                session_id=full.session_id,
                epoch=0,
            )
            fetch("the replaced session is gone", session_id=full.session_id, epoch=1, parts=[])
        return steps

    got = assert_same(pair, script)
    assert got["session created"] is True
    assert got["wrong epoch"]["error_code"] == "71 invalid_fetch_session_epoch"
    assert got["unknown session id"]["error_code"] == "70 fetch_session_id_not_found"
    assert (
        got["same session at a version with(out) topic ids"]["error_code"]
        == "106 fetch_session_topic_id_error"
    )
    assert got["the closed session is gone"]["error_code"] == "70 fetch_session_id_not_found"
    assert got["close it: epoch -1"]["session_id"] == 0


def test_fetch_session_ids_outside_kafka_id_ranges(pair: tuple[Backend, Backend]) -> None:
    """Incremental fetches naming session ids no cache shard can hold."""
    topic = topic_name("ids")

    def script(b: Backend) -> list[Step]:
        b.create(topic, 1)
        steps: list[Step] = []
        with b.client() as c:
            ids = topic_ids(c, topic)
            norm = Normaliser({min(b.addresses): "n0"}, ids)
            tid = next(iter(ids))
            for sid in (-5, 2**31 - 1, 2**31 - 8):
                for epoch in (1, 0, -1):
                    r = c.call(
                        FETCH,
                        FETCH_NEW,
                        fetch_request(
                            FETCH_NEW, [(topic, tid, 0, 0, 1024)], session_id=sid, epoch=epoch
                        ),
                    )
                    steps.append((f"session id {sid} epoch {epoch}", norm(r)))
        return steps

    got = assert_same(pair, script)
    assert got[f"session id {2**31 - 1} epoch 1"]["error_code"] == "-1 unknown_server_error"
    assert got["session id -5 epoch 1"]["error_code"] == "70 fetch_session_id_not_found"


def test_fetch_session_cache_full(pair_small_cache: tuple[Backend, Backend]) -> None:
    """A cache of EVICTION_SLOTS slots: which full fetches get a session, which get 0."""
    topic = topic_name("cache")

    def script(b: Backend) -> list[Step]:
        b.create(topic, 1)
        steps: list[Step] = []
        with b.client() as c:
            ids = topic_ids(c, topic)
            tid = next(iter(ids))
            norm = Normaliser({min(b.addresses): "n0"}, ids)
            part = [(topic, tid, 0, 0, 1024)]

            def full(label: str, session_id: int = 0, epoch: int = 0) -> int:
                r = c.call(
                    FETCH,
                    FETCH_NEW,
                    fetch_request(FETCH_NEW, part, session_id=session_id, epoch=epoch),
                )
                steps.append((label, norm(r)))
                return int(r.session_id)

            sessions = [full(f"session {i}") for i in range(EVICTION_SLOTS)]
            steps.append(
                ("distinct ids", len(set(sessions)) == EVICTION_SLOTS and 0 not in sessions)
            )
            full("one more: the cache is full")
            full("close the first session", sessions[0], -1)
            full("one more after a close")
            full("and another")
            for i, sid in enumerate(sessions[1:], 1):
                r = c.call(FETCH, FETCH_NEW, fetch_request(FETCH_NEW, [], session_id=sid, epoch=1))
                steps.append((f"session {i} still cached", norm(r)))
            for sid in sessions[1:]:
                full("close", sid, -1)
        return steps

    got = assert_same(pair_small_cache, script)
    assert got["distinct ids"] is True
    assert got["one more: the cache is full"]["session_id"] == 0
    # The freed slot is in another cache shard than the one next in turn.
    assert got["one more after a close"]["session_id"] == 0


def test_fetch_session_cache_eviction(pair_small_cache: tuple[Backend, Backend]) -> None:
    """A privileged (follower) full fetch into a full cache shard evicts a consumer session.

    FetchSessionCacheShard.tryEvict, with no session idle for evictionMs (120 s):
    the new session's key (privileged, size, 0) is compared with the lowest
    EvictableKey (privileged, cached size, id) of the shard's sessions that a
    privileged fetch may evict (every unprivileged session, and privileged ones
    older than evictionMs); a consumer fetch may evict only sessions older than
    evictionMs, so within seconds it never evicts, whatever its size.  Kafka
    creates the follower's session before reading (FetchManager.newContext) and
    answers its partition NOT_LEADER_OR_FOLLOWER (the replica id is no replica:
    Partition.followerReplicaOrThrow).

    Each full fetch goes to the next shard in turn; with two slots a shard, the i-th
    and (i+8)-th full fetch of this script share a shard (the cache starts empty).
    """
    topic = topic_name("evict")

    def script(b: Backend) -> list[Step]:
        b.create(topic, 3)
        steps: list[Step] = []
        with b.client() as c:
            ids = topic_ids(c, topic)
            tid = next(iter(ids))
            norm = Normaliser({min(b.addresses): "n0"}, ids)
            produce(c, topic, 0, batch(2, 10))

            def parts(n: int) -> list[tuple[str, uuid.UUID | None, int, int, int]]:
                return [(topic, tid, i, 0, 1024) for i in range(n)]

            def fetch(
                label: str,
                n: int = 0,
                session_id: int = 0,
                epoch: int = 0,
                replica_id: int = -1,
            ) -> int:
                request = fetch_request(
                    FETCH_NEW, parts(n), session_id=session_id, epoch=epoch, replica_id=replica_id
                )
                r = c.call(FETCH, FETCH_NEW, request)
                steps.append((label, norm(r)))
                return int(r.session_id)

            # Shard k (in turn from wherever the counter stands) gets small[k], 1 partition,
            # then large[k], 2 partitions.
            small = [fetch(f"consumer session {k}, 1 partition", 1) for k in range(SHARDS)]
            large = [
                fetch(f"consumer session {k + SHARDS}, 2 partitions", 2) for k in range(SHARDS)
            ]
            sessions = small + large
            steps.append(
                ("16 sessions", len(set(sessions)) == EVICTION_SLOTS and 0 not in sessions)
            )
            # small[0] becomes its shard's most recently used session: the victim is not the LRU.
            fetch("use consumer session 0", session_id=small[0], epoch=1)
            p1 = fetch("follower full fetch into shard 0", 1, replica_id=FOLLOWER_ID)
            fetch("evicted: consumer session 0, the smaller", session_id=small[0], epoch=2)
            fetch("kept: consumer session 8, the larger", session_id=large[0], epoch=1)
            for k in range(1, SHARDS):
                fetch(f"consumer fetch of 3 partitions into full shard {k}", 3)
            p2 = fetch("second follower full fetch into shard 0", 1, replica_id=FOLLOWER_ID)
            fetch("evicted: consumer session 8, though larger", session_id=large[0], epoch=2)
            fetch(
                "kept: the first follower session", session_id=p1, epoch=1, replica_id=FOLLOWER_ID
            )
            for k in range(1, SHARDS):
                fetch(f"consumer fetch into full shard {k} again", 1)
            fetch(
                "third follower full fetch: shard 0 holds two young follower sessions",
                1,
                replica_id=FOLLOWER_ID,
            )
            for sid in [*small[1:], *large[1:], p1, p2]:
                fetch("close", session_id=sid, epoch=-1)
        return steps

    got = assert_same(pair_small_cache, script)
    assert got["16 sessions"] is True
    follower = got["follower full fetch into shard 0"]
    assert follower["session_id"] == "<session>"
    assert follower["responses"][0]["partitions"][0]["error_code"] == "6 not_leader_or_follower"
    assert (
        got["evicted: consumer session 0, the smaller"]["error_code"]
        == "70 fetch_session_id_not_found"
    )
    assert got["kept: consumer session 8, the larger"]["error_code"] == "0 none"
    assert got["consumer fetch of 3 partitions into full shard 1"]["session_id"] == 0
    assert got["second follower full fetch into shard 0"]["session_id"] == "<session>"
    assert (
        got["evicted: consumer session 8, though larger"]["error_code"]
        == "70 fetch_session_id_not_found"
    )
    assert got["kept: the first follower session"]["error_code"] == "0 none"
    assert (
        got["third follower full fetch: shard 0 holds two young follower sessions"]["session_id"]
        == 0
    )


# -- KIP-74: byte limits ------------------------------------------------------------------


@pytest.mark.parametrize("version", [FETCH_NEW, FETCH_OLD])
def test_fetch_byte_limits(pair: tuple[Backend, Backend], version: int) -> None:
    topic = topic_name("kip74")

    def script(b: Backend) -> list[Step]:
        b.create(topic, 3)
        steps: list[Step] = []
        with b.client() as c:
            ids = topic_ids(c, topic)
            norm = Normaliser({min(b.addresses): "n0"}, ids)
            tid = next(iter(ids)) if version >= 13 else None
            # p0: two batches of ~1 KB and one of ~300 B; p1: one ~1 KB; p2: one small.
            for p, b_ in [
                (0, batch(10, 90)),
                (0, batch(10, 90, BASE_TS + 10)),
                (0, batch(3, 90, BASE_TS + 20)),
                (1, batch(10, 90, BASE_TS + 30)),
                (2, batch(2, 5, BASE_TS + 40)),
            ]:
                produce(c, topic, p, b_)

            def fetch(label: str, parts: list[tuple[int, int, int]], max_bytes: int) -> None:
                r = c.call(
                    FETCH,
                    version,
                    fetch_request(
                        version,
                        [(topic, tid, p, off, pmax) for p, off, pmax in parts],
                        max_bytes=max_bytes,
                    ),
                )
                steps.append((label, norm(r)))

            all3 = [(0, 0, 1 << 20), (1, 0, 1 << 20), (2, 0, 1 << 20)]
            fetch("response max_bytes 1: the first batch whole, nothing after", all3, 1)
            fetch("response max_bytes 500", all3, 500)
            fetch("response max_bytes 2500 across partitions", all3, 2500)
            fetch("response max_bytes 3000 across partitions", all3, 3000)
            fetch(
                "partition max_bytes 1500: a cut trailing batch",
                [(0, 0, 1500), (1, 0, 1500), (2, 0, 1500)],
                1 << 20,
            )
            fetch(
                "partition max_bytes 100: first batches whole only for the first partition with data",
                [(2, 2, 100), (0, 0, 100), (1, 0, 100)],
                1 << 20,
            )
            fetch(
                "a partition listed twice: its place, the last parameters",
                [(2, 2, 100), (0, 0, 100), (1, 0, 100), (2, 0, 100)],
                1 << 20,
            )
            fetch(
                "partition max_bytes 0",
                [(0, 0, 0), (1, 0, 0)],
                1 << 20,
            )
            fetch(
                "fetch offset in the middle of a batch",
                [(0, 5, 1 << 20), (1, 9, 1 << 20)],
                1 << 20,
            )
            fetch(
                "offsets at and beyond the end",
                [(0, 23, 1 << 20), (1, 11, 1 << 20), (2, -1, 1 << 20)],
                1 << 20,
            )
        return steps

    got = assert_same(pair, script)
    first = records_by_partition(got["response max_bytes 1: the first batch whole, nothing after"])
    assert first[0]["batches"] == [(0, 10, "whole")]
    assert first[1]["size"] == first[2]["size"] == 0
    cut = records_by_partition(got["partition max_bytes 1500: a cut trailing batch"])
    assert cut[0]["size"] == 1500 and cut[0]["batches"][-1][2].startswith("cut")
    assert cut[1]["batches"] == [(0, 10, "whole")]
    small = records_by_partition(
        got["partition max_bytes 100: first batches whole only for the first partition with data"]
    )
    assert small[0]["size"] > 100 and small[1]["size"] == 0


def records_by_partition(answer: dict[str, Any]) -> dict[int, Any]:
    return {
        p["partition_index"]: p["records"] for t in answer["responses"] for p in t["partitions"]
    }


# -- ListOffsets --------------------------------------------------------------------------


@pytest.mark.parametrize("version", [LIST_OFFSETS_NEW, LIST_OFFSETS_OLD])
def test_list_offsets(pair: tuple[Backend, Backend], version: int) -> None:
    topic = topic_name("offsets")
    specials = [EARLIEST, LATEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED]
    if version >= 11:
        specials.append(EARLIEST_PENDING)
    specials = [ts for ts in specials if ts >= -3 or version >= 8]

    def script(b: Backend) -> list[Step]:
        b.create(topic, 2)
        steps: list[Step] = []
        with b.client() as c:
            norm = Normaliser({min(b.addresses): "n0"}, topic_ids(c, topic))
            produce(c, topic, 1, batch(3, 10, BASE_TS))
            produce(c, topic, 1, make_record_batch([BASE_TS + 50, BASE_TS + 90, BASE_TS + 70]))
            produce(c, topic, 1, batch(2, 10, BASE_TS + 60))
            for p in (0, 1):
                for ts in specials:
                    steps.append(
                        (f"p{p} timestamp {ts}", norm(list_offsets(c, version, topic, [(p, ts)])))
                    )
                for ts in (
                    BASE_TS - 1,
                    BASE_TS,
                    BASE_TS + 1,
                    BASE_TS + 55,
                    BASE_TS + 80,
                    BASE_TS + 90,
                    BASE_TS + 91,
                ):
                    steps.append(
                        (
                            f"p{p} by timestamp {ts}",
                            norm(list_offsets(c, version, topic, [(p, ts)])),
                        )
                    )
            steps.append(
                ("unknown partition", norm(list_offsets(c, version, topic, [(7, LATEST)])))
            )
            steps.append(
                (
                    "several partitions, one unknown",
                    norm(
                        list_offsets(c, version, topic, [(1, EARLIEST), (2, LATEST), (0, LATEST)])
                    ),
                )
            )
            steps.append(
                (
                    "partition listed twice",
                    norm(list_offsets(c, version, topic, [(1, EARLIEST), (1, LATEST)])),
                )
            )
            steps.append(
                (
                    "read_committed",
                    norm(list_offsets(c, version, topic, [(1, LATEST)], isolation=1)),
                )
            )
        return steps

    got = assert_same(pair, script)

    def only(label: str) -> dict[str, Any]:
        (part,) = got[label]["topics"][0]["partitions"]
        return dict(part)

    assert only("unknown partition")["error_code"] == "3 unknown_topic_or_partition"
    assert only("p1 timestamp -1")["offset"] == 8
    assert only(f"p1 by timestamp {BASE_TS + 55}")["offset"] == 4
    assert only(f"p0 by timestamp {BASE_TS}")["offset"] == -1


# -- unknown topics, partitions and ids ---------------------------------------------------


def test_unknown_topics_and_partitions(pair: tuple[Backend, Backend]) -> None:
    topic = topic_name("known")
    missing = topic_name("missing")
    bogus_id = uuid.UUID("6b1f2a3c-0000-4000-8000-00000000abcd")

    def script(b: Backend) -> list[Step]:
        b.create(topic, 1)
        steps: list[Step] = []
        with b.client() as c:
            ids = topic_ids(c, topic)
            tid = next(iter(ids))
            norm = Normaliser({min(b.addresses): "n0"}, ids)
            for v in (12, 9, 4):
                r = metadata(c, [missing, topic], version=v)
                steps.append((f"metadata v{v}: unknown and known topic", norm(r)))
            r = c.call(
                METADATA,
                12,
                {
                    "topics": [
                        {"name": None, "topic_id": bogus_id},
                        {"name": None, "topic_id": tid},
                    ],
                    "allow_auto_topic_creation": False,
                    "include_topic_authorized_operations": False,
                },
            )
            steps.append(("metadata v12 by topic id", norm(r)))
            one = batch(1, 5)
            steps.append(
                ("produce v12 unknown topic", norm(produce(c, missing, 0, one, check=False)))
            )
            steps.append(
                ("produce v12 unknown partition", norm(produce(c, topic, 3, one, check=False)))
            )
            steps.append(
                (
                    "produce v13 unknown topic id",
                    norm(
                        produce(c, "", 0, one, version=PRODUCE_NEW, topic_id=bogus_id, check=False)
                    ),
                )
            )
            steps.append(
                (
                    "produce v13 unknown partition",
                    norm(produce(c, "", 5, one, version=PRODUCE_NEW, topic_id=tid, check=False)),
                )
            )
            steps.append(
                (
                    "produce v13 by topic id",
                    norm(produce(c, "", 0, one, version=PRODUCE_NEW, topic_id=tid)),
                )
            )
            steps.append(
                (
                    "list offsets unknown topic",
                    norm(list_offsets(c, LIST_OFFSETS_NEW, missing, [(0, LATEST)])),
                )
            )
            for v in (FETCH_NEW, 13):
                r = c.call(
                    FETCH,
                    v,
                    fetch_request(
                        v,
                        [
                            (topic, bogus_id, 0, 0, 1024),
                            (topic, tid, 0, 0, 1024),
                            (topic, tid, 4, 0, 1024),
                        ],
                    ),
                )
                steps.append((f"fetch v{v} unknown topic id and partition", norm(r)))
                r = c.call(FETCH, v, fetch_request(v, [(topic, bogus_id, 0, 0, 1024)], epoch=0))
                steps.append((f"fetch v{v} session of an unknown topic id", norm(r)))
                if r.session_id:
                    r = c.call(FETCH, v, fetch_request(v, [], session_id=r.session_id, epoch=1))
                    steps.append((f"fetch v{v} incremental, unknown topic id", norm(r)))
                    c.call(FETCH, v, fetch_request(v, [], session_id=r.session_id, epoch=-1))
            r = c.call(
                FETCH,
                FETCH_OLD,
                fetch_request(
                    FETCH_OLD,
                    [
                        (missing, None, 0, 0, 1024),
                        (topic, None, 2, 0, 1024),
                        (topic, None, 0, 0, 1024),
                    ],
                ),
            )
            steps.append(("fetch v12 unknown topic name and partition", norm(r)))
        return steps

    got = assert_same(pair, script)
    fetch18 = got[f"fetch v{FETCH_NEW} unknown topic id and partition"]
    errors = {p["error_code"] for t in fetch18["responses"] for p in t["partitions"]}
    assert errors == {"100 unknown_topic_id", "3 unknown_topic_or_partition", "0 none"}
    (produced,) = got["produce v13 unknown topic id"]["responses"][0]["partition_responses"]
    assert produced["error_code"] == "100 unknown_topic_id"
    assert got["metadata v12: unknown and known topic"]["topics"][1]["error_code"] == (
        "3 unknown_topic_or_partition"
    )


# -- the order of answers ---------------------------------------------------------------


def test_response_order(pair: tuple[Backend, Backend]) -> None:
    """Several topics and partitions in one request: the answers come in Kafka's order."""
    k1, k2 = topic_name("order-a"), topic_name("order-b")
    missing = [topic_name(f"order-m{i}") for i in range(4)]

    def script(b: Backend) -> list[Step]:
        b.create(k1, 13)
        b.create(k2, 3)
        steps: list[Step] = []
        with b.client() as c:
            ids = topic_ids(c, k1, k2)
            norm = Normaliser({min(b.addresses): "n0"}, ids)
            tid = {name: t for t, name in ids.items()}
            for label, names in [
                ("metadata, four names", [missing[0], k1, missing[1], k2]),
                ("metadata, a name twice", [k2, missing[0], k2]),
                ("metadata, six names", [missing[0], k1, missing[1], k2, missing[2], missing[3]]),
            ]:
                steps.append((label, norm(metadata(c, names))))
            r = c.call(
                LIST_OFFSETS,
                LIST_OFFSETS_NEW,
                {
                    "replica_id": -1,
                    "isolation_level": 0,
                    "topics": [
                        {
                            "name": name,
                            "partitions": [
                                {"partition_index": p, "current_leader_epoch": -1, "timestamp": -1}
                                for p in parts
                            ],
                        }
                        for name, parts in [
                            (k2, [2, 0, 1]),
                            (missing[0], [0]),
                            (k1, list(range(12, -1, -1))),
                            (missing[1], [3, 1]),
                        ]
                    ],
                    "timeout": 10_000,
                },
            )
            steps.append(("list offsets, four topics and 13 partitions", norm(r)))
            one = batch(1, 5)
            shapes = {
                "three topics": [(k1, [12, 0, 5]), (missing[2], [0]), (k2, [1, 0])],
                "four partitions": [(k2, [2, 1]), (k1, [7, 3])],
                "three partitions and a missing one": [(k1, [4, 9]), (missing[3], [1]), (k2, [0])],
                "an invalid batch": [(k1, [1, 2, 3])],
            }
            for (shape, data), v in itertools.product(shapes.items(), (PRODUCE_NAMES, PRODUCE_NEW)):
                r = c.call(
                    PRODUCE,
                    v,
                    {
                        "transactional_id": None,
                        "acks": -1,
                        "timeout": 10_000,
                        "topic_data": [
                            {
                                "name": name,
                                "topic_id": tid.get(name, uuid.UUID(int=7)),
                                "partition_data": [
                                    {
                                        "index": p,
                                        "records": b""
                                        if (shape, p) == ("an invalid batch", 2)
                                        else one,
                                    }
                                    for p in parts
                                ],
                            }
                            for name, parts in data
                        ],
                    },
                )
                steps.append((f"produce v{v}, {shape}", norm(r)))
            for v in (FETCH_NEW, FETCH_OLD):
                parts = [(k2, 1), (k1, 12), (k1, 0), (k2, 0), (k1, 5)]
                r = c.call(
                    FETCH,
                    v,
                    fetch_request(
                        v, [(name, tid[name] if v >= 13 else None, p, 0, 1024) for name, p in parts]
                    ),
                )
                steps.append((f"fetch v{v}, topics interleaved", norm(r)))
        return steps

    got = assert_same(pair, script)
    six = [t["name"] for t in got["metadata, six names"]["topics"]]
    assert six[:2] == sorted(six[:2]) or six[:2] == sorted(six[:2], reverse=True)
    assert {t["name"] for t in got["list offsets, four topics and 13 partitions"]["topics"]} == {
        k1,
        k2,
        missing[0],
        missing[1],
    }


# -- three nodes: asking a node that does not lead the partition ----------------------------


def test_not_leader_or_follower(pair3: tuple[Backend, Backend]) -> None:
    """Fetch, Produce and ListOffsets sent to a node that holds no replica of the partition.

    Kafka's topic has one replica (as every dev-cluster partition): a consumer fetch
    from a follower replica would get a preferred read replica instead, which the
    dev cluster does not model.  Node ids become roles: the partition's leader, the
    node asked, and the other node.  The controller id a KRaft broker reports is a
    random live broker, so it is compared as such.
    """
    topic = topic_name("leader")

    def script(b: Backend) -> list[Step]:
        b.create(topic, 1)
        steps: list[Step] = []
        with b.client() as c:
            meta = metadata(c, [topic])
            ids = {t.topic_id: t.name for t in meta.topics}
            leader = meta.topics[0].partitions[0].leader_id
        asked = min(n for n in b.addresses if n != leader)
        (other,) = set(b.addresses) - {leader, asked}
        norm = Normaliser({leader: "leader", asked: "asked", other: "other"}, ids)
        tid = next(iter(ids))
        with b.client(asked) as c:
            meta = norm(metadata(c, [topic]))
            meta["brokers"] = sorted(meta["brokers"], key=lambda x: str(x["node_id"]))
            meta["controller_id"] = meta["controller_id"] in ("leader", "asked", "other")
            steps.append(("metadata from the node asked", meta))
            for v in (FETCH_NEW, 16, 15, FETCH_OLD):
                r = c.call(
                    FETCH, v, fetch_request(v, [(topic, tid if v >= 13 else None, 0, 0, 1024)])
                )
                steps.append((f"fetch v{v}", norm(r)))
            one = batch(1, 5)
            steps.append(("produce v12", norm(produce(c, topic, 0, one, check=False))))
            steps.append(
                (
                    "produce v13",
                    norm(produce(c, "", 0, one, version=PRODUCE_NEW, topic_id=tid, check=False)),
                )
            )
            steps.append(
                ("list offsets", norm(list_offsets(c, LIST_OFFSETS_NEW, topic, [(0, LATEST)])))
            )
        with b.client(leader) as c:
            steps.append(("the leader takes the produce", norm(produce(c, topic, 0, one))))
        return steps

    got = assert_same(pair3, script)
    (part,) = got[f"fetch v{FETCH_NEW}"]["responses"][0]["partitions"]
    assert part["error_code"] == "6 not_leader_or_follower"
    assert part["current_leader"] == {"leader_id": "leader", "leader_epoch": 0}


# -- versions -----------------------------------------------------------------------------

API_VERSION_GAPS: dict[int, tuple[tuple[int, int], str]] = {
    PRODUCE: (
        (3, 13),
        "Kafka 4.x advertises Produce v0-v2 only for old librdkafka (KAFKA-18659) and refuses "
        "them; kio 0.6.5 has no schema for them",
    ),
    API_VERSIONS: ((0, 4), "kio 0.6.5 has no ApiVersions v5 schema"),
    28: ((0, 5), "kio 0.6.5 has no TxnOffsetCommit v6 schema (topics by id)"),
}
"""api key -> (the dev cluster's range, why it differs from Kafka 4.4's)."""


def test_api_versions_ranges(pair: tuple[Backend, Backend]) -> None:
    """Every API the dev cluster implements at Kafka's versions, except the documented gaps."""

    def ranges(b: Backend) -> dict[int, tuple[int, int]]:
        with b.client() as c:
            r = c.call(
                API_VERSIONS, 4, {"client_software_name": "diff", "client_software_version": "1"}
            )
        assert r.error_code == ErrorCode.none
        return {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in r.api_keys}

    dev, real = (ranges(b) for b in pair)
    assert dev[FETCH] == real[FETCH] == (4, 18)
    assert dev[PRODUCE][1] == real[PRODUCE][1] == 13
    wrong = {}
    for key, got in dev.items():
        want, _why = API_VERSION_GAPS.get(key, (real.get(key), ""))
        if got != want or (key in API_VERSION_GAPS and real.get(key) == got):
            wrong[key] = {"devbroker": got, "kafka": real.get(key), "documented": want}
    assert not wrong, wrong


def test_unsupported_versions(pair: tuple[Backend, Backend]) -> None:
    """ApiVersions above the max: a v0 UNSUPPORTED_VERSION answer; other APIs: the connection closes."""

    def script(b: Backend) -> list[Step]:
        steps: list[Step] = []
        with b.client() as c:
            cid = c.send_raw(API_VERSIONS, 99, b"\x00\x00\x00")
            r = Normaliser({})(c.receive(API_VERSIONS, 0, cid))
            if b.name == "kafka":
                # ApiVersions' own range, as the dev cluster documents it (API_VERSION_GAPS).
                r["api_keys"][0]["max_version"] = API_VERSION_GAPS[API_VERSIONS][0][1]
            steps.append(("ApiVersions v99", r))
            r = c.call(API_VERSIONS, 0, {})
            steps.append(
                ("then ApiVersions v0 on the same connection", r.error_code == ErrorCode.none)
            )
        for key, version in [
            (FETCH, 99),
            (FETCH, 3),
            (METADATA, 99),
            (LIST_OFFSETS, 99),
            (LIST_OFFSETS, 0),
            (PRODUCE, 99),
        ]:
            with b.client() as c:
                c.send_raw(key, version, b"\x00" * 16, header_version=1)
                steps.append((f"api {key} v{version}: connection closed", c.is_closed_by_peer()))
        return steps

    got = assert_same(pair, script)
    assert got[f"api {FETCH} v99: connection closed"] is True
    assert got["ApiVersions v99"]["error_code"] == "35 unsupported_version"


# -- OffsetCommit and OffsetFetch v10: topics by id ------------------------------------------

OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 8, 9, 10
OFFSETS_BY_ID, OFFSETS_BY_NAME = 10, 9


def wait_group_coordinator(b: Backend, group: str) -> None:
    """Until the group's coordinator answers OffsetFetch (Kafka first creates and loads
    ``__consumer_offsets``: NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS meanwhile)."""
    with b.client() as c:
        while True:
            found = c.call(FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": [group]})
            if found.coordinators[0].error_code == ErrorCode.none:
                break
            time.sleep(0.1)
        while True:
            r = c.call(
                OFFSET_FETCH,
                OFFSETS_BY_NAME,
                {
                    "groups": [{"group_id": group, "member_epoch": -1, "topics": []}],
                    "require_stable": False,
                },
            )
            if r.groups[0].error_code == ErrorCode.none:
                return
            time.sleep(0.1)


def commit_offsets(
    c: RawClient, version: int, group: str, topics: list[tuple[str | uuid.UUID, list[int]]]
) -> Any:
    """topics: (name or topic id, partitions); partition p commits offset 10 * p + 1."""
    return c.call(
        OFFSET_COMMIT,
        version,
        {
            "group_id": group,
            "generation_id_or_member_epoch": -1,
            "member_id": "",
            "group_instance_id": None,
            "topics": [
                {
                    "name": key if isinstance(key, str) else "",
                    "topic_id": key if isinstance(key, uuid.UUID) else None,
                    "partitions": [
                        {
                            "partition_index": p,
                            "committed_offset": 10 * p + 1,
                            "committed_leader_epoch": -1,
                            "committed_metadata": f"meta-{p}",
                        }
                        for p in parts
                    ],
                }
                for key, parts in topics
            ],
        },
    )


def fetch_offsets(
    c: RawClient,
    version: int,
    groups: list[tuple[str, list[tuple[str | uuid.UUID, list[int]]] | None]],
) -> Any:
    return c.call(
        OFFSET_FETCH,
        version,
        {
            "groups": [
                {
                    "group_id": group,
                    "member_id": None,
                    "member_epoch": -1,
                    "topics": None
                    if topics is None
                    else [
                        {
                            "name": key if isinstance(key, str) else "",
                            "topic_id": key if isinstance(key, uuid.UUID) else None,
                            "partition_indexes": parts,
                        }
                        for key, parts in topics
                    ],
                }
                for group, topics in groups
            ],
            "require_stable": False,
        },
    )


def test_offsets_by_topic_id(pair: tuple[Backend, Backend]) -> None:
    """OffsetCommit / OffsetFetch v10: topic ids, UNKNOWN_TOPIC_ID, and the answers' order
    (KafkaApis answers unknown ids and partitions itself, then merges the coordinator's)."""
    topic, other = topic_name("offsets-a"), topic_name("offsets-b")
    group, lone = f"{topic}-group", f"{topic}-lone"
    unknown = uuid.uuid4()
    zero = uuid.UUID(int=0)

    def script(b: Backend) -> list[Step]:
        b.create(topic, 2)
        b.create(other, 1)
        for g in (group, lone):
            wait_group_coordinator(b, g)
        steps: list[Step] = []
        with b.client() as c:
            ids = topic_ids(c, topic, other)
            norm = Normaliser({min(b.addresses): "n0"}, ids)
            tid = {name: i for i, name in ids.items()}
            a, o = tid[topic], tid[other]

            def commit(label: str, version: int, g: str, topics: Any) -> None:
                steps.append((label, norm(commit_offsets(c, version, g, topics))))

            def fetch(label: str, version: int, groups: Any) -> None:
                steps.append((label, norm(fetch_offsets(c, version, groups))))

            commit("commit v10: known ids", OFFSETS_BY_ID, group, [(a, [0, 1]), (o, [0])])
            commit(
                "commit v10: unknown id, unknown partition, zero id, an id twice",
                OFFSETS_BY_ID,
                group,
                [(unknown, [0, 2]), (a, [3, 1]), (zero, [0]), (o, [0]), (unknown, [5])],
            )
            commit("commit v10: unknown ids only", OFFSETS_BY_ID, lone, [(unknown, [0])])
            commit("commit v10: no topics", OFFSETS_BY_ID, lone, [])
            commit(
                "commit v9: unknown name, unknown partition, a name twice",
                OFFSETS_BY_NAME,
                lone,
                [(topic, [3, 0]), ("no-such-topic", [0]), (topic, [1])],
            )
            fetch(
                "fetch v10: unknown id, known ids twice, zero id",
                OFFSETS_BY_ID,
                [(group, [(unknown, [0]), (a, [1, 0, 7]), (zero, [0]), (a, [1]), (o, [0])])],
            )
            fetch(
                "fetch v10: all topics, unknown group",
                OFFSETS_BY_ID,
                [(lone, None), (f"{group}-none", [(a, [0])]), (f"{group}-none", None)],
            )
            fetch(
                "fetch v9: by name, all topics",
                OFFSETS_BY_NAME,
                [(lone, [(topic, [1, 0]), ("no-such-topic", [0])]), (lone, None)],
            )
        return steps

    got = assert_same(pair, script)
    mixed = got["commit v10: unknown id, unknown partition, zero id, an id twice"]["topics"]
    assert [p["error_code"] for p in mixed[0]["partitions"]] == ["100 unknown_topic_id"] * 3
    fetched = got["fetch v10: unknown id, known ids twice, zero id"]["groups"][0]["topics"]
    assert fetched[0]["topic_id"] == f"id:{topic}"
    assert [p["committed_offset"] for p in fetched[0]["partitions"]] == [11, 1, -1]
    assert fetched[-1]["partitions"][0]["error_code"] == "100 unknown_topic_id"


INIT_PRODUCER_ID, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 22, 25, 26, 28


def init_transaction(c: RawClient, txn_id: str) -> dict[str, Any]:
    """FindCoordinator and InitProducerId, retried until the coordinator is loaded; the
    producer fields of the transactional requests."""
    while True:
        found = c.call(FIND_COORDINATOR, 4, {"key_type": 1, "coordinator_keys": [txn_id]})
        if found.coordinators[0].error_code == ErrorCode.none:
            break
        time.sleep(0.1)
    while True:
        init = c.call(
            INIT_PRODUCER_ID,
            5,
            {
                "transactional_id": txn_id,
                "transaction_timeout": 60_000,
                "producer_id": -1,
                "producer_epoch": -1,
            },
        )
        if init.error_code == ErrorCode.none:
            return {
                "transactional_id": txn_id,
                "producer_id": init.producer_id,
                "producer_epoch": init.producer_epoch,
            }
        time.sleep(0.1)


def test_txn_offset_commit_answer_order(pair: tuple[Backend, Backend]) -> None:
    """TxnOffsetCommit: KafkaApis answers unknown topics and partitions before the
    coordinator's topics, and does not ask the coordinator when nothing is left."""
    topic = topic_name("txn-offsets")
    group, txn_id = f"{topic}-group", f"{topic}-txn"

    def script(b: Backend) -> list[Step]:
        b.create(topic, 2)
        wait_group_coordinator(b, group)
        steps: list[Step] = []
        with b.client() as c:
            norm = Normaliser({min(b.addresses): "n0"})
            producer = init_transaction(c, txn_id)
            added = c.call(ADD_OFFSETS_TO_TXN, 4, producer | {"group_id": group})
            steps.append(("AddOffsetsToTxn", norm(added)))

            def txn_commit(label: str, topics: list[tuple[str, list[int]]]) -> None:
                r = c.call(
                    TXN_OFFSET_COMMIT,
                    4,
                    producer
                    | {
                        "group_id": group,
                        "generation_id": -1,
                        "member_id": "",
                        "group_instance_id": None,
                        "topics": [
                            {
                                "name": name,
                                "partitions": [
                                    {
                                        "partition_index": p,
                                        "committed_offset": 5,
                                        "committed_leader_epoch": -1,
                                        "committed_metadata": None,
                                    }
                                    for p in parts
                                ],
                            }
                            for name, parts in topics
                        ],
                    },
                )
                steps.append((label, norm(r)))

            txn_commit(
                "unknown partition, unknown topic, a topic twice",
                [(topic, [0, 7]), ("no-such-topic", [0]), (topic, [1])],
            )
            txn_commit("unknown topics only", [("no-such-topic", [0, 1])])
            ended = c.call(END_TXN, 4, producer | {"committed": False})
            steps.append(("EndTxn abort", norm(ended)))
        return steps

    got = assert_same(pair, script)
    mixed = got["unknown partition, unknown topic, a topic twice"]["topics"]
    assert [(t["name"], [p["error_code"] for p in t["partitions"]]) for t in mixed] == [
        (topic, ["3 unknown_topic_or_partition", "0 none", "0 none"]),
        ("no-such-topic", ["3 unknown_topic_or_partition"]),
    ]
    assert got["EndTxn abort"]["error_code"] == "0 none"


def test_offset_fetch_all_topics_order(pair: tuple[Backend, Backend]) -> None:
    """OffsetFetch of all a group's topics answers in the order of the coordinator's
    hash maps (topics by name hash, partitions by number hash, in first-commit order),
    for offsets committed directly and by a committed transaction."""
    prefix = topic_name("offsets-all")
    sizes = {f"{prefix}-{i}": n for i, n in enumerate([1, 8, 3, 5, 2, 7])}
    names = list(sizes)
    group, txn_group, txn_id = f"{prefix}-group", f"{prefix}-txn-group", f"{prefix}-txn"
    # (topic, partitions) in commit order: partitions and topics out of order, some twice.
    commits = [
        [(names[1], [7, 2, 5]), (names[3], [4, 0])],
        [(names[0], [0]), (names[1], [0, 6, 1, 3, 4]), (names[5], [6, 5, 4, 3, 2, 1, 0])],
        [(names[2], [2, 1, 0]), (names[4], [1, 0]), (names[1], [2, 7]), (names[3], [3, 1, 2])],
    ]

    def txn_commit(c: RawClient, producer: dict[str, Any], topics: Any) -> Any:
        return c.call(
            TXN_OFFSET_COMMIT,
            4,
            producer
            | {
                "group_id": txn_group,
                "generation_id": -1,
                "member_id": "",
                "group_instance_id": None,
                "topics": [
                    {
                        "name": name,
                        "partitions": [
                            {
                                "partition_index": p,
                                "committed_offset": 3,
                                "committed_leader_epoch": -1,
                                "committed_metadata": None,
                            }
                            for p in parts
                        ],
                    }
                    for name, parts in topics
                ],
            },
        )

    def order(r: Any) -> list[tuple[str, list[int]]]:
        group_answer = r.groups[0]
        assert group_answer.error_code == ErrorCode.none, group_answer
        return [(t.name, [p.partition_index for p in t.partitions]) for t in group_answer.topics]

    def script(b: Backend) -> list[Step]:
        for name, n in sizes.items():
            b.create(name, n)
        for g in (group, txn_group):
            wait_group_coordinator(b, g)
        steps: list[Step] = []
        with b.client() as c:
            for i, topics in enumerate(commits):
                r = commit_offsets(c, OFFSETS_BY_NAME, group, topics)
                assert all(p.error_code == ErrorCode.none for t in r.topics for p in t.partitions)
                steps.append(
                    (f"all topics after commit {i}", order(fetch_offsets(c, 9, [(group, None)])))
                )
            producer = init_transaction(c, txn_id)
            added = c.call(ADD_OFFSETS_TO_TXN, 4, producer | {"group_id": txn_group})
            assert added.error_code == ErrorCode.none, added
            for topics in commits:
                r = txn_commit(c, producer, topics)
                assert all(p.error_code == ErrorCode.none for t in r.topics for p in t.partitions)
            ended = c.call(END_TXN, 4, producer | {"committed": True})
            assert ended.error_code == ErrorCode.none, ended
            while True:  # until the marker reached the group (Kafka writes it asynchronously)
                stable = c.call(
                    OFFSET_FETCH,
                    OFFSETS_BY_NAME,
                    {
                        "groups": [{"group_id": txn_group, "member_epoch": -1, "topics": None}],
                        "require_stable": True,
                    },
                )
                if stable.groups[0].error_code == ErrorCode.none and stable.groups[0].topics:
                    break
                time.sleep(0.1)
            steps.append(("all topics after a committed transaction", order(stable)))
        return steps

    got = assert_same(pair, script)
    last = got["all topics after commit 2"]
    assert sorted(name for name, _ in last) == sorted(names)
    assert sum(len(parts) for _, parts in last) == sum(sizes.values())


# -- transactions V2 (KIP-890 part 2) ------------------------------------------------------

ADD_PARTITIONS_TO_TXN = 24
READ_COMMITTED = 1
TRANSACTIONAL_MASK = 0x10


def txn_batch(producer: dict[str, Any], sequence: int, count: int = 2) -> bytes:
    """A transactional batch of real records from *producer* (its id and epoch) at *sequence*."""
    plain = bytearray(make_record_batch([BASE_TS + i for i in range(count)]))
    struct.pack_into(">h", plain, 21, TRANSACTIONAL_MASK)
    struct.pack_into(
        ">qhi", plain, 43, producer["producer_id"], producer["producer_epoch"], sequence
    )
    struct.pack_into(">I", plain, 17, crc32c(bytes(plain[21:])))
    return bytes(plain)


def txn_produce(
    c: RawClient,
    version: int,
    producer: dict[str, Any],
    topic: str,
    topic_id: uuid.UUID,
    partition: int,
    sequence: int,
) -> tuple[str, int]:
    """(error, base offset) of one transactional batch, topics by name (< v13) or id."""
    r = c.call(
        PRODUCE,
        version,
        {
            "transactional_id": producer["transactional_id"],
            "acks": -1,
            "timeout": 10_000,
            "topic_data": [
                {
                    "name": topic,
                    "topic_id": topic_id,
                    "partition_data": [
                        {"index": partition, "records": txn_batch(producer, sequence)}
                    ],
                }
            ],
        },
    )
    answer = r.responses[0].partition_responses[0]
    return f"{int(answer.error_code)} {answer.error_code.name}", int(answer.base_offset)


def end_txn_v5(
    c: RawClient, producer: dict[str, Any], commit: bool, epoch: int | None = None
) -> dict[str, Any]:
    """EndTxn v5 with *producer*'s epoch (or *epoch*); the producer id relative to it."""
    fields = producer | {"committed": commit}
    if epoch is not None:
        fields["producer_epoch"] = epoch
    r = c.call(END_TXN, 5, fields)
    pid = int(r.producer_id)
    return {
        "error_code": f"{int(r.error_code)} {r.error_code.name}",
        "producer_id": "same" if pid == producer["producer_id"] else pid,
        "producer_epoch": int(r.producer_epoch),
    }


def settled_end_txn_v5(
    c: RawClient, producer: dict[str, Any], commit: bool, epoch: int
) -> dict[str, Any]:
    """An EndTxn v5 retry with the previous *epoch*, repeated while the coordinator still
    writes the markers (CONCURRENT_TRANSACTIONS; Kafka completes asynchronously, the dev
    cluster at once): the answer once the transaction is complete."""
    while True:
        r = end_txn_v5(c, producer, commit, epoch)
        if r["error_code"] != f"{int(ErrorCode.concurrent_transactions)} concurrent_transactions":
            return r
        time.sleep(0.05)


def committed_view(c: RawClient, topic: str, partitions: int, producer_id: int) -> list[Any]:
    """What a read_committed consumer reads with Fetch v12 from offset 0 to the end, per
    partition: LSO, high watermark, the aborted transactions listed and each batch as
    (base offset, records, control type or None, epoch).

    It fetches again from the next offset as a consumer does: Kafka may answer a part of
    the log (up to an older position of the last stable offset) where the dev cluster
    answers all of it.
    """
    view = []
    for partition in range(partitions):
        batches: list[tuple[int, int, int | None, int]] = []
        aborted: set[tuple[Any, int]] = set()
        offset, end, stable = 0, -1, -1
        for _ in range(20):
            request = fetch_request(FETCH_OLD, [(topic, None, partition, offset, 1 << 20)])
            r = c.call(FETCH, FETCH_OLD, request | {"isolation_level": READ_COMMITTED})
            p = r.responses[0].partitions[0]
            assert p.error_code == ErrorCode.none, p
            end, stable = int(p.high_watermark), int(p.last_stable_offset)
            aborted |= {
                ("same" if a.producer_id == producer_id else a.producer_id, int(a.first_offset))
                for a in p.aborted_transactions or ()
            }
            data = p.records or b""
            pos = 0
            while pos + 61 <= len(data):
                base, size = struct.unpack_from(">qi", data, pos)
                (attributes,) = struct.unpack_from(">h", data, pos + 21)
                (last_delta,) = struct.unpack_from(">i", data, pos + 23)
                (epoch,) = struct.unpack_from(">h", data, pos + 51)
                (count,) = struct.unpack_from(">i", data, pos + 57)
                control = struct.unpack_from(">h", data, pos + 68)[0] if attributes & 0x20 else None
                batches.append((base, count, control, epoch))
                offset = base + last_delta + 1
                pos += 12 + size
            if offset >= stable:
                break
        view.append(
            {
                "high_watermark": end,
                "last_stable_offset": stable,
                "aborted": sorted(aborted, key=str),
                "batches": batches,
            }
        )
    return view


def test_transactions_v2(pair: tuple[Backend, Backend]) -> None:
    """Transactions V2 as Kafka 4.4 finalizes them: ApiVersions' transaction.version,
    partitions added implicitly by Produce v12/v13 and TxnOffsetCommit v5 (not by v11),
    EndTxn v5's epoch bump (returned, on the markers, resetting sequences), retries with
    the previous epoch, empty aborts, old-epoch fencing, and what read_committed sees."""
    topic = topic_name("txn-v2")
    group, txn_id = f"{topic}-group", f"{topic}-txn"

    def script(b: Backend) -> list[Step]:
        b.create(topic, 2)
        wait_group_coordinator(b, group)
        steps: list[Step] = []
        with b.client() as c:
            versions = c.call(
                API_VERSIONS, 4, {"client_software_name": "diff", "client_software_version": "1"}
            )
            features = {
                f.name: (f.min_version_level, f.max_version_level)
                for f in versions.finalized_features
            }
            steps.append(("finalized transaction.version", features.get("transaction.version")))
            (tid,) = topic_ids(c, topic)
            producer = init_transaction(c, txn_id)
            steps.append(("InitProducerId epoch", producer["producer_epoch"]))
            p0 = producer

            def send(label: str, version: int, partition: int, seq: int, who: Any = None) -> None:
                steps.append(
                    (label, txn_produce(c, version, who or p0, topic, tid, partition, seq))
                )

            send("Produce v11, partition not added", 11, 0, 0)
            send("Produce v12, partition not added: added implicitly", 12, 0, 0)
            send("Produce v13 (topic id), partition not added", 13, 1, 0)
            send("Produce v12, next sequence", 12, 0, 2)
            offsets = c.call(
                TXN_OFFSET_COMMIT,
                5,
                p0
                | {
                    "group_id": group,
                    "generation_id": -1,
                    "member_id": "",
                    "group_instance_id": None,
                    "topics": [
                        {
                            "name": topic,
                            "partitions": [
                                {
                                    "partition_index": 0,
                                    "committed_offset": 4,
                                    "committed_leader_epoch": -1,
                                    "committed_metadata": None,
                                }
                            ],
                        }
                    ],
                },
            )
            steps.append(
                (
                    "TxnOffsetCommit v5 without AddOffsetsToTxn",
                    int(offsets.topics[0].partitions[0].error_code),
                )
            )
            steps.append(("EndTxn v5 commit", end_txn_v5(c, p0, True)))
            steps.append(
                ("commit retried with the previous epoch", settled_end_txn_v5(c, p0, True, 0))
            )
            fetched = fetch_offsets(c, 8, [(group, [(topic, [0])])])
            steps.append(
                (
                    "committed offset",
                    int(fetched.groups[0].topics[0].partitions[0].committed_offset),
                )
            )
            p1 = p0 | {"producer_epoch": p0["producer_epoch"] + 1}
            send("epoch 1, the old sequence numbering", 12, 0, 4, p1)
            send("epoch 1, sequence 0", 12, 0, 0, p1)
            send("the old epoch 0 after the bump", 12, 1, 2, p0)
            added = c.call(
                ADD_PARTITIONS_TO_TXN,
                3,
                {
                    "v3_and_below_transactional_id": txn_id,
                    "v3_and_below_producer_id": p0["producer_id"],
                    "v3_and_below_producer_epoch": p0["producer_epoch"],
                    "v3_and_below_topics": [{"name": topic, "partitions": [1]}],
                },
            )
            code = (
                added.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code
            )
            steps.append(("AddPartitionsToTxn v3 with the old epoch", int(code)))
            verify = c.call(
                ADD_PARTITIONS_TO_TXN,
                5,
                {
                    "transactions": [
                        {
                            **p1,
                            "verify_only": True,
                            "topics": [{"name": topic, "partitions": [0]}],
                        }
                    ]
                },
            )
            result = verify.results_by_transaction[0].topic_results[0].results_by_partition[0]
            steps.append(("AddPartitionsToTxn v5 verify-only", int(result.partition_error_code)))
            steps.append(("EndTxn v5 abort", end_txn_v5(c, p1, False)))
            steps.append(("abort retried with epoch 1", settled_end_txn_v5(c, p0, False, 1)))
            p2 = p0 | {"producer_epoch": 2}
            steps.append(("EndTxn v5 abort with nothing ongoing", end_txn_v5(c, p2, False)))
            steps.append(("that abort retried with epoch 2", settled_end_txn_v5(c, p0, False, 2)))
            p3 = p0 | {"producer_epoch": 3}
            steps.append(("EndTxn v5 commit with nothing ongoing", end_txn_v5(c, p3, True)))
            steps.append(("EndTxn v5 two epochs behind", end_txn_v5(c, p0, False, 1)))
            steps.append(("read_committed", committed_view(c, topic, 2, p0["producer_id"])))
        return steps

    got = assert_same(pair, script)
    assert got["finalized transaction.version"] == (2, 2)
    assert got["Produce v11, partition not added"][0] == "120 transaction_abortable"
    assert got["Produce v12, partition not added: added implicitly"] == ("0 none", 0)
    assert got["EndTxn v5 commit"] == {
        "error_code": "0 none",
        "producer_id": "same",
        "producer_epoch": 1,
    }
    assert got["epoch 1, the old sequence numbering"][0] == "45 out_of_order_sequence_number"
    assert got["AddPartitionsToTxn v3 with the old epoch"] == int(ErrorCode.producer_fenced)
    assert got["EndTxn v5 abort with nothing ongoing"]["producer_epoch"] == 3
    assert got["committed offset"] == 4
    committed = got["read_committed"]
    assert (4, 1, 1, 1) in committed[0]["batches"]  # the commit marker carries epoch 1
    assert (7, 1, 0, 2) in committed[0]["batches"]  # the abort marker epoch 2
    assert committed[0]["aborted"] == [("same", 5)]
