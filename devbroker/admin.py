"""Metadata-side APIs: Metadata, DescribeCluster, CreateTopics, FindCoordinator, ListOffsets.

Each handler takes the node and the decoded request and returns the kio
response at the request's version, answering as Apache Kafka's broker does.
Sans-I/O: no trio here.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Container
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode as E

from proxy.protocol import codec
from proxy.protocol.apis import (
    CREATE_TOPICS,
    DESCRIBE_CLUSTER,
    FIND_COORDINATOR,
    LIST_OFFSETS,
    METADATA,
)

from .build import build
from .jvm_order import (
    champ_order,
    java_hash_set_order,
    java_string_hash,
    mutable_hash_map_order,
    topic_partition_hash,
)
from .state import PartitionState

if TYPE_CHECKING:
    from .node import NodeDispatcher, Request

AUTHORIZED_OPERATIONS_OMITTED = -(2**31)
MAX_RECORDS_PER_USER_OP = 10_000  # QuorumController: metadata records one request may create
OFFSETS_TOPIC_PARTITIONS = 50  # Kafka's offsets.topic.num.partitions default
DEFAULT_NUM_PARTITIONS = 1  # Kafka's num.partitions default
MAX_TOPIC_NAME = 249
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")

EARLIEST = -2
LATEST = -1
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5
EARLIEST_PENDING_UPLOAD = -6  # ListOffsets v11 (KIP-1023)


def _response(req: Request, data: dict[str, Any]) -> Any:
    return build(codec.response_schema(req.header.api_key, req.version), data)


# Topic configs (Kafka 4.x TopicConfig/QuotaConfig names) -> the value the dev cluster
# implements (Kafka's default); None: any value is a behaviour the dev cluster lacks.
TOPIC_CONFIGS: dict[str, str | None] = {
    "cleanup.policy": "delete",
    "compression.type": "producer",
    "compression.gzip.level": None,
    "compression.lz4.level": None,
    "compression.zstd.level": None,
    "delete.retention.ms": None,
    "file.delete.delay.ms": None,
    "flush.messages": None,
    "flush.ms": None,
    "follower.replication.throttled.replicas": None,
    "index.interval.bytes": "4096",
    "leader.replication.throttled.replicas": None,
    "local.retention.bytes": None,
    "local.retention.ms": None,
    "max.compaction.lag.ms": None,
    "max.message.bytes": "1048588",
    "message.timestamp.after.max.ms": "3600000",
    "message.timestamp.before.max.ms": "9223372036854775807",
    "message.timestamp.type": "CreateTime",
    "min.cleanable.dirty.ratio": None,
    "min.compaction.lag.ms": None,
    "min.insync.replicas": "1",
    "preallocate": None,
    "remote.log.copy.disable": None,
    "remote.log.delete.on.disable": None,
    "remote.storage.enable": "false",
    "retention.bytes": "-1",
    "retention.ms": "604800000",
    "segment.bytes": None,
    "segment.index.bytes": None,
    "segment.jitter.ms": None,
    "segment.ms": None,
    "unclean.leader.election.enable": "false",
}


def topic_configs_error(configs: Any) -> str | None:
    """Why CreateTopics' *configs* are refused (INVALID_CONFIG), or None.

    Kafka's ControllerConfigurationValidator and LogConfig.validateNames;
    beyond Kafka, a value the dev cluster would not honour is refused too,
    so that no test relies on behaviour the dev cluster does not have.
    """
    nulls = [c.name for c in configs if c.value is None]
    if nulls:
        return f"Null value not supported for topic configs: {','.join(nulls)}"
    for c in configs:
        if c.name not in TOPIC_CONFIGS:
            return f"Unknown topic config name: {c.name}"
    for c in configs:
        implemented = TOPIC_CONFIGS[c.name]
        if c.value != implemented:
            only = f"only {implemented!r}" if implemented is not None else "no value"
            return (
                f"The dev cluster implements {only} for topic config {c.name}"
                f" (Kafka would accept {c.value!r})"
            )
    return None


def _collision_key(name: str) -> str:
    return name.replace(".", "_")  # Topic.unifyCollisionChars


def topic_name_error(name: str) -> str | None:
    """Kafka's Topic.validate: why *name* is not a legal topic name, or None."""
    if not name:
        return "Topic name is illegal, it can't be empty"
    if name in (".", ".."):
        return 'Topic name cannot be "." or ".."'
    if len(name) > MAX_TOPIC_NAME:
        return f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME} characters"
    if not _LEGAL_TOPIC.fullmatch(name):
        return f"Topic name {name!r} is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'"
    return None


def _brokers(node: NodeDispatcher) -> list[dict[str, Any]]:
    out = []
    for n in node.state.live_nodes():
        host, port = node.state.addresses[n]
        out.append({"node_id": n, "broker_id": n, "host": host, "port": port, "rack": None})
    return out


def _controller(node: NodeDispatcher) -> int:
    live = node.state.live_nodes()
    return live[0] if live else -1


def _partition_metadata(node: NodeDispatcher, p: PartitionState) -> dict[str, Any]:
    if p.leader in node.state.stopped_nodes:
        return {
            "error_code": E.leader_not_available,
            "partition_index": p.index,
            "leader_id": -1,
            "leader_epoch": p.leader_epoch,
            "replica_nodes": [p.leader],
            "isr_nodes": [],
            "offline_replicas": [p.leader],
        }
    return {
        "error_code": E.none,
        "partition_index": p.index,
        "leader_id": p.leader,
        "leader_epoch": p.leader_epoch,
        "replica_nodes": [p.leader],
        "isr_nodes": [p.leader],
        "offline_replicas": [],
    }


def _topic_metadata(node: NodeDispatcher, name: str) -> dict[str, Any]:
    t = node.state.topics[name]
    return {
        "error_code": E.none,
        "name": name,
        "topic_id": t.topic_id,
        "is_internal": False,
        "partitions": [_partition_metadata(node, p) for p in t.partitions],
        "topic_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
    }


def _metadata_order(requested: Any, existing: Container[str]) -> list[Any]:
    """The order KafkaApis answers requested topics in.

    Topics asked by id come first (as asked).  Names become a Scala immutable Set
    (Set1..Set4 keep insertion order; from five names on, a HashSet in hash
    order); the topics that exist are answered first in the set's order, then
    the missing ones in the order of a java.util.HashSet copied from that set.
    """
    by_id = [t for t in requested if t.name is None]
    first: dict[str, Any] = {}
    for t in requested:
        if t.name is not None:
            first.setdefault(t.name, t)
    names = list(first)
    if len(names) > 4:
        names = champ_order(names, java_string_hash)
    found = [first[n] for n in names if n in existing]
    # The missing names pass through a java.util.HashSet built from the set.
    missing = java_hash_set_order([n for n in names if n not in existing], java_string_hash)
    return [*by_id, *found, *(first[n] for n in missing)]


def handle_metadata(node: NodeDispatcher, req: Request) -> Any:
    body = req.body
    state = node.state
    requested = body.topics
    if req.version == 0 and not requested:
        requested = None  # v0: an empty list means all topics
    topics: list[dict[str, Any]] = []
    if requested is not None and 10 <= req.version < 12:
        # Kafka: names cannot be null and topic ids are not supported before v12.
        if any(t.name is None or (t.topic_id or uuid.UUID(int=0)).int for t in requested):
            return _response(
                req,
                {
                    "throttle_time": 0,
                    "brokers": [],
                    "cluster_id": None,
                    "controller_id": -1,
                    "topics": [
                        {
                            "error_code": E.invalid_request,
                            "name": t.name if t.name is not None else "",
                            "topic_id": t.topic_id,
                            "partitions": [],
                        }
                        for t in requested
                    ],
                    "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
                    "error_code": E.none,
                },
            )
    if requested is None:
        topics = [_topic_metadata(node, name) for name in state.topics]
    else:
        requested = _metadata_order(requested, state.topics)
        for t in requested:
            name = t.name
            topic_id = getattr(t, "topic_id", None)
            if name is None:
                # v10+: a topic requested by id
                known = state.topics_by_id.get(topic_id) if topic_id is not None else None
                if known is None:
                    topics.append(
                        {
                            "error_code": E.unknown_topic_id,
                            "name": None,
                            "topic_id": topic_id,
                            "partitions": [],
                        }
                    )
                else:
                    topics.append(_topic_metadata(node, known.name))
            elif name in state.topics:
                topics.append(_topic_metadata(node, name))
            else:
                # auto.create.topics.enable=false
                error = (
                    E.invalid_topic_exception
                    if topic_name_error(name)
                    else E.unknown_topic_or_partition
                )
                topics.append(
                    {
                        "error_code": error,
                        "name": name,
                        "topic_id": uuid.UUID(int=0),
                        "partitions": [],
                    }
                )
    return _response(
        req,
        {
            "throttle_time": 0,
            "brokers": _brokers(node),
            "cluster_id": state.cluster_id,
            "controller_id": _controller(node),
            "topics": topics,
            "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
            "error_code": E.none,
        },
    )


def handle_describe_cluster(node: NodeDispatcher, req: Request) -> Any:
    endpoint_type = getattr(req.body, "endpoint_type", 1)
    base: dict[str, Any] = {
        "throttle_time": 0,
        "endpoint_type": endpoint_type,
        "cluster_id": node.state.cluster_id,
        "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
    }
    if endpoint_type != 1:
        # A broker only describes brokers; controllers are described by controllers.
        return _response(
            req,
            base
            | {
                "error_code": E.unsupported_endpoint_type,
                "error_message": "The broker only supports endpoint type BROKERS",
                "controller_id": -1,
                "brokers": [],
            },
        )
    brokers = [b | {"is_fenced": False} for b in _brokers(node)]
    return _response(
        req,
        base
        | {
            "error_code": E.none,
            "error_message": None,
            "controller_id": _controller(node),
            "brokers": brokers,
        },
    )


def handle_create_topics(node: NodeDispatcher, req: Request) -> Any:
    state = node.state
    body = req.body
    names = [t.name for t in body.topics]
    results: list[dict[str, Any]] = []
    accepted: list[tuple[int, str, int]] = []  # (result index, name, partitions)
    records_needed = 0
    for t in body.topics:
        result: dict[str, Any] = {
            "name": t.name,
            "topic_id": uuid.UUID(int=0),
            "error_message": None,
            "num_partitions": -1,
            "replication_factor": -1,
            "configs": None,
        }
        error, message = E.none, None
        num = t.num_partitions
        rf = t.replication_factor
        if names.count(t.name) > 1:
            error, message = (
                E.invalid_request,
                "Create topics request from client contains duplicate topic names",
            )
        elif (why := topic_name_error(t.name)) is not None:
            error, message = E.invalid_topic_exception, why
        elif colliding := [
            n for n in state.topics if n != t.name and _collision_key(n) == _collision_key(t.name)
        ]:
            error, message = (
                E.invalid_topic_exception,
                f"Topic '{t.name}' collides with existing topic: {colliding[0]}",
            )
        elif t.name in state.topics:
            error, message = E.topic_already_exists, f"Topic '{t.name}' already exists."
        elif (why := topic_configs_error(t.configs)) is not None:
            error, message = E.invalid_config, why
        elif t.assignments:
            if num != -1 or rf != -1:
                error, message = (
                    E.invalid_request,
                    "Both numPartitions or replicationFactor and replicasAssignments were set. Both cannot be used at the same time.",
                )
            else:
                error, message = (
                    E.invalid_replica_assignment,
                    "The dev cluster places partitions itself; explicit replica assignments are not supported",
                )
        elif num != -1 and num <= 0:
            error, message = (
                E.invalid_partitions,
                "Number of partitions was set to an invalid non-positive value.",
            )
        elif rf != -1 and rf <= 0:
            error, message = (
                E.invalid_replication_factor,
                "Replication factor must be larger than 0, or -1 to use the default value.",
            )
        elif rf > len(state.live_nodes()):
            error, message = (
                E.invalid_replication_factor,
                f"Unable to replicate the partition {rf} time(s): The target replication factor of {rf} cannot be reached because only {len(state.live_nodes())} broker(s) are registered.",
            )
        elif rf > 1:
            error, message = (
                E.invalid_replication_factor,
                "The dev cluster keeps a single replica per partition (replication factor 1)",
            )
        if error:
            results.append(result | {"error_code": error, "error_message": message})
            continue
        partitions = DEFAULT_NUM_PARTITIONS if num == -1 else num
        records_needed += 1 + partitions + len(t.configs)
        accepted.append((len(results), t.name, partitions))
        results.append(result)
    if records_needed > MAX_RECORDS_PER_USER_OP:
        # The controller refuses the whole operation (BoundedListTooLongException).
        refused = {
            "error_code": E.policy_violation,
            "error_message": "Unable to perform excessively large batch operation.",
        }
        results = [r | refused for r in results]
        return _response(req, {"throttle_time": 0, "topics": results})
    for i, name, partitions in accepted:
        created: dict[str, Any] = {
            "error_code": E.none,
            "num_partitions": partitions,
            "replication_factor": 1,
        }
        if not body.validate_only:
            topic = state.create_topic(name, partitions)
            node.changed = True
            created["topic_id"] = topic.topic_id
        results[i] = results[i] | created | {"configs": []}
    return _response(req, {"throttle_time": 0, "topics": results})


def partition_for(key: str, partitions: int = OFFSETS_TOPIC_PARTITIONS) -> int:
    """Kafka's partitionFor: Utils.abs(key.hashCode) % partitions."""
    return (java_string_hash(key) & 0x7FFFFFFF) % partitions


def coordinator_node(state_node_ids: list[int], key: str) -> int:
    """The node leading the __consumer_offsets (or __transaction_state) partition of *key*.

    Both internal topics have 50 partitions by default, spread over the nodes alike.
    """
    return state_node_ids[partition_for(key) % len(state_node_ids)]


def _find_one(node: NodeDispatcher, key: str, key_type: int) -> dict[str, Any]:
    none = {"node_id": -1, "host": "", "port": -1}
    if key_type in (0, 1):
        target = coordinator_node(node.state.node_ids, key)
        if target in node.state.live_nodes():
            host, port = node.state.addresses[target]
            return {
                "error_code": E.none,
                "error_message": None,
                "node_id": target,
                "host": host,
                "port": port,
            }
        return none | {"error_code": E.coordinator_not_available, "error_message": None}
    if key_type == 2:
        # KafkaApis.getCoordinator: INVALID_REQUEST below v6 and without a share coordinator.
        return none | {
            "error_code": E.invalid_request,
            "error_message": "The dev cluster has no share coordinator",
        }
    return none | {"error_code": E.invalid_request, "error_message": f"Unknown key type {key_type}"}


def handle_find_coordinator(node: NodeDispatcher, req: Request) -> Any:
    body = req.body
    key_type = getattr(body, "key_type", 0)
    if req.version >= 4:
        coordinators = [{"key": k} | _find_one(node, k, key_type) for k in body.coordinator_keys]
        return _response(req, {"throttle_time": 0, "coordinators": coordinators})
    return _response(req, {"throttle_time": 0} | _find_one(node, body.key, key_type))


def _list_one(node: NodeDispatcher, req: Request, topic: str, p: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "partition_index": p.partition_index,
        "timestamp": -1,
        "offset": -1,
        "leader_epoch": -1,
    }
    part = node.state.partition(topic, p.partition_index)
    if part is None:
        return out | {"error_code": E.unknown_topic_or_partition}
    if part.leader != node.node_id:
        return out | {"error_code": E.not_leader_or_follower}
    current = getattr(p, "current_leader_epoch", -1)
    if current != -1 and current < part.leader_epoch:
        return out | {"error_code": E.fenced_leader_epoch}
    if current != -1 and current > part.leader_epoch:
        return out | {"error_code": E.unknown_leader_epoch}
    log = part.log
    ts = p.timestamp
    # Partition.fetchOffsetForTimestamp: isolation applies to clients (replica id -1) only;
    # others read up to the log end offset.
    if req.body.replica_id != -1:
        last_fetchable = log.log_end_offset
    elif getattr(req.body, "isolation_level", 0) == 1:
        last_fetchable = log.last_stable_offset
    else:
        last_fetchable = log.high_watermark
    found: tuple[int, int] | None
    if ts == LATEST:
        found = (last_fetchable, -1)
    elif ts in (EARLIEST, EARLIEST_LOCAL):
        found = (log.log_start_offset, -1)
    elif ts in (LATEST_TIERED, EARLIEST_PENDING_UPLOAD):
        found = (-1, -1)  # no tiered storage: nothing uploaded, nothing pending
    else:
        found = log.max_timestamp() if ts == MAX_TIMESTAMP else log.offset_for_timestamp(ts)
        if found is not None and found[0] >= last_fetchable:
            found = None  # ReplicaManager.fetchOffset: not fetchable yet, nothing found
    if found is None:
        return out | {"error_code": E.none}
    offset, timestamp = found
    epoch = part.leader_epoch if offset >= 0 else -1
    return out | {
        "error_code": E.none,
        "offset": offset,
        "timestamp": timestamp,
        "leader_epoch": epoch,
    }


def handle_list_offsets(node: NodeDispatcher, req: Request) -> Any:
    if req.body.topics and getattr(req.body, "isolation_level", 0) not in (0, 1):
        # ListOffsetsRequest.isolationLevel() throws before any partition is looked at:
        # the error response lists every partition as asked.
        failed = [
            {
                "name": t.name,
                "partitions": [
                    {
                        "partition_index": p.partition_index,
                        "error_code": E.unknown_server_error,
                        "timestamp": -1,
                        "offset": -1,
                        "leader_epoch": -1,
                    }
                    for p in t.partitions
                ],
            }
            for t in req.body.topics
        ]
        return _response(req, {"throttle_time": 0, "topics": failed})
    seen: dict[tuple[str, int], int] = {}
    for t in req.body.topics:
        for p in t.partitions:
            key = (t.name, p.partition_index)
            seen[key] = seen.get(key, 0) + 1
    answers: dict[str, dict[int, dict[str, Any]]] = {}
    for t in req.body.topics:
        parts = answers.setdefault(t.name, {})
        for p in t.partitions:
            if p.partition_index in parts:
                continue  # Kafka answers per partition, once
            if seen[(t.name, p.partition_index)] > 1:
                # ReplicaManager.fetchOffset: a partition asked twice is refused.
                parts[p.partition_index] = {
                    "partition_index": p.partition_index,
                    "error_code": E.invalid_request,
                    "timestamp": -1,
                    "offset": -1,
                    "leader_epoch": -1,
                }
            else:
                parts[p.partition_index] = _list_one(node, req, t.name, p)
    # ReplicaManager.fetchOffset collects the answers in a mutable.HashMap keyed by
    # topic-partition, groups them by topic (an immutable.HashMap) and writes both
    # in iteration order: the response order is hash order, not request order.
    topics = [
        {"name": name, "partitions": _in_hash_order(name, answers[name])}
        for name in champ_order(answers, java_string_hash)
        if answers[name]
    ]
    return _response(req, {"throttle_time": 0, "topics": topics})


def _in_hash_order(topic: str, parts: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    def tp_hash(index: int) -> int:
        return topic_partition_hash(topic, index)

    return [parts[index] for index in mutable_hash_map_order(parts, tp_hash)]


HANDLERS: dict[int, Callable[[NodeDispatcher, Request], Any]] = {
    METADATA: handle_metadata,
    DESCRIBE_CLUSTER: handle_describe_cluster,
    CREATE_TOPICS: handle_create_topics,
    FIND_COORDINATOR: handle_find_coordinator,
    LIST_OFFSETS: handle_list_offsets,
}
